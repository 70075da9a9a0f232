package api

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/host/internal/names"
	"github.com/durable-host/host/host/internal/tenancy"
	"github.com/durable-host/host/store"
)

// ObjectsQuery selects objects to list: GET /v1/objects.
type ObjectsQuery struct {
	// Program, when set, is the one program (qualified) listed.
	Program string `json:"program,omitempty"`
	// Tenant and All scope a listing of every program: All (the operator)
	// lists every tenant's objects, else only Tenant's.
	Tenant string `json:"tenant,omitempty"`
	All    bool   `json:"all,omitempty"`
	// After is the last object of the previous page (PROGRAM/ID,
	// qualified), exclusive; Limit caps the page.
	After string `json:"after,omitempty"`
	Limit int    `json:"limit,omitempty"`
}

// ObjectPage is one page of a listing, in name order.
type ObjectPage struct {
	Objects []ObjectInfo `json:"objects"`
	// Next, when set, is the after of the next page.
	Next string `json:"next,omitempty"`
	// Unreachable lists the nodes that did not answer: their objects are
	// missing from the page.
	Unreachable []string `json:"unreachable,omitempty"`
}

// ObjectInfo is one object of a listing.
type ObjectInfo struct {
	Object string `json:"object"`
	// Home is the node whose file is the object's.
	Home string `json:"home"`
	// Bytes is the size of its file there (with its write-ahead log).
	Bytes int64 `json:"bytes"`
	// Modified is when its file last changed: its last commit, about.
	Modified time.Time `json:"modified"`
	// Active: its file and instance are open on its home; LastUsed is
	// then its last call.
	Active   bool       `json:"active"`
	LastUsed *time.Time `json:"last_used,omitempty"`
	// Version is the version of its program it runs, while active (0
	// before its first call since it became active).
	Version int `json:"version,omitempty"`
}

// StateQuery selects an object's state pairs: GET
// /v1/objects/{program}/{id}/state.
type StateQuery struct {
	Object string `json:"object"`
	Prefix string `json:"prefix,omitempty"`
	// After is the last key of the previous page, exclusive.
	After []byte `json:"after,omitempty"`
	Limit int    `json:"limit,omitempty"`
}

// StatePage is one page of an object's state, in key order, and its
// pending alarm.
type StatePage struct {
	Object string       `json:"object"`
	Home   string       `json:"home"`
	Pairs  []Pair       `json:"pairs"`
	Alarm  *store.Alarm `json:"alarm,omitempty"`
	// Next, when set, is the after of the next page (the last key,
	// base64).
	Next []byte `json:"next,omitempty"`
}

// Pair is one key and its value. A key that is not UTF-8 text is in
// KeyBase64; a value is in Value when it is JSON, else in Text when it is
// text, else in Base64 (none of them: an empty value).
type Pair struct {
	Key       string `json:"key"`
	KeyBase64 string `json:"key_base64,omitempty"`
	Bytes
}

// Bytes shows a value or a payload as JSON, text or base64.
type Bytes struct {
	Value  json.RawMessage `json:"value,omitempty"`
	Text   string          `json:"text,omitempty"`
	Base64 string          `json:"base64,omitempty"`
}

// BytesOf shows b.
func BytesOf(b []byte) Bytes {
	switch {
	case len(b) == 0:
		return Bytes{}
	case json.Valid(b):
		return Bytes{Value: json.RawMessage(b)}
	case utf8.Valid(b):
		return Bytes{Text: string(b)}
	}
	return Bytes{Base64: base64.StdEncoding.EncodeToString(b)}
}

// PairOf shows p.
func PairOf(p abi.Pair) Pair {
	out := Pair{Bytes: BytesOf(p.Value)}
	if utf8.Valid(p.Key) {
		out.Key = string(p.Key)
	} else {
		out.KeyBase64 = base64.StdEncoding.EncodeToString(p.Key)
	}
	return out
}

// LogQuery selects an object's events: GET /v1/objects/{program}/{id}/log.
type LogQuery struct {
	Object string `json:"object"`
	After  uint64 `json:"after,omitempty"`
	Limit  int    `json:"limit,omitempty"`
	Topic  string `json:"topic,omitempty"`
}

