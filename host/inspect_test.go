package host_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/durable-host/host/host"
	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/hosttest"
)

// Objects used on three nodes are listed once each, on the home the
// directory names, in name order and across pages, from any node; their
// state and log are read from a node that is not their home, a page at a
// time; an object never used is not listed and reading it claims nothing.
func TestInspectAcrossTheCluster(t *testing.T) {
	t.Parallel()
	nodes, _ := hosttest.Cluster(t, 3, hosttest.Options{Programs: clusterPrograms})
	ctx := context.Background()
	cs := make([]*hclient.Client, len(nodes))
	for i, n := range nodes {
		cs[i] = &hclient.Client{Base: n.URL()}
	}
	want := map[string]string{}
	for i := range 12 {
		obj := fmt.Sprintf("counter/c%02d", i)
		for range i%3 + 1 {
			dcall(t, cs[i%3], obj, "inc", "")
		}
		want[obj] = fmt.Sprint(i%3 + 1)
	}
	var got []host.ObjectInfo
	page := hclient.Page{Limit: 5}
	for pages := 1; ; pages++ {
		var p host.ObjectPage
		if err := cs[2].Objects(ctx, "counter", page, &p); err != nil {
			t.Fatal(err)
		}
		if len(p.Objects) > 5 || len(p.Unreachable) > 0 {
			t.Fatalf("page %d: %+v", pages, p)
		}
		got = append(got, p.Objects...)
		if p.Next == "" {
			break
		}
		if pages > 3 {
			t.Fatalf("more than 3 pages of 5 for 12 objects: %+v", got)
		}
		page.After = p.Next
	}
	if len(got) != len(want) || !slices.IsSortedFunc(got, func(a, b host.ObjectInfo) int { return compare(a.Object, b.Object) }) {
		t.Fatalf("listed %d objects (want %d, in name order): %+v", len(got), len(want), got)
	}
	homes := map[string]bool{}
	for i, o := range got {
		if _, ok := want[o.Object]; !ok || i > 0 && got[i-1].Object == o.Object {
			t.Fatalf("listed %s: not one of the counters used, or twice", o.Object)
		}
		var rep host.ReplicaReport
		if err := cs[0].Replicas(ctx, o.Object, &rep); err != nil || rep.Home != o.Home {
			t.Fatalf("%s listed on %s, the directory says %q (%v)", o.Object, o.Home, rep.Home, err)
		}
		if o.Bytes == 0 || o.Modified.IsZero() || !o.Active || o.LastUsed == nil {
			t.Fatalf("%s: %+v, want its size, last change and last call", o.Object, o)
		}
		homes[o.Home] = true
	}
	if len(homes) < 2 {
		t.Fatalf("12 objects all homed on %v: placement does not spread them", homes)
	}

	// State, read on a node that is not the object's home.
	for _, o := range got {
		reader := cs[0]
		if o.Home == nodes[0].ID() {
			reader = cs[1]
		}
		var st host.StatePage
		if err := reader.State(ctx, o.Object, "", hclient.Page{}, &st); err != nil {
			t.Fatal(err)
		}
		if st.Home != o.Home || len(st.Pairs) != 1 || st.Pairs[0].Key != "value" || string(st.Pairs[0].Value) != want[o.Object] {
			t.Fatalf("%s state: %+v, want value %s from %s", o.Object, st, want[o.Object], o.Home)
		}
	}

	// A large room: its state and log come a page at a time, in order.
	const posts = 60
	room := "chat/big"
	for i := range posts {
		dcall(t, cs[i%3], room, "post", fmt.Sprintf(`{"author":"a","text":"m%03d"}`, i))
	}
	var keys []string
	var after string
	for pages := 1; ; pages++ {
		var st host.StatePage
		if err := cs[pages%3].State(ctx, room, "msg/", hclient.Page{After: after, Limit: 25}, &st); err != nil {
			t.Fatal(err)
		}
		for _, p := range st.Pairs {
			keys = append(keys, p.Key)
		}
		if st.Next == nil {
			break
		}
		if pages > 3 {
			t.Fatalf("more than 3 pages of 25 for %d keys", posts)
		}
		after = string(mustJSON(t, st.Next)) // base64, as the page gives it
		after = after[1 : len(after)-1]
	}
	if len(keys) != posts || !slices.IsSorted(keys) || slices.Compact(slices.Clone(keys))[posts-1] != keys[posts-1] {
		t.Fatalf("%d keys under msg/ in %d posts (want all, ascending, once): %v", len(keys), posts, keys)
	}
	var seqs []uint64
	var lp host.LogPage
	for after := uint64(0); ; after = lp.Next {
		lp = host.LogPage{}
		if err := cs[int(after)%3].Log(ctx, room, "messages", hclient.Page{After: fmt.Sprint(after), Limit: 25}, &lp); err != nil {
			t.Fatal(err)
		}
		for _, e := range lp.Events {
			seqs = append(seqs, e.Seq)
			if e.Topic != "messages" || e.Time.IsZero() || len(e.Value) == 0 {
				t.Fatalf("event %+v: want its topic, time and JSON payload", e)
			}
		}
		if lp.Next == 0 {
			break
		}
	}
	if len(seqs) != posts || seqs[0] != 1 || seqs[posts-1] != posts || lp.Head != posts {
		t.Fatalf("log: %d events %v, head %d; want 1…%d", len(seqs), seqs, lp.Head, posts)
	}
	var first host.LogPage
	if err := cs[0].Log(ctx, room, "", hclient.Page{Limit: 1}, &first); err != nil || len(first.Events) != 1 ||
		!json.Valid(first.Events[0].Value) || string(first.Events[0].Value) == "" {
		t.Fatalf("first event: %+v %v", first, err)
	}

	// An object never used: 404, not listed, and no node claimed it.
	err := cs[1].State(ctx, "counter/never", "", hclient.Page{}, new(host.StatePage))
	var he *hclient.APIError
	if !errors.As(err, &he) || he.Status != http.StatusNotFound {
		t.Fatalf("state of an object never used: %v, want 404", err)
	}
	var rep host.ReplicaReport
	if err := cs[0].Replicas(ctx, "counter/never", &rep); err != nil || rep.Home != "" {
		t.Fatalf("after reading an object never used: home %q (%v), want none", rep.Home, err)
	}
	var p host.ObjectPage
	if err := cs[0].Objects(ctx, "", hclient.Page{Limit: 1000}, &p); err != nil || len(p.Objects) != len(want)+1 {
		t.Fatalf("every program's objects: %d %v, want the %d used", len(p.Objects), err, len(want)+1)
	}
}

