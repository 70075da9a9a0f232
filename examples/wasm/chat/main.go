//go:build wasip1

// Command chat is a chat room per object.
//
// Methods:
//   - post {"author": "...", "text": "..."}: stores the message and publishes
//     it on topic "messages"; replies with its sequence number in the room.
//   - history {"limit": N}: the most recent messages, oldest first (default 50).
//   - set_key {"key": "..."}: protects the room; from then on a follower must
//     present the key (as its follow params) to be admitted.
//   - share {"tenant": "..."}: on a node with tenancy, lets that tenant's
//     connections and objects follow the room; other tenants are refused.
package main

import (
	"crypto/subtle"
	"errors"
	"fmt"

	sdk "github.com/durable-host/host/sdk/go"
)

type message struct {
	Author string `json:"author"`
	Text   string `json:"text"`
	Time   int64  `json:"time"`
}

const maxText = 4096

func init() {
	sdk.JSONMethod("post", func(m message) (map[string]int64, error) {
		if m.Text == "" {
			return nil, errors.New(`post needs {"text": "..."}`)
		}
		if len(m.Text) > maxText {
			return nil, fmt.Errorf("text is %d bytes, at most %d", len(m.Text), maxText)
		}
		if m.Author == "" {
			m.Author = "anonymous"
		}
		m.Time = sdk.Now()
		n := sdk.GetInt("count") + 1
		sdk.PutInt("count", n)
		if err := sdk.PutJSON(fmt.Sprintf("msg/%016d", n), m); err != nil {
			return nil, err
		}
		if err := sdk.PublishJSON("messages", m); err != nil {
			return nil, err
		}
		return map[string]int64{"n": n}, nil
	})
	sdk.JSONMethod("history", func(in struct {
		Limit int `json:"limit"`
	}) ([]message, error) {
		if in.Limit <= 0 {
			in.Limit = 50
		}
		in.Limit = min(in.Limit, 1000)
		n := sdk.GetInt("count")
		out := []message{}
		for i := n - int64(in.Limit) + 1; i <= n; i++ {
			if i < 1 {
				continue
			}
			var m message
			if ok, err := sdk.GetJSON(fmt.Sprintf("msg/%016d", i), &m); err == nil && ok {
				out = append(out, m)
			}
		}
		return out, nil
	})
	sdk.JSONMethod("set_key", func(in struct {
		Key string `json:"key"`
	}) (bool, error) {
		sdk.Put("key", []byte(in.Key))
		return true, nil
	})
	sdk.JSONMethod("share", func(in struct {
		Tenant string `json:"tenant"`
	}) (bool, error) {
		if in.Tenant == "" {
			return false, errors.New("share needs a tenant")
		}
		sdk.Put("share/"+in.Tenant, []byte{1})
		return true, nil
	})
	sdk.OnFollow(func(r sdk.FollowRequest) error {
		// With tenancy, self is TENANT.chat/ID: followers of another tenant
		// need the room shared with theirs.
		if own := tenantOf(sdk.Self()); r.Tenant != own {
			if _, ok := sdk.Get("share/" + r.Tenant); !ok {
				return sdk.Refuse("this room is not shared with tenant " + r.Tenant)
			}
		}
		key, ok := sdk.Get("key")
		if !ok || len(key) == 0 {
			return nil
		}
		if subtle.ConstantTimeCompare(key, r.Params) != 1 {
			return sdk.Refuse("this room needs its key")
		}
		return nil
	})
}

// tenantOf is the tenant of "TENANT.PROGRAM/ID", "" without one.
func tenantOf(self string) string {
	for i := 0; i < len(self) && self[i] != '/'; i++ {
		if self[i] == '.' {
			return self[:i]
		}
	}
	return ""
}

func main() {}
