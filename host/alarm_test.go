package host_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/durable-host/host/delivery/deliverytest"
	"github.com/durable-host/host/host"
	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/hosttest"
	"github.com/durable-host/host/vm/vmtest"
)

// alarmStart is where the alarm tests' clocks start: a time of its own, so
// nothing that reads the wall clock passes for the injected one.
var alarmStart = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// alarmNode starts a node whose handlers, alarms and retries run on clock.
func alarmNode(t *testing.T, clock *deliverytest.Clock, dir string, configure func(*host.Config)) (*host.Node, *hclient.Client) {
	t.Helper()
	return hosttest.Start(t, hosttest.Options{DataDir: dir, Programs: []string{"hostile", "chat"}, Configure: func(c *host.Config) {
		c.Delivery.Clock = clock
		if configure != nil {
			configure(c)
		}
	}})
}

// restartAlarmNode shuts n down and starts a node on its data directory.
func restartAlarmNode(t *testing.T, n *host.Node, clock *deliverytest.Clock, dir string) (*host.Node, *hclient.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n.Shutdown(ctx)
	return alarmNode(t, clock, dir, nil)
}

func callErr(c *hclient.Client, object, method, payload string) (string, error) {
	out, err := c.Call(context.Background(), object, method, []byte(payload))
	return string(out), err
}

