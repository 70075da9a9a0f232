//go:build wasip1

// Command tally is a durable follower: a tally object follows a chat room and
// counts messages per author in its own state.
//
// Methods:
//   - follow {"publisher": "chat/room1", "topic": "messages", "params": "key"}
//   - unfollow {"publisher": "chat/room1", "topic": "messages"}
//   - counts: {"total": N, "authors": {"ann": 3, ...}, "duplicates": 0}
//
// Its receive handler runs once per event in effect: the host skips events
// this object already committed. It still checks, and counts any event seen
// twice under "duplicates", which must stay 0.
package main

import (
	"encoding/json"
	"fmt"
	"strings"

	sdk "github.com/durable-host/host/sdk/go"
)

type followReq struct {
	Publisher string `json:"publisher"`
	Topic     string `json:"topic"`
	Filter    string `json:"filter"`
	Params    string `json:"params"`
}

func init() {
	sdk.JSONMethod("follow", func(in followReq) (bool, error) {
		if in.Topic == "" {
			in.Topic = "messages"
		}
		return true, sdk.Follow(in.Publisher, in.Topic, sdk.FollowOptions{Filter: in.Filter, Params: []byte(in.Params)})
	})
	sdk.JSONMethod("unfollow", func(in followReq) (bool, error) {
		if in.Topic == "" {
			in.Topic = "messages"
		}
		return true, sdk.Unfollow(in.Publisher, in.Topic)
	})
	sdk.Method("counts", func([]byte) ([]byte, error) {
		authors := map[string]int64{}
		for _, kv := range sdk.Scan("author/", 10000) {
			var n int64
			fmt.Sscan(string(kv.Value), &n)
			authors[strings.TrimPrefix(kv.Key, "author/")] = n
		}
		return json.Marshal(map[string]any{
			"total":      sdk.GetInt("total"),
			"authors":    authors,
			"duplicates": sdk.GetInt("duplicates"),
		})
	})
	sdk.OnReceive(func(e sdk.Event) error {
		seen := fmt.Sprintf("seen/%s/%016d", e.Publisher, e.Seq)
		if _, ok := sdk.Get(seen); ok {
			sdk.PutInt("duplicates", sdk.GetInt("duplicates")+1)
			return nil
		}
		sdk.Put(seen, nil)
		var m struct {
			Author string `json:"author"`
		}
		_ = json.Unmarshal(e.Payload, &m)
		if m.Author == "" {
			m.Author = "anonymous"
		}
		sdk.PutInt("author/"+m.Author, sdk.GetInt("author/"+m.Author)+1)
		sdk.PutInt("total", sdk.GetInt("total")+1)
		return nil
	})
}

func main() {}
