// Package client is the Go client of a node's HTTP API: upload programs,
// call objects' methods, follow an object over a WebSocket connection
// (Watch) or read its stream of server-sent events (Subscribe), and the
// inspection and operator routes the CLI uses.
//
// It imports no server code, so a program that only talks to nodes (the
// CLI's client commands, the benchmark driver) does not link NATS, wazero
// or SQLite. The node imports it for the wire types they share (Program).
// Object names are checked here by the node's rules, with the node's
// messages, so a bad name fails before any request is sent.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client talks to a node's HTTP API.
type Client struct {
	// Base is the node's URL, e.g. http://127.0.0.1:7070.
	Base string
	// Token is sent as a bearer token when set.
	Token string
	// HTTP is the client to use; nil means http.DefaultClient.
	HTTP *http.Client
}

// APIError is an error reply from the API.
type APIError struct {
	// Status is the reply's HTTP status.
	Status int
	// Message is the node's {"error": ...} text, else the reply's body.
	Message string
}

func (e *APIError) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status) }

// Program is one version of an uploaded program, as the node reports it.
type Program struct {
	Name     string    `json:"name"`
	Version  int       `json:"version"`
	Digest   string    `json:"digest"`
	Size     int       `json:"size"`
	Exports  []string  `json:"exports"`
	Handlers []string  `json:"handlers"`
	Created  time.Time `json:"created"`
	// RollbackOf is the earlier version whose module this one runs again
	// (host programs rollback); 0 for an upload.
	RollbackOf int `json:"rollback_of,omitempty"`
}

// send sends one request with the client's token.
func (c *Client) send(ctx context.Context, method, path string, body []byte, hdr http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.Base, "/")+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the node at %s: %w (is `host serve` running? set --server)", c.Base, err)
	}
	return resp, nil
}

func (c *Client) do(ctx context.Context, method, path string, body []byte) ([]byte, http.Header, error) {
	return c.doWith(ctx, method, path, body, nil)
}

// doWith is do with request headers hdr.
func (c *Client) doWith(ctx context.Context, method, path string, body []byte, hdr http.Header) ([]byte, http.Header, error) {
	resp, err := c.send(ctx, method, path, body, hdr)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode >= 400 {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(out, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(out))
		}
		return nil, nil, &APIError{Status: resp.StatusCode, Message: e.Error}
	}
	return out, resp.Header, nil
}

// Upload stores wasm as the next version of program name.
func (c *Client) Upload(ctx context.Context, name string, wasm []byte) (Program, error) {
	var p Program
	out, _, err := c.do(ctx, http.MethodPut, "/v1/programs/"+url.PathEscape(name), wasm)
	if err != nil {
		return p, err
	}
	return p, json.Unmarshal(out, &p)
}

// Rollback makes version to of the program name current again (0: the
// version before the newest), as a new version, which it returns.
func (c *Client) Rollback(ctx context.Context, name string, to int) (Program, error) {
	var p Program
	body := []byte(`{}`)
	if to != 0 {
		body = []byte(fmt.Sprintf(`{"to":%d}`, to))
	}
	out, _, err := c.do(ctx, http.MethodPost, "/v1/programs/"+url.PathEscape(name)+"/rollback", body)
	if err != nil {
		return p, err
	}
	return p, json.Unmarshal(out, &p)
}

// Call calls method on object ("program/id") and returns the reply.
func (c *Client) Call(ctx context.Context, object, method string, payload []byte) ([]byte, error) {
	id, err := parseObject(object)
	if err != nil {
		return nil, err
	}
	out, _, err := c.do(ctx, http.MethodPost, id.path()+"/"+url.PathEscape(method), payload)
	return out, err
}

// CallAt is Call, and also says which node ran the call: the object's
// home when it ran (the reply's Host-Served-By header; "" from a node
// that does not send it).
func (c *Client) CallAt(ctx context.Context, object, method string, payload []byte) (reply []byte, node string, err error) {
	id, err := parseObject(object)
	if err != nil {
		return nil, "", err
	}
	out, hdr, err := c.do(ctx, http.MethodPost, id.path()+"/"+url.PathEscape(method), payload)
	if err != nil {
		return nil, "", err
	}
	return out, hdr.Get("Host-Served-By"), nil
}

// CallWithKey is Call once in effect per idempotency key (sent as the
// Idempotency-Key header): a repeat within the node's record age gets
// the first call's reply without the method running again; the same key
// with another method or payload is refused with 422. Use it to retry a
// call whose reply was lost.
func (c *Client) CallWithKey(ctx context.Context, object, method string, payload []byte, key string) ([]byte, error) {
	id, err := parseObject(object)
	if err != nil {
		return nil, err
	}
	var hdr http.Header
	if key != "" {
		hdr = http.Header{"Idempotency-Key": {key}}
	}
	out, _, err := c.doWith(ctx, http.MethodPost, id.path()+"/"+url.PathEscape(method), payload, hdr)
	return out, err
}

// Do sends method to path with body and returns the reply's body; an
// error reply is an *APIError.
func (c *Client) Do(ctx context.Context, method, path string, body io.Reader) ([]byte, error) {
	var b []byte
	if body != nil {
		var err error
		if b, err = io.ReadAll(body); err != nil {
			return nil, err
		}
	}
	out, _, err := c.do(ctx, method, path, b)
	return out, err
}

// Get fetches a JSON document from path into v.
func (c *Client) Get(ctx context.Context, path string, v any) error {
	out, _, err := c.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	return json.Unmarshal(out, v)
}

