package host_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/hosttest"
)

// An object has one home whatever node its watchers attach to: a socket on
// another node attached to an object whose program has an event export
// gets frames shaped there, by an instance with no object behind it, so no
// second copy of the object's file appears and calls through both nodes
// see one state. The export runs once per event on each node, not once
// per socket; one that reaches for state fails with a clear error.
func TestEventExportRunsWhereTheSocketIsWithoutASecondHome(t *testing.T) {
	t.Parallel()
	nodes, cfgs := hosttest.Cluster(t, 2, hosttest.Options{Programs: clusterPrograms})
	home, away := &hclient.Client{Base: nodes[0].URL()}, &hclient.Client{Base: nodes[1].URL()}
	dcall(t, home, "hostile/h1", "publish", `"home here"`) // node 0 is the home
	const sockets = 5
	var ws []*watcher
	for range sockets {
		ws = append(ws, follow(t, away, "hostile/h1", "", "t", ""))
	}
	beforeAway := metric(t, away, "host_event_handler_calls_total")
	dcall(t, away, "hostile/h1", "publish", `"one"`)
	dcall(t, home, "hostile/h1", "publish", `"two"`)
	for i, w := range ws {
		waitUntil(t, "shaped frames on the socket's node", 20*time.Second, func() bool { return len(w.got()) >= 2 })
		got := w.got()
		if got[0] != `EVENT:"one"` || got[1] != `EVENT:"two"` {
			t.Fatalf("socket %d got %q, want the event export's frames in order", i, got)
		}
	}
	// One home, one file, one state.
	if _, err := os.Stat(filepath.Join(cfgs[1].DataDir, "objects", "hostile", "h1.db")); err == nil {
		t.Fatal("the socket's node made a copy of the object's file: a second home")
	}
	// Each socket's follow ran the follow hook once, on the home.
	if got := dcall(t, away, "hostile/h1", "hook_runs", ""); got != "5" {
		t.Fatalf("through the socket's node: %s follow hook runs, want 5", got)
	}
	if got := dcall(t, home, "hostile/h1", "hook_runs", ""); got != "5" {
		t.Fatalf("through the home: %s follow hook runs, want 5", got)
	}
	if n := nodes[1].ActiveObjects(); n != 0 {
		t.Fatalf("%d objects active on the socket's node, want 0", n)
	}
	if calls := metric(t, away, "host_event_handler_calls_total") - beforeAway; calls != 2 {
		t.Fatalf("%v event export runs on the socket's node for 2 events to %d sockets, want 2 (one per event)", calls, sockets)
	}
	// An export that reads state gets a clear error frame; the socket stays.
	dcall(t, home, "hostile/h1", "publish", `"readstate"`)
	waitUntil(t, "the error frame", 20*time.Second, func() bool { return len(ws[0].got()) >= 3 })
	if f := ws[0].got()[2]; !strings.Contains(f, `"type":"error"`) || !strings.Contains(f, "without the object's state") {
		t.Fatalf("an event export reading state gave %q", f)
	}
	dcall(t, home, "hostile/h1", "publish", `"after"`)
	waitUntil(t, "the socket still delivers", 20*time.Second, func() bool { return len(ws[0].got()) >= 4 })
	if f := ws[0].got()[3]; f != `EVENT:"after"` {
		t.Fatalf("after the failed export: %q", f)
	}
}