func alarmRuns(t *testing.T, c *hclient.Client, object string) int {
	t.Helper()
	n, err := strconv.Atoi(dcall(t, c, object, "alarm_runs", ""))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// stays checks, for a moment of real time, that cond keeps holding: the
// runs an alarm must not start are started on goroutines of their own.
func stays(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 20 {
		if !cond() {
			t.Fatalf("no longer true: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func alarmsTotal(t *testing.T, c *hclient.Client, result string) float64 {
	t.Helper()
	return metric(t, c, `host_alarms_total{result="`+result+`"}`)
}

// An alarm runs its handler once, at its time and not before, on an
// object that was deactivated meanwhile, and is cleared by that run.
//
// conformance: A02
func TestAlarmFiresOnceAtItsTime(t *testing.T) {
	t.Parallel()
	clock := deliverytest.NewClock(alarmStart)
	n, c := alarmNode(t, clock, "", func(c *host.Config) { c.IdleTimeout = 50 * time.Millisecond })
	dcall(t, c, "hostile/a1", "alarm_in", "60000")
	if got, want := dcall(t, c, "hostile/a1", "alarm_get", ""), strconv.FormatInt(alarmStart.Add(time.Minute).UnixMilli(), 10); got != want {
		t.Fatalf("alarm_get = %s, want %s", got, want)
	}
	waitUntil(t, "the object is idle and deactivated", 10*time.Second, func() bool { return n.ActiveObjects() == 0 })
	clock.Advance(59*time.Second + 999*time.Millisecond)
	stays(t, "no run before the alarm's time", func() bool { return n.ActiveObjects() == 0 && alarmsTotal(t, c, "ok") == 0 })
	clock.Advance(time.Millisecond)
	waitUntil(t, "the alarm ran", 10*time.Second, func() bool { return alarmsTotal(t, c, "ok") == 1 })
	if got := alarmRuns(t, c, "hostile/a1"); got != 1 {
		t.Fatalf("the handler ran %d times", got)
	}
	if got := dcall(t, c, "hostile/a1", "alarm_get", ""); got != "-1" {
		t.Fatalf("after its run the alarm is still set: %s", got)
	}
	clock.Advance(time.Hour)
	stays(t, "one run only", func() bool { return alarmsTotal(t, c, "ok") == 1 })
	if got := alarmRuns(t, c, "hostile/a1"); got != 1 || metric(t, c, "host_alarms_pending") != 0 {
		t.Fatalf("runs %d, pending %v", got, metric(t, c, "host_alarms_pending"))
	}
}

// Setting an alarm again replaces it; deleting it cancels it; a handler
// that sets its next alarm keeps it.
//
// conformance: A01 A02
func TestAlarmReplacedDeletedAndRearmed(t *testing.T) {
	t.Parallel()
	clock := deliverytest.NewClock(alarmStart)
	_, c := alarmNode(t, clock, "", nil)
	dcall(t, c, "hostile/r1", "alarm_in", "1000")
	dcall(t, c, "hostile/r1", "alarm_in", "5000")
	clock.Advance(2 * time.Second)
	stays(t, "the replaced alarm does not run", func() bool { return alarmsTotal(t, c, "ok") == 0 })
	clock.Advance(3 * time.Second)
	waitUntil(t, "the replacing alarm ran", 10*time.Second, func() bool { return alarmsTotal(t, c, "ok") == 1 })

	dcall(t, c, "hostile/r2", "alarm_in", "1000")
	dcall(t, c, "hostile/r2", "alarm_delete", "")
	clock.Advance(time.Minute)
	stays(t, "a deleted alarm does not run", func() bool { return alarmsTotal(t, c, "ok") == 1 })

	dcall(t, c, "hostile/r3", "alarm_mode", "rearm")
	dcall(t, c, "hostile/r3", "alarm_in", "0")
	waitUntil(t, "the first run", 10*time.Second, func() bool { return alarmsTotal(t, c, "ok") == 2 })
	for k := 3; k <= 5; k++ {
		clock.Advance(time.Second)
		waitUntil(t, "the next run of a rearming alarm", 10*time.Second, func() bool { return alarmsTotal(t, c, "ok") == float64(k) })
	}
	if got := alarmRuns(t, c, "hostile/r3"); got != 4 {
		t.Fatalf("rearming alarm ran %d times, want 4", got)
	}
}

// An alarm set by a call that fails is not set: it is part of the call's
// transaction.
//
// conformance: A01
func TestAlarmSetInAFailingCallSetsNothing(t *testing.T) {
	t.Parallel()
	clock := deliverytest.NewClock(alarmStart)
	_, c := alarmNode(t, clock, "", nil)
	if _, err := callErr(c, "hostile/f1", "alarm_then_fail", ""); err == nil {
		t.Fatal("alarm_then_fail succeeded")
	}
	if got := dcall(t, c, "hostile/f1", "alarm_get", ""); got != "-1" {
		t.Fatalf("a failed call left an alarm at %s", got)
	}
	clock.Advance(time.Hour)
	stays(t, "nothing runs", func() bool {
		return alarmsTotal(t, c, "ok")+alarmsTotal(t, c, "retry")+alarmsTotal(t, c, "dropped") == 0 && metric(t, c, "host_alarms_pending") == 0
	})
	if got := alarmRuns(t, c, "hostile/f1"); got != 0 {
		t.Fatalf("the alarm handler ran %d times", got)
	}
}

// A failing alarm runs again after 0.5 s, doubling, as many times as a
// durable delivery, then is dropped and counted; nothing a failed run
// wrote commits. The count of attempts is in the file: a restart halfway
// goes on from it.
//
// conformance: A03
func TestFailingAlarmRetriesOnTheScheduleThenDrops(t *testing.T) {
	hosttest.Heavy(t)
	t.Parallel()
	clock := deliverytest.NewClock(alarmStart)
	dir := t.TempDir()
	n, c := alarmNode(t, clock, dir, nil)
	// The metrics are the process's: after the restart they count from 0.
	before := 0.0
	retries := func() float64 { return before + alarmsTotal(t, c, "retry") }
	dcall(t, c, "hostile/x1", "alarm_mode", "fail")
	dcall(t, c, "hostile/x1", "alarm_in", "0") // the first attempt, now
	backoff := 500 * time.Millisecond
	for attempt := 1; attempt <= 8; attempt++ {
		if attempt > 1 {
			clock.Advance(backoff - time.Millisecond)
			stays(t, "no attempt before its backoff", func() bool { return retries() == float64(attempt-1) })
			clock.Advance(time.Millisecond)
			backoff *= 2
		}
		if attempt == 8 {
			break
		}
		waitUntil(t, "attempt "+strconv.Itoa(attempt)+" failed and is retried", 10*time.Second, func() bool {
			return retries() == float64(attempt)
		})
		if attempt == 3 {
			before = retries()
			n, c = restartAlarmNode(t, n, clock, dir)
			waitUntil(t, "the alarm scheduled again after the restart", 10*time.Second, func() bool { return metric(t, c, "host_alarms_pending") == 1 })
			if n.ActiveObjects() != 0 {
				t.Fatal("the restarted node activated an object whose alarm is not due")
			}
		}
	}
	waitUntil(t, "the last attempt failed and the alarm is dropped", 10*time.Second, func() bool { return alarmsTotal(t, c, "dropped") == 1 })
	if got := dcall(t, c, "hostile/x1", "alarm_get", ""); got != "-1" {
		t.Fatalf("a dropped alarm is still set: %s", got)
	}
	clock.Advance(10 * time.Minute)
	stays(t, "no attempt after the drop", func() bool { return alarmsTotal(t, c, "dropped") == 1 && retries() == 7 })
	if got := alarmRuns(t, c, "hostile/x1"); got != 0 {
		t.Fatalf("failed runs committed %d counts", got)
	}
}

// An alarm that runs past its budget or traps is a failed attempt like an
// error; the node goes on, and the next attempt, once the handler is
// fixed, runs and commits.
//
// conformance: A03
func TestAlarmOverBudgetOrTrappingIsRetried(t *testing.T) {
	t.Parallel()
	clock := deliverytest.NewClock(alarmStart)
	_, c := alarmNode(t, clock, "", func(c *host.Config) { c.VM.Budget = 300 * time.Millisecond })
	dcall(t, c, "hostile/b1", "alarm_mode", "loop")
	dcall(t, c, "hostile/b1", "alarm_in", "0")
	waitUntil(t, "the looping run failed", 20*time.Second, func() bool { return alarmsTotal(t, c, "retry") == 1 })
	dcall(t, c, "hostile/b1", "alarm_mode", "trap")
	clock.Advance(500 * time.Millisecond)
	waitUntil(t, "the trapping run failed", 20*time.Second, func() bool { return alarmsTotal(t, c, "retry") == 2 })
	dcall(t, c, "hostile/b1", "alarm_mode", "")
	clock.Advance(time.Second)
	waitUntil(t, "the fixed run committed", 20*time.Second, func() bool { return alarmsTotal(t, c, "ok") == 1 })
	if got := alarmRuns(t, c, "hostile/b1"); got != 1 {
		t.Fatalf("runs %d, want the one that committed", got)
	}
}

// A pending alarm survives a restart of the node: found in the object's
// file at start without activating it, run when due.
//
// conformance: A04
func TestAlarmSurvivesARestart(t *testing.T) {
	hosttest.Heavy(t)
	t.Parallel()
	clock := deliverytest.NewClock(alarmStart)
	dir := t.TempDir()
	n, c := alarmNode(t, clock, dir, nil)
	dcall(t, c, "chat/room1", "remind", `{"in_ms": 90000, "text": "stand-up"}`)
	dcall(t, c, "hostile/s1", "alarm_in", "30000")
	n, c = restartAlarmNode(t, n, clock, dir)
	waitUntil(t, "both alarms scheduled from the files", 10*time.Second, func() bool { return metric(t, c, "host_alarms_pending") == 2 })
	if k := n.ActiveObjects(); k != 0 {
		t.Fatalf("%d objects activated at start", k)
	}
	clock.Advance(30 * time.Second)
	waitUntil(t, "the first alarm ran", 10*time.Second, func() bool { return alarmsTotal(t, c, "ok") == 1 })
	clock.Advance(60 * time.Second)
	waitUntil(t, "the reminder was posted", 10*time.Second, func() bool {
		return strings.Contains(dcall(t, c, "chat/room1", "history", ""), `"author":"reminder","text":"stand-up"`)
	})
}

// A guest's bad alarm times: one long past runs at once; a negative one,
// one more than ten years ahead and the largest int64 are refused with a
// reason, and the node is unharmed.
//
// conformance: A06
func TestAlarmBadTimes(t *testing.T) {
	t.Parallel()
	clock := deliverytest.NewClock(alarmStart)
	_, c := alarmNode(t, clock, "", nil)
	dcall(t, c, "hostile/p1", "alarm_at", "1") // 1970
	waitUntil(t, "an alarm in the past runs at once", 10*time.Second, func() bool { return alarmsTotal(t, c, "ok") == 1 })
	far := alarmStart.AddDate(11, 0, 0).UnixMilli()
	for payload, want := range map[string]string{
		"-5":                       "negative",
		strconv.FormatInt(far, 10): "more than 3650 days ahead",
		"9223372036854775807":      "more than 3650 days ahead",
	} {
		_, err := callErr(c, "hostile/p2", "alarm_at", payload)
		var ae *hclient.APIError
		if !errors.As(err, &ae) || !strings.Contains(err.Error(), want) {
			t.Errorf("alarm_at %s: %v, want an error saying %q", payload, err, want)
		}
	}
	if got := dcall(t, c, "hostile/p2", "alarm_get", ""); got != "-1" {
		t.Fatalf("a refused alarm is set: %s", got)
	}
	if got := dcall(t, c, "hostile/p2", "ok", ""); got != "ok" {
		t.Fatalf("the object after refusals: %s", got)
	}
}

// On a cluster with copies an alarm runs on its object's home only, once;
// the copies hold it but do not schedule it. When the home leaves before
// an alarm is due, the node that takes the object over runs it, once, and
// an alarm that already ran does not run again there.
//
// conformance: A02 A05
func TestAlarmOnAClusterRunsOnTheHomeOnceAlsoAfterTakeover(t *testing.T) {
	t.Parallel()
	nodes, _ := hosttest.Cluster(t, 3, hosttest.Options{Programs: clusterPrograms})
	ctx := context.Background()
	clients := make([]*hclient.Client, len(nodes))
	for i, n := range nodes {
		clients[i] = &hclient.Client{Base: n.URL()}
	}
	via := clients[1]
	dcall(t, via, "hostile/c1", "alarm_in", "1500")
	dcall(t, via, "hostile/c2", "alarm_in", "12000")
	home := func(object string) int {
		var rep host.ReplicaReport
		if err := via.Replicas(ctx, object, &rep); err != nil {
			t.Fatal(err)
		}
		for i, n := range nodes {
			if n.ID() == rep.Home {
				return i
			}
		}
		t.Fatalf("%s: home %q is none of the nodes", object, rep.Home)
		return -1
	}
	h := home("hostile/c2")
	if home("hostile/c1") != h {
		t.Fatal("both objects were first used through one node and should be homed there")
	}
	for i, c := range clients {
		want := 0.0
		if i == h {
			want = 2
		}
		// The first alarm (1.5 s) may have run already on a loaded
		// machine: pending or run, each on the home alone (a run counts
		// as both for a moment).
		waitUntil(t, fmt.Sprintf("node %d with %v alarms pending or run", i, want), 10*time.Second, func() bool {
			return metric(t, c, "host_alarms_pending")+alarmsTotal(t, c, "ok") == want
		})
	}
	okOnLive := func(except int) float64 {
		sum := 0.0
		for i, c := range clients {
			if i != except {
				sum += alarmsTotal(t, c, "ok")
			}
		}
		return sum
	}
	waitUntil(t, "the first alarm ran", 20*time.Second, func() bool { return okOnLive(-1) == 1 })
	if alarmsTotal(t, clients[h], "ok") != 1 {
		t.Fatal("the alarm ran elsewhere than its home")
	}
	waitUntil(t, "the copies of the second object hold its alarm", 20*time.Second, func() bool {
		var rep host.ReplicaReport
		return via.Replicas(ctx, "hostile/c2", &rep) == nil && len(rep.Copies) == 3 &&
			rep.Copies[1].Position == rep.Copies[0].Position && rep.Copies[2].Position == rep.Copies[0].Position
	})
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	nodes[h].Shutdown(sctx)
	cancel()
	live := clients[(h+1)%3]
	waitUntil(t, "the second alarm ran on the node that took its object over", 60*time.Second, func() bool {
		return okOnLive(h) == 1
	})
	stays(t, "no second run", func() bool { return okOnLive(h) == 1 })
	if got := alarmRuns(t, live, "hostile/c2"); got != 1 {
		t.Fatalf("the second alarm ran %d times", got)
	}
	if got := alarmRuns(t, live, "hostile/c1"); got != 1 {
		t.Fatalf("the first alarm ran %d times, counting the new home's", got)
	}
}

// A program that registers no alarm handler cannot set an alarm: the
// call fails at once with the reason, not later when it would be due.
//
// conformance: A06
func TestAlarmNeedsAHandler(t *testing.T) {
	t.Parallel()
	clock := deliverytest.NewClock(alarmStart)
	_, c := alarmNode(t, clock, "", nil)
	if _, err := c.Upload(context.Background(), "hostile-rust", vmtest.Wasm(t, "hostile-rust")); err != nil {
		t.Fatal(err)
	}
	_, err := callErr(c, "hostile-rust/n1", "set_alarm", "")
	if err == nil || !strings.Contains(err.Error(), "has no alarm handler: register one") {
		t.Fatalf("set_alarm without a handler: %v", err)
	}
	if metric(t, c, "host_alarms_pending") != 0 {
		t.Fatal("a refused alarm is scheduled")
	}
}

// The chat examples' remind, in Go and in Rust: reminders come due in
// order, each posted once as a message by "reminder", with the room's one
// alarm at the earliest pending; bad reminders are refused alike.
//
// conformance: A02
func TestChatRemind(t *testing.T) {
	hosttest.Heavy(t)
	t.Parallel()
	clock := deliverytest.NewClock(alarmStart)
	_, c := alarmNode(t, clock, "", nil)
	if _, err := c.Upload(context.Background(), "chat-rust", vmtest.Wasm(t, "chat-rust")); err != nil {
		t.Fatal(err)
	}
	rooms := []string{"chat/r1", "chat-rust/r1"}
	var refusals []string
	for _, room := range rooms {
		if got, want := dcall(t, c, room, "remind", `{"in_ms": 2000, "text": "second"}`), `{"at":`+strconv.FormatInt(alarmStart.Add(2*time.Second).UnixMilli(), 10)+`}`; got != want {
			t.Fatalf("%s remind = %s, want %s", room, got, want)
		}
		dcall(t, c, room, "remind", `{"in_ms": 1000, "text": "first"}`)
		dcall(t, c, room, "post", `{"author": "ann", "text": "hi"}`)
		for _, bad := range []string{`{"in_ms": -1, "text": "x"}`, `{"in_ms": 1000}`, `{"in_ms": 99999999999999, "text": "x"}`, `{"in_ms": "soon"}`} {
			_, err := callErr(c, room, "remind", bad)
			if err == nil {
				t.Fatalf("%s remind %s succeeded", room, bad)
			}
			refusals = append(refusals, strings.ReplaceAll(err.Error(), room, "ROOM"))
		}
	}
	for i := range len(refusals) / 2 {
		if refusals[i] != refusals[i+len(refusals)/2] {
			t.Errorf("Go and Rust refuse differently:\n%s\n%s", refusals[i], refusals[i+len(refusals)/2])
		}
	}
	history := func(room string) string { return dcall(t, c, room, "history", "") }
	clock.Advance(time.Second)
	for _, room := range rooms {
		waitUntil(t, room+": the first reminder", 10*time.Second, func() bool { return strings.Contains(history(room), `"text":"first"`) })
		if strings.Contains(history(room), `"text":"second"`) {
			t.Fatalf("%s: the second reminder came early", room)
		}
	}
	clock.Advance(time.Second)
	for _, room := range rooms {
		waitUntil(t, room+": the second reminder", 10*time.Second, func() bool { return strings.Contains(history(room), `"text":"second"`) })
	}
	clock.Advance(time.Hour)
	stays(t, "each reminder once", func() bool { return alarmsTotal(t, c, "ok") == float64(2*len(rooms)) })
	for _, room := range rooms {
		h := history(room)
		if strings.Count(h, `"author":"reminder"`) != 2 || strings.Index(h, `"first"`) > strings.Index(h, `"second"`) || !strings.Contains(h, `"text":"hi"`) {
			t.Fatalf("%s history %s", room, h)
		}
	}
}

// Alarms due together run a bounded number at a time, each holding its
// object (a file, an instance) until it ends: 80 alarms due at once whose
// handlers loop to their budget never run more than the bound at once,
// and all of them run.
func TestAlarmsDueTogetherRunBoundedAtOnce(t *testing.T) {
	t.Parallel()
	const objects = 80
	clock := deliverytest.NewClock(alarmStart)
	n, c := alarmNode(t, clock, "", func(c *host.Config) {
		c.VM.Budget = 500 * time.Millisecond
		c.Delivery.RetryBase = time.Hour // one run each here
	})
	due := alarmStart.Add(time.Minute)
	for i := range objects {
		obj := fmt.Sprintf("hostile/t%02d", i)
		dcall(t, c, obj, "alarm_mode", "loop")
		dcall(t, c, obj, "alarm_at", fmt.Sprint(due.UnixMilli()))
	}
	clock.Advance(2 * time.Minute) // all due at once
	waitUntil(t, "every alarm ran (and failed past its budget)", 60*time.Second, func() bool {
		return alarmsTotal(t, c, "retry") == objects
	})
	high, bound := host.AlarmRunsHighWater(n)
	if high > bound || high < bound/2 {
		t.Fatalf("%d alarm runs at once at most, with a bound of %d: want the bound reached, never passed", high, bound)
	}
}

// An alarm whose object's file will not open when it comes due (its change
// stream has no leader, say) is postponed without an attempt: it runs
// again after the longest backoff, not at once from the file that still
// says it is due (which looped), and then runs once.
//
// conformance: A02 A03
func TestAlarmPostponedWhenItsFileWillNotOpen(t *testing.T) {
	hosttest.Heavy(t)
	t.Parallel()
	clock := deliverytest.NewClock(alarmStart)
	// One node shipping its changes, so its objects open as homes
	// (host.FailHomeOpens).
	n, c := alarmNode(t, clock, "", func(c *host.Config) { c.IdleTimeout, c.Replicas = 50*time.Millisecond, 1 })
	dcall(t, c, "hostile/p1", "alarm_in", "1000")
	waitUntil(t, "the object is idle and deactivated", 10*time.Second, func() bool { return n.ActiveObjects() == 0 })
	host.FailHomeOpens(n, 1)
	clock.Advance(time.Second)
	waitUntil(t, "the run postponed", 10*time.Second, func() bool { return alarmsTotal(t, c, "postponed") == 1 })
	stays(t, "postponed once, not run again at once", func() bool {
		return alarmsTotal(t, c, "postponed") == 1 && alarmsTotal(t, c, "ok") == 0 && alarmsTotal(t, c, "retry") == 0
	})
	maxWait := host.DefaultConfig().Delivery.MaxBackoff()
	clock.Advance(maxWait - time.Millisecond)
	stays(t, "no run before the longest backoff", func() bool { return alarmsTotal(t, c, "ok") == 0 })
	clock.Advance(time.Millisecond)
	waitUntil(t, "the alarm ran", 10*time.Second, func() bool { return alarmsTotal(t, c, "ok") == 1 })
	if got := alarmRuns(t, c, "hostile/p1"); got != 1 {
		t.Fatalf("the handler ran %d times, want once", got)
	}
	if got := dcall(t, c, "hostile/p1", "alarm_get", ""); got != "-1" {
		t.Fatalf("after its run the alarm is still set: %s", got)
	}
}