// A read of an object's state neither waits for its running call nor
// holds it up: it runs beside the handler, not under the object's lock.
// It shows the pending alarm.
func TestInspectReadsBesideARunningCall(t *testing.T) {
	t.Parallel()
	n, c := hosttest.Start(t, hosttest.Options{Programs: []string{"hostile"}, Configure: func(c *host.Config) {
		c.VM.Budget = 5 * time.Second
	}})
	ctx := context.Background()
	dcall(t, c, "hostile/h1", "alarm_in", "3600000")
	done := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, "hostile/h1", "loop", nil) // puts "touched", then runs past its budget
		done <- err
	}()
	hosttest.WaitFor(t, "the loop holds the object", 5*time.Second, func() bool { return host.Busy(n, "hostile/h1") })
	var st host.StatePage
	if err := c.State(ctx, "hostile/h1", "", hclient.Page{}, &st); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("the read returned after the loop (%v): it waited for the call", err)
	default:
	}
	for _, p := range st.Pairs {
		if p.Key == "touched" {
			t.Fatalf("the read saw the running call's uncommitted write: %+v", st)
		}
	}
	if st.Alarm == nil || st.Alarm.Time.Before(time.Now().Add(time.Hour-time.Minute)) {
		t.Fatalf("state %+v: want the alarm an hour ahead", st)
	}
	if err := <-done; err == nil {
		t.Fatal("loop returned without running past its budget")
	}
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
