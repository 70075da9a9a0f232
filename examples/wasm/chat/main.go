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
//   - remind {"in_ms": N, "text": "..."}: in N milliseconds the room posts
//     the text as a message by "reminder". A room keeps its pending
//     reminders in state and its one alarm at the earliest of them.
package main

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

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
		n, err := post(m)
		if err != nil {
			return nil, err
		}
		return map[string]int64{"n": n}, nil
	})
	sdk.JSONMethod("remind", func(in struct {
		InMs int64  `json:"in_ms"`
		Text string `json:"text"`
	}) (map[string]int64, error) {
		if in.Text == "" || len(in.Text) > maxText {
			return nil, fmt.Errorf(`remind needs {"in_ms": N, "text": "..."} with at most %d bytes of text`, maxText)
		}
		if in.InMs < 0 || in.InMs > maxRemindMs {
			return nil, fmt.Errorf("in_ms must be from 0 to %d (a year), not %d", maxRemindMs, in.InMs)
		}
		pending := sdk.Scan(remindPrefix, maxReminders+1)
		if len(pending) >= maxReminders {
			return nil, fmt.Errorf("the room has %d reminders pending, the most it keeps", len(pending))
		}
		at := time.Unix(0, sdk.Now()).Add(time.Duration(in.InMs) * time.Millisecond)
		id := sdk.GetInt("reminders") + 1
		sdk.PutInt("reminders", id)
		sdk.Put(fmt.Sprintf("%s%016d/%d", remindPrefix, at.UnixMilli(), id), []byte(in.Text))
		if err := setNextAlarm(); err != nil {
			return nil, err
		}
		return map[string]int64{"at": at.UnixMilli()}, nil
	})
	sdk.OnAlarm(func() error {
		now := time.Unix(0, sdk.Now()).UnixMilli()
		for _, kv := range sdk.Scan(remindPrefix, maxReminders) {
			if dueOf(kv.Key) > now {
				break
			}
			if _, err := post(message{Author: "reminder", Text: string(kv.Value)}); err != nil {
				return err
			}
			sdk.Delete(kv.Key)
		}
		return setNextAlarm()
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

const (
	// remindPrefix keys a pending reminder: remind/DUE_MS/ID, so a scan
	// lists them earliest first.
	remindPrefix = "remind/"
	maxReminders = 100
	maxRemindMs  = int64(365 * 24 * time.Hour / time.Millisecond)
)

// post stores a message and publishes it; it returns its number.
func post(m message) (int64, error) {
	if m.Text == "" {
		return 0, errors.New(`post needs {"text": "..."}`)
	}
	if len(m.Text) > maxText {
		return 0, fmt.Errorf("text is %d bytes, at most %d", len(m.Text), maxText)
	}
	if m.Author == "" {
		m.Author = "anonymous"
	}
	m.Time = sdk.Now()
	n := sdk.GetInt("count") + 1
	sdk.PutInt("count", n)
	if err := sdk.PutJSON(fmt.Sprintf("msg/%016d", n), m); err != nil {
		return 0, err
	}
	return n, sdk.PublishJSON("messages", m)
}

// setNextAlarm sets the room's alarm at its earliest pending reminder, or
// deletes it when none is left.
func setNextAlarm() error {
	next := sdk.Scan(remindPrefix, 1)
	if len(next) == 0 {
		return sdk.DeleteAlarm()
	}
	return sdk.SetAlarm(time.UnixMilli(dueOf(next[0].Key)))
}

// dueOf is the due time, Unix ms, in a reminder's key.
func dueOf(key string) int64 {
	due, _, _ := strings.Cut(strings.TrimPrefix(key, remindPrefix), "/")
	ms, _ := strconv.ParseInt(due, 10, 64)
	return ms
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