// LogPage is one page of an object's events, ascending.
type LogPage struct {
	Object string     `json:"object"`
	Home   string     `json:"home"`
	Head   uint64     `json:"head"` // the last seq of the log
	Events []LogEvent `json:"events"`
	// Next, when set, is the after of the next page.
	Next uint64 `json:"next,omitempty"`
}

// LogEvent is one event of a log.
type LogEvent struct {
	Seq   uint64    `json:"seq"`
	Topic string    `json:"topic"`
	Time  time.Time `json:"time"`
	Bytes
}

// LogEventOf shows e.
func LogEventOf(e *abi.Event) LogEvent {
	return LogEvent{Seq: e.Seq, Topic: e.Topic, Time: time.Unix(0, e.Time).UTC(), Bytes: BytesOf(e.Payload)}
}

// pageLimit reads the limit query parameter (0 when absent: the default).
func pageLimit(r *http.Request) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%w: limit must be a positive number, not %q", abi.ErrBadRequest, v)
	}
	return n, nil
}

func (s *server) handleListObjects(w http.ResponseWriter, r *http.Request, p tenancy.Principal) {
	q := ObjectsQuery{Tenant: p.Tenant, All: p.Operator}
	var err error
	if q.Limit, err = pageLimit(r); err != nil {
		s.failAs(w, p, err)
		return
	}
	if prog := r.URL.Query().Get("program"); prog != "" {
		if q.Program, err = names.ResolveProgram(p, prog); err != nil {
			s.failAs(w, p, err)
			return
		}
	}
	if after := r.URL.Query().Get("after"); after != "" {
		prog, id, ok := strings.Cut(after, "/")
		o, err := names.ResolveObject(p, prog, id)
		if !ok || err != nil {
			s.failAs(w, p, fmt.Errorf("%w: after must be the next of a previous page (PROGRAM/ID), not %q", abi.ErrBadRequest, after))
			return
		}
		q.After = o.Program + "/" + o.ID
	}
	page, err := s.b.ListObjects(r.Context(), q)
	if err != nil {
		s.failAs(w, p, err)
		return
	}
	for i := range page.Objects {
		page.Objects[i].Object = showObject(p, page.Objects[i].Object)
	}
	if page.Next != "" {
		page.Next = showObject(p, page.Next)
	}
	writeJSON(w, http.StatusOK, page)
}

// showObject is how p sees the qualified PROGRAM/ID s.
func showObject(p tenancy.Principal, s string) string {
	prog, id, _ := strings.Cut(s, "/")
	return p.Show(prog) + "/" + id
}

func (s *server) handleState(w http.ResponseWriter, r *http.Request, p tenancy.Principal, id names.Object) {
	q := StateQuery{Prefix: r.URL.Query().Get("prefix")}
	var err error
	if q.Limit, err = pageLimit(r); err != nil {
		s.failAs(w, p, err)
		return
	}
	if after := r.URL.Query().Get("after"); after != "" {
		if q.After, err = decodeKey(after); err != nil {
			s.failAs(w, p, err)
			return
		}
	}
	page, err := s.b.State(r.Context(), id, q)
	if err != nil {
		s.failAs(w, p, err)
		return
	}
	page.Object = names.Show(p, id)
	writeJSON(w, http.StatusOK, page)
}

// decodeKey reads a state page's next (base64, standard or URL-safe,
// padded or not).
func decodeKey(s string) ([]byte, error) {
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			return b, nil
		}
	}
	return nil, fmt.Errorf("%w: after must be the next of a previous page (base64), not %q", abi.ErrBadRequest, s)
}

func (s *server) handleLog(w http.ResponseWriter, r *http.Request, p tenancy.Principal, id names.Object) {
	q := LogQuery{Topic: r.URL.Query().Get("topic")}
	var err error
	if q.Limit, err = pageLimit(r); err != nil {
		s.failAs(w, p, err)
		return
	}
	if after := r.URL.Query().Get("after"); after != "" {
		if q.After, err = strconv.ParseUint(after, 10, 64); err != nil {
			s.failAs(w, p, fmt.Errorf("%w: after must be a seq, not %q", abi.ErrBadRequest, after))
			return
		}
	}
	page, err := s.b.Log(r.Context(), id, q)
	if err != nil {
		s.failAs(w, p, err)
		return
	}
	page.Object = names.Show(p, id)
	writeJSON(w, http.StatusOK, page)
}
