package host_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/durable-host/host/delivery/deliverytest"
	"github.com/durable-host/host/host"
	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/hosttest"
)

// ledgers are the Go example of object calls and its Rust twin.
var ledgers = []string{"ledger", "ledger-rust"}

// callPayload is the ledger's call method's payload: call method on
// target with payload (and key), failing after the call with flags
// "fail", or spinning flags' milliseconds before it.
func callPayload(target, method, key, flags, payload string) string {
	return strings.Join([]string{target, method, key, flags, payload}, "\n")
}

// apiStatus is the status of a failed client call, 0 for none.
func apiStatus(err error) int {
	var ae *hclient.APIError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

// Objects call objects on the same node and on another: both effects
// commit; the callee's error reaches the caller as a status and message
// it handles; a caller that fails after its call keeps the callee's
// effect only; a cycle is refused across nodes too (the chain travels).
func TestCallsObjectToObjectSameNodeAndAcrossNodes(t *testing.T) {
	t.Parallel()
	nodes, _ := hosttest.Cluster(t, 2, hosttest.Options{Programs: ledgers})
	c0, c1 := &hclient.Client{Base: nodes[0].URL()}, &hclient.Client{Base: nodes[1].URL()}
	for _, prog := range ledgers {
		t.Run(prog, func(t *testing.T) { testCallsSameNodeAndAcross(t, c0, c1, prog) })
	}
}

func testCallsSameNodeAndAcross(t *testing.T, c0, c1 *hclient.Client, prog string) {
	l := func(id string) string { return prog + "/" + id }
	// Homes: a and near on node 0, far on node 1.
	dcall(t, c0, l("a"), "total", "")
	dcall(t, c0, l("near"), "total", "")
	dcall(t, c1, l("far"), "total", "")
	for _, target := range []string{l("near"), l("far")} {
		if got := dcall(t, c0, l("a"), "call", callPayload(target, "add", "", "", "x")); got != "ok 1" {
			t.Fatalf("a calls %s: %q", target, got)
		}
		got := dcall(t, c0, l("a"), "call", callPayload(target, "add", "", "", "fail-y"))
		if got != "error 422 method failed: refused: fail-y" {
			t.Fatalf("a calls %s, which fails: %q", target, got)
		}
		_, err := c0.Call(context.Background(), l("a"), "call", []byte(callPayload(target, "add", "", "fail", "z")))
		if apiStatus(err) != http.StatusUnprocessableEntity || !strings.Contains(err.Error(), "failing after the call") {
			t.Fatalf("a fails after calling %s: %v", target, err)
		}
		if got := dcall(t, c1, target, "entries", ""); got != "x\nz\n" {
			t.Fatalf("%s's entries %q, want x and z: the callee's effect stays when its caller fails", target, got)
		}
		// A key of the caller's own: the repeat is answered from the
		// callee's record; the key with another payload is refused.
		for range 2 {
			if got := dcall(t, c0, l("a"), "call", callPayload(target, "add", "k\r1", "", "y")); got != "ok 3" {
				t.Fatalf("a calls %s with a key: %q", target, got)
			}
		}
		got = dcall(t, c0, l("a"), "call", callPayload(target, "add", "k\r1", "", "other"))
		if !strings.HasPrefix(got, "error 422 idempotency key reused with another request: key \"k\\r1\" was first used") {
			t.Fatalf("a reuses its key with %s: %q", target, got)
		}
		if got := dcall(t, c1, target, "entries", ""); got != "x\nz\ny\n" {
			t.Fatalf("%s's entries %q after keyed calls", target, got)
		}
	}
	// The calls that failed after their call rolled back.
	if got := dcall(t, c1, l("a"), "total", ""); got != "0" {
		t.Fatalf("a's own total %q", got)
	}
	// a (node 0) → far (node 1) → a: refused at far, which reports it.
	began := time.Now()
	got := dcall(t, c0, l("a"), "call", callPayload(l("far"), "call", "", "", callPayload(l("a"), "total", "", "", "")))
	if !strings.HasPrefix(got, "ok error 508 ") || !strings.Contains(got, l("a")+" → "+l("far")+" → "+l("a")) {
		t.Fatalf("a → far → a across nodes: %q", got)
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Fatalf("the cycle took %v to refuse", d)
	}
}

// A call back into an object waiting in the chain fails at once (not at
// the budget); a chain of 8 objects runs, one of 9 is refused.
func TestCallsCycleAndDepthRefusedAtOnce(t *testing.T) {
	t.Parallel()
	_, c := hosttest.Start(t, hosttest.Options{Programs: ledgers})
	for _, prog := range ledgers {
		t.Run(prog, func(t *testing.T) { testCallsCycleAndDepth(t, c, prog) })
	}
}

func testCallsCycleAndDepth(t *testing.T, c *hclient.Client, prog string) {
	l := func(id string) string { return prog + "/" + id }
	began := time.Now()
	got := dcall(t, c, l("a"), "call", callPayload(l("b"), "call", "", "", callPayload(l("a"), "add", "", "", "x")))
	want := "ok error 508 object call refused: call cycle " + l("a") + " → " + l("b") + " → " + l("a")
	if !strings.HasPrefix(got, want) {
		t.Fatalf("a → b → a: %q, want %q…", got, want)
	}
	if got := dcall(t, c, l("a"), "call", callPayload(l("a"), "add", "", "", "x")); !strings.HasPrefix(got, "error 508 object call refused: call cycle "+l("a")+" → "+l("a")) {
		t.Fatalf("a → a: %q", got)
	}
	if d := time.Since(began); d > 3*time.Second {
		t.Fatalf("refusing the cycles took %v: they waited", d)
	}
	// chain(k) is a0 → a1 → … → a(k-1), the last adding an entry.
	chain := func(k int) string {
		p := "deep"
		for i := k - 1; i >= 1; i-- {
			if i == k-1 {
				p = callPayload(l(fmt.Sprint("a", i)), "add", "", "", p)
			} else {
				p = callPayload(l(fmt.Sprint("a", i)), "call", "", "", p)
			}
		}
		return p
	}
	if got := dcall(t, c, l("a0"), "call", chain(8)); got != strings.Repeat("ok ", 7)+"1" {
		t.Fatalf("a chain of 8: %q", got)
	}
	got = dcall(t, c, l("a0"), "call", chain(9))
	if !strings.HasPrefix(got, strings.Repeat("ok ", 7)+"error 508 ") || !strings.Contains(got, "deeper than 8 objects") {
		t.Fatalf("a chain of 9: %q", got)
	}
	if got := dcall(t, c, l("a8"), "total", ""); got != "0" {
		t.Fatalf("the ninth object ran: total %q", got)
	}
}

// The callee runs no longer than its caller's remaining budget, on the
// same node and across nodes: a caller that spent 1.8 s of its 2 s budget
// calls an object that spins forever, and the whole call ends at the
// caller's budget (2 s), not the callee's own budget later (3.8 s). The
// bound between the two, 3.5 s, leaves a loaded machine 1.5 s of slack.
func TestCallsDeadlineCarried(t *testing.T) {
	t.Parallel()
	const budget, slack = 2 * time.Second, 1500 * time.Millisecond
	nodes, _ := hosttest.Cluster(t, 2, hosttest.Options{Programs: []string{"ledger"}, Configure: func(cfg *host.Config) {
		cfg.VM.Budget = budget
	}})
	c0, c1 := &hclient.Client{Base: nodes[0].URL()}, &hclient.Client{Base: nodes[1].URL()}
	dcall(t, c0, "ledger/a", "total", "")
	dcall(t, c0, "ledger/near", "total", "")
	dcall(t, c1, "ledger/far", "total", "")
	for _, target := range []string{"ledger/near", "ledger/far"} {
		began := time.Now()
		out, err := c0.Call(context.Background(), "ledger/a", "call", []byte(callPayload(target, "spin", "", "1800", "0")))
		d := time.Since(began)
		t.Logf("a calls %s, spinning: %v", target, d)
		// The caller's budget ends while it waits: it fails (504), or
		// reports its callee's 504 if that came back first.
		if apiStatus(err) != http.StatusGatewayTimeout && !strings.HasPrefix(string(out), "error 504") {
			t.Fatalf("a calls %s, spinning: %q %v", target, out, err)
		}
		if d > budget+slack {
			t.Fatalf("a calls %s, spinning: %v, past the caller's %v budget", target, d, budget)
		}
		// The callee stopped too: its lock is free (the caller stops
		// waiting across nodes at its deadline whatever the callee does).
		dcall(t, c1, target, "total", "")
		if d := time.Since(began); d > budget+slack {
			t.Fatalf("%s ran on to %v, past its caller's %v budget", target, d, budget)
		}
	}
}

// The same Idempotency-Key twice runs the method once and answers the
// same reply, through the home and through another node; the key with
// another payload or method is refused (422); an expired key runs again.
func TestCallsIdempotencyKeyOverHTTP(t *testing.T) {
	t.Parallel()
	clock := deliverytest.NewClock(time.Now())
	nodes, _ := hosttest.Cluster(t, 2, hosttest.Options{Programs: []string{"ledger"}, Configure: func(cfg *host.Config) {
		cfg.Delivery.Clock = clock
		cfg.CallRecordAge = time.Hour
	}})
	c0, c1 := &hclient.Client{Base: nodes[0].URL()}, &hclient.Client{Base: nodes[1].URL()}
	ctx := context.Background()
	dcall(t, c0, "ledger/l", "total", "")
	for i, c := range []*hclient.Client{c0, c1, c0} {
		out, err := c.CallWithKey(ctx, "ledger/l", "add", []byte("order-7"), "K1")
		if err != nil || string(out) != "1" {
			t.Fatalf("call %d with key K1: %q %v", i, out, err)
		}
	}
	if got := dcall(t, c1, "ledger/l", "entries", ""); got != "order-7\n" {
		t.Fatalf("entries after three calls with one key: %q", got)
	}
	for _, m := range []struct{ method, payload string }{{"add", "order-8"}, {"total", "order-7"}} {
		_, err := c1.CallWithKey(ctx, "ledger/l", m.method, []byte(m.payload), "K1")
		if apiStatus(err) != http.StatusUnprocessableEntity || !strings.Contains(err.Error(), `key "K1" was first used for another method or payload`) {
			t.Fatalf("K1 reused for %s %s: %v", m.method, m.payload, err)
		}
	}
	clock.Advance(time.Hour + time.Second)
	if out, err := c0.CallWithKey(ctx, "ledger/l", "add", []byte("order-7"), "K1"); err != nil || string(out) != "2" {
		t.Fatalf("K1 after its record expired: %q %v", out, err)
	}
	if _, err := c0.CallWithKey(ctx, "ledger/l", "add", []byte("x"), strings.Repeat("k", 257)); apiStatus(err) != http.StatusRequestEntityTooLarge {
		t.Fatalf("an oversized key: %v", err)
	}
}

// conformance: D15 D17 (the window the seed leaves to handler-side
// idempotence: an effect outside the follower's transaction)
//
// A receive handler that calls a third object and then fails (its own
// transaction rolls back after the callee committed) is delivered the
// event again; its call carries the key derived from the event, so the
// third object's effect counts once, checked by the entries themselves.
func TestCallsFromReceiveOnceInEffect(t *testing.T) {
	t.Parallel()
	_, c := hosttest.Start(t, hosttest.Options{Programs: ledgers, Configure: func(cfg *host.Config) {
		cfg.Delivery.RetryBase = 50 * time.Millisecond
	}})
	commits := 0.0
	for _, prog := range ledgers {
		t.Run(prog, func(t *testing.T) {
			commits += 2
			testCallsFromReceive(t, c, prog, commits)
		})
	}
}

func testCallsFromReceive(t *testing.T, c *hclient.Client, prog string, commits float64) {
	l := func(id string) string { return prog + "/" + id }
	repeats := metric(t, c, "host_call_repeats_total")
	dcall(t, c, l("f"), "follow", l("p"))
	dcall(t, c, l("p"), "publish", l("third")+"\ne1\n"+l("gate"))
	dcall(t, c, l("p"), "publish", l("third")+"\ne2\n")
	waitUntil(t, "the follower committed both events", 10*time.Second, func() bool {
		return metric(t, c, "host_receive_commits_total") >= commits
	})
	if got := dcall(t, c, l("third"), "entries", ""); got != "e1\ne2\n" {
		t.Fatalf("third's entries %q: the redelivered event's call repeated its effect", got)
	}
	if r := metric(t, c, "host_call_repeats_total") - repeats; r < 1 {
		t.Fatalf("no call was answered from its record (%v): the event was not redelivered", r)
	}
}

// Hostile call requests get a status, never a host panic: one that does
// not decode, one over the size limit (413), a target that is no object
// name (400); a pointer outside memory traps the caller alone.
func TestCallsHostileRequests(t *testing.T) {
	t.Parallel()
	_, c := hosttest.Start(t, hosttest.Options{Programs: []string{"hostile"}})
	if got := dcall(t, c, "hostile/h", "call_bad", ""); got != "413 400" {
		t.Fatalf("hostile call requests: %q", got)
	}
	if _, err := c.Call(context.Background(), "hostile/h", "call_oob", nil); apiStatus(err) != http.StatusInternalServerError {
		t.Fatalf("a call request outside memory: %v", err)
	}
	if got := dcall(t, c, "hostile/h", "ok", ""); got != "ok" {
		t.Fatalf("after a trapped call: %q", got)
	}
	// A method name would cross to another node in a header.
	if _, err := c.Call(context.Background(), "hostile/h", "ok\r\nStatus: 200", nil); apiStatus(err) != http.StatusBadRequest {
		t.Fatalf("a method name with a line break: %v", err)
	}
}
