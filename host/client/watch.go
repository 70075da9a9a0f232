package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/coder/websocket"
)

// WatchOptions configure Client.Watch.
type WatchOptions struct {
	Topic  string // "" follows every topic
	Filter string
	Params string // presented to the publisher's follow hook
	// Via attaches the connection to this object ("program/id") instead of
	// the publisher: its program's event export then shapes the frames.
	Via string
}

// Watch opens a WebSocket connection, follows object's topic, and calls
// onFrame with every frame the node sends after the follow is approved
// (events, and notices such as "behind"). It returns when ctx ends, the
// socket closes, or onFrame returns false.
func (c *Client) Watch(ctx context.Context, object string, opt WatchOptions, onFrame func([]byte) bool) error {
	pub, err := parseObject(object)
	if err != nil {
		return err
	}
	via := pub
	if opt.Via == "" && strings.Contains(pub.program, ".") {
		return fmt.Errorf("%w: %s is another tenant's object: attach the connection to one of yours with --via PROGRAM/ID", errBadRequest, object)
	}
	if opt.Via != "" {
		if via, err = parseObject(opt.Via); err != nil {
			return err
		}
	}
	u, err := url.Parse(strings.TrimRight(c.Base, "/"))
	if err != nil {
		return err
	}
	u.Scheme = strings.Replace(u.Scheme, "http", "ws", 1)
	u.Path += via.path() + "/connect"
	h := http.Header{}
	if c.Token != "" {
		h.Set("Authorization", "Bearer "+c.Token)
	}
	ws, resp, err := websocket.Dial(ctx, u.String(), &websocket.DialOptions{HTTPHeader: h, HTTPClient: c.HTTP})
	if err != nil {
		if resp != nil && resp.StatusCode >= 400 {
			msg := resp.Status
			if resp.Body != nil {
				var e struct {
					Error string `json:"error"`
				}
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
				if json.Unmarshal(b, &e) == nil && e.Error != "" {
					msg = e.Error
				}
			}
			return &APIError{Status: resp.StatusCode, Message: "connect refused: " + msg}
		}
		return fmt.Errorf("connect to %s: %w", u.Redacted(), err)
	}
	defer ws.CloseNow()
	ws.SetReadLimit(64 << 20)
	req, _ := json.Marshal(map[string]string{"type": "follow", "object": pub.String(), "topic": opt.Topic, "filter": opt.Filter, "params": opt.Params})
	if err := ws.Write(ctx, websocket.MessageText, req); err != nil {
		return err
	}
	followed := false
	for {
		_, data, err := ws.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("connection closed: %w", err)
		}
		if !followed {
			var f struct {
				Type  string `json:"type"`
				Error string `json:"error"`
			}
			_ = json.Unmarshal(data, &f)
			switch f.Type {
			case "hello":
				continue
			case "followed":
				followed = true
				continue
			case "error":
				return fmt.Errorf("follow %s: %s", pub, f.Error)
			}
		}
		if !onFrame(data) {
			ws.Close(websocket.StatusNormalClosure, "")
			return nil
		}
	}
}
