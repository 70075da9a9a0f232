package main

import (
	"context"
	"strings"
	"testing"
	"time"

	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/vm/vmtest"
)

// TestAlarmSurvivesKill9 sets reminders (chat's remind, an alarm each) in
// a `host serve` process, kills it with SIGKILL before they are due and
// starts it again on its data directory: each reminder is posted once.
//
// conformance: A04
func TestAlarmSurvivesKill9(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills processes; not in -short")
	}
	bin := hostBinary(t)
	data := t.TempDir()
	addr := freePort(t)
	srv := spawnServer(t, bin, data, addr)
	waitHealthy(t, addr, srv)
	c := &hclient.Client{Base: "http://" + addr}
	ctx := context.Background()
	if _, err := c.Upload(ctx, "chat", vmtest.Wasm(t, "chat")); err != nil {
		t.Fatal(err)
	}
	rooms := map[string]string{"chat/a1": `{"in_ms": 2500, "text": "one"}`, "chat/a2": `{"in_ms": 4000, "text": "two"}`}
	for room, r := range rooms {
		if _, err := c.Call(ctx, room, "remind", []byte(r)); err != nil {
			t.Fatal(err)
		}
	}
	srv.cmd.Process.Kill() // SIGKILL: no shutdown path runs
	<-srv.done
	srv.waited = true
	srv = spawnServer(t, bin, data, addr)
	waitHealthy(t, addr, srv)
	count := func(room, text string) int {
		out, err := c.Call(ctx, room, "history", nil)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(out), `"author":"reminder","text":"`+text+`"`)
	}
	// Only /metrics until they ran: a call to a room would activate it,
	// which schedules its alarm whether or not the start found it.
	deadline := time.Now().Add(30 * time.Second)
	for alarmsOK(t, addr) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the alarms set before the kill did not run after the restart")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second)
	if a, b := count("chat/a1", "one"), count("chat/a2", "two"); a != 1 || b != 1 {
		t.Fatalf("reminders posted %d and %d times, want once each", a, b)
	}
}

// alarmsOK is the node's count of alarm runs that committed.
func alarmsOK(t *testing.T, addr string) float64 {
	t.Helper()
	return metricsOf(t, addr).Sum("host_alarms_total", `result="ok"`)
}
