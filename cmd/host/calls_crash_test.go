package main

import (
	"context"
	"testing"
	"time"

	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/vm/vmtest"
)

// TestCallFromReceiveOnceAcrossKill9 kills a `host serve` process with
// SIGKILL while a receive handler, its call to a third object committed,
// is still running: the follower's transaction is lost, the event is
// delivered again after the restart and its handler runs again, and the
// third object holds the entry once (its call was answered from the
// record the first one left).
//
// conformance: D15 D17
func TestCallFromReceiveOnceAcrossKill9(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills processes; not in -short")
	}
	bin := hostBinary(t)
	data := t.TempDir()
	addr := freePort(t)
	srv := startServer(t, bin, data, addr)
	c := &hclient.Client{Base: "http://" + addr}
	ctx := context.Background()
	if _, err := c.Upload(ctx, "ledger", vmtest.Wasm(t, "ledger")); err != nil {
		t.Fatal(err)
	}
	call := func(object, method, payload string) string {
		t.Helper()
		out, err := c.Call(ctx, object, method, []byte(payload))
		if err != nil {
			t.Fatalf("%s %s: %v", object, method, err)
		}
		return string(out)
	}
	call("ledger/f", "follow", "ledger/p")
	// The handler adds e1 to third, then is busy 3 s before it commits.
	call("ledger/p", "publish", "ledger/third\ne1\n\n3000")
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("third's entry", func() bool { return call("ledger/third", "entries", "") == "e1\n" })
	srv.cmd.Process.Kill() // SIGKILL, while the handler spins
	<-srv.done
	srv.waited = true
	srv = startServer(t, bin, data, addr)
	waitFor("the event delivered again and committed", func() bool {
		return metricsOf(t, addr).Sum("host_receive_commits_total") >= 1
	})
	if got := call("ledger/third", "entries", ""); got != "e1\n" {
		t.Fatalf("third's entries %q after the kill: the redelivered handler's call repeated its effect", got)
	}
	if r := metricsOf(t, addr).Sum("host_call_repeats_total"); r < 1 {
		t.Fatalf("no call answered from its record (%v): the handler did not run again", r)
	}
	srv.stop(t)
}