// Delete sends DELETE to path and decodes the JSON reply into v.
func (c *Client) Delete(ctx context.Context, path string, v any) error {
	out, _, err := c.do(ctx, http.MethodDelete, path, nil)
	if err != nil {
		return err
	}
	return json.Unmarshal(out, v)
}

// The methods below decode the node's JSON reply into v, as Get does: a
// *json.RawMessage keeps the document as the node sent it.

// Programs lists the latest version of every program, or, when name is
// set, every version of that one: GET /v1/programs[/NAME].
func (c *Client) Programs(ctx context.Context, name string, v any) error {
	path := "/v1/programs"
	if name != "" {
		path += "/" + url.PathEscape(name)
	}
	return c.Get(ctx, path, v)
}

// Edges lists object's edges, its approved followers with their nodes,
// topics and cursors: GET /v1/objects/PROGRAM/ID/edges.
func (c *Client) Edges(ctx context.Context, object string, v any) error {
	id, err := parseObject(object)
	if err != nil {
		return err
	}
	return c.Get(ctx, id.path()+"/edges", v)
}

// Replicas decodes into v where object's file and its copies are and how
// far each is along its change stream: GET /v1/objects/PROGRAM/ID/replicas.
func (c *Client) Replicas(ctx context.Context, object string, v any) error {
	id, err := parseObject(object)
	if err != nil {
		return err
	}
	return c.Get(ctx, id.path()+"/replicas", v)
}

// Unfollow removes one of object's edges by the id Edges shows:
// DELETE /v1/objects/PROGRAM/ID/edges/EDGE.
func (c *Client) Unfollow(ctx context.Context, object, edge string, v any) error {
	id, err := parseObject(object)
	if err != nil {
		return err
	}
	return c.Delete(ctx, id.path()+"/edges/"+url.PathEscape(edge), v)
}

// Cluster lists the cluster's live nodes: GET /v1/cluster.
func (c *Client) Cluster(ctx context.Context, v any) error {
	return c.Get(ctx, "/v1/cluster", v)
}

// Whoami reports the token's tenant, its limits and its use on the node:
// GET /v1/whoami.
func (c *Client) Whoami(ctx context.Context, v any) error {
	return c.Get(ctx, "/v1/whoami", v)
}

// SubscribeOptions shape a stream subscription.
type SubscribeOptions struct {
	// Topic limits the stream to one topic ("" for all).
	Topic string
	// Filter keeps events whose JSON payload matches FIELD=VALUE[&...].
	Filter string
	// After is the consumer's checkpoint (exclusive); nil asks for the
	// latest stored matching event, then newer ones.
	After *uint64
}

// Subscribe reads the object's stream and calls f with each event's data
// (the forward envelope) until f returns false, ctx ends, or the stream
// ends; a stream that ends on an error returns it.
func (c *Client) Subscribe(ctx context.Context, object string, o SubscribeOptions, f func(data []byte) bool) error {
	id, err := parseObject(object)
	if err != nil {
		return err
	}
	q := url.Values{}
	if o.Topic != "" {
		q.Set("topic", o.Topic)
	}
	if o.Filter != "" {
		q.Set("filter", o.Filter)
	}
	if o.After != nil {
		q.Set("after", strconv.FormatUint(*o.After, 10))
	}
	resp, err := c.send(ctx, http.MethodGet, id.path()+"/stream?"+q.Encode(), nil, nil)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		out, _ := io.ReadAll(resp.Body)
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(out, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(out))
		}
		return &APIError{Status: resp.StatusCode, Message: e.Error}
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	var event string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			data := []byte(line[len("data: "):])
			if event == "error" {
				var e struct {
					Error string `json:"error"`
				}
				json.Unmarshal(data, &e)
				return fmt.Errorf("stream ended: %s", e.Error)
			}
			if !f(data) {
				return nil
			}
		case line == "":
			event = ""
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return sc.Err()
}

// Page asks for one page of a listing: the next of the page before
// (empty: the first) and a size (0: the node's default, 100).
type Page struct {
	After string
	Limit int
}

func (p Page) values() url.Values {
	q := url.Values{}
	if p.After != "" {
		q.Set("after", p.After)
	}
	if p.Limit > 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	return q
}

func withQuery(path string, q url.Values) string {
	if len(q) == 0 {
		return path
	}
	return path + "?" + q.Encode()
}

// Objects lists a page of the objects of program (every program of the
// caller's when empty), cluster-wide, in name order: GET
// /v1/objects?program=.
func (c *Client) Objects(ctx context.Context, program string, p Page, v any) error {
	q := p.values()
	if program != "" {
		q.Set("program", program)
	}
	return c.Get(ctx, withQuery("/v1/objects", q), v)
}

// State reads a page of object's state pairs whose keys start with
// prefix, and its pending alarm: GET /v1/objects/PROGRAM/ID/state.
func (c *Client) State(ctx context.Context, object, prefix string, p Page, v any) error {
	id, err := parseObject(object)
	if err != nil {
		return err
	}
	q := p.values()
	if prefix != "" {
		q.Set("prefix", prefix)
	}
	return c.Get(ctx, withQuery(id.path()+"/state", q), v)
}

// Log reads a page of object's events (on topic, when set) after the seq
// p.After: GET /v1/objects/PROGRAM/ID/log.
func (c *Client) Log(ctx context.Context, object, topic string, p Page, v any) error {
	id, err := parseObject(object)
	if err != nil {
		return err
	}
	q := p.values()
	if topic != "" {
		q.Set("topic", topic)
	}
	return c.Get(ctx, withQuery(id.path()+"/log", q), v)
}
