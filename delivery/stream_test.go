package delivery

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/store"
)

// memLog is a StreamReader over a slice, with the operations it saw. Like
// the storage reader it honours the bounds it is given, so a subscription
// that asks for more than its configured batch gets more.
type memLog struct {
	mu      sync.Mutex
	evs     []abi.Event
	reads   []uint64 // the after of each After
	batches []batch  // what each After returned
	broken  bool     // After returns an out-of-order batch
}

// batch is one read's result: its events, its payload bytes, and the
// bytes before its last event.
type batch struct{ events, bytes, beforeLast int }

func (l *memLog) add(n int) { l.addSized(n, 0) }

// addSized appends n events of size-byte payloads.
func (l *memLog) addSized(n, size int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for range n {
		l.evs = append(l.evs, abi.Event{Seq: uint64(len(l.evs) + 1), Topic: "t", Payload: make([]byte, size)})
	}
}

func (l *memLog) After(_ context.Context, after uint64, limit, maxBytes int) ([]abi.Event, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reads = append(l.reads, after)
	var out []abi.Event
	size, before := 0, 0
	for _, e := range l.evs {
		if e.Seq > after && len(out) < limit && size < maxBytes {
			out = append(out, e)
			before = size
			size += len(e.Payload)
		}
	}
	l.batches = append(l.batches, batch{len(out), size, before})
	if l.broken && len(out) > 1 {
		out[0], out[1] = out[1], out[0]
	}
	return out, nil
}

func (l *memLog) Latest(context.Context) (abi.Event, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.evs) == 0 {
		return abi.Event{}, false, nil
	}
	return l.evs[len(l.evs)-1], true, nil
}

func (l *memLog) readCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.reads)
}

// loopHints delivers each ping to the listener, like NATS on loopback,
// unless lose is set; failListen makes the first registrations fail.
type loopHints struct {
	mu         sync.Mutex
	f          func()
	ops        []string
	lose       atomic.Bool
	failListen int
}

func (h *loopHints) Listen(f func()) (func(), error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failListen > 0 {
		h.failListen--
		h.ops = append(h.ops, "listen failed")
		return nil, errors.New("no NATS")
	}
	h.f = f
	h.ops = append(h.ops, "listen+flush")
	return func() {}, nil
}

func (h *loopHints) Ping() error {
	h.mu.Lock()
	h.ops = append(h.ops, "ping")
	f := h.f
	h.mu.Unlock()
	if f != nil && !h.lose.Load() {
		f()
	}
	return nil
}

func (h *loopHints) hint() {
	h.mu.Lock()
	f := h.f
	h.mu.Unlock()
	f()
}

type sink struct {
	mu   sync.Mutex
	seqs []uint64
	fail func(seq uint64) error
	gate chan struct{} // when set, each send waits for a token
}

func (s *sink) send(e *abi.Event) error {
	if s.gate != nil {
		<-s.gate
	}
	if s.fail != nil {
		if err := s.fail(e.Seq); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.seqs = append(s.seqs, e.Seq)
	s.mu.Unlock()
	return nil
}

func (s *sink) got() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seqs)
}

func testStreamConfig() StreamConfig {
	c := DefaultStreamConfig()
	c.Idle = time.Hour
	c.Batch = 4
	return c
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func run(t *testing.T, s *Subscription) (cancel func(), done chan error) {
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(cancel)
	return cancel, done
}

func zero() *uint64 { return new(uint64) }

// S03: the listener is registered and flushed before the first read;
// failed registrations are retried with a doubling, bounded backoff.
func TestS03_ListenerRegisteredBeforeFirstReadWithBoundedRetry(t *testing.T) {
	l := &memLog{}
	l.add(3)
	h := &loopHints{failListen: 6}
	out := &sink{}
	cfg := testStreamConfig()
	cfg.RetryMin, cfg.RetryMax = 100*time.Millisecond, 400*time.Millisecond
	s := NewSubscription(cfg, l, h, zero(), out.send)
	var delays []time.Duration
	s.sleep = func(_ context.Context, d time.Duration) bool {
		if l.readCount() != 0 {
			t.Error("storage read before the listener was registered")
		}
		delays = append(delays, d)
		return true
	}
	run(t, s)
	waitFor(t, "3 events", func() bool { return len(out.got()) == 3 })
	want := []time.Duration{100, 200, 400, 400, 400, 400}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if !slices.Equal(delays, want) {
		t.Fatalf("retry delays %v, want %v", delays, want)
	}
	h.mu.Lock()
	ops := slices.Clone(h.ops)
	h.mu.Unlock()
	if i := slices.Index(ops, "listen+flush"); i != 6 || ops[7] != "ping" {
		t.Fatalf("operations %v: want 6 failures, the registration, then the startup ping", ops)
	}
}

// S04: startup publishes an empty hint and only its receipt starts the
// catch-up; a reconnect publishes one too, draining after the cursor.
func TestS04_StartupAndReconnectHintsTriggerDrains(t *testing.T) {
	l := &memLog{}
	l.add(2)
	h := &loopHints{}
	h.lose.Store(true) // the startup ping is lost in transit
	out := &sink{}
	s := NewSubscription(testStreamConfig(), l, h, zero(), out.send)
	run(t, s)
	waitFor(t, "the startup ping", func() bool { _, _, p := s.Stats(); return p == 1 })
	time.Sleep(50 * time.Millisecond)
	if n := l.readCount(); n != 0 {
		t.Fatalf("%d reads before any hint arrived", n)
	}
	h.lose.Store(false)
	s.Reconnected()
	waitFor(t, "the catch-up", func() bool { return len(out.got()) == 2 })
	l.add(2)
	s.Reconnected()
	waitFor(t, "the events after the cursor", func() bool { return len(out.got()) == 4 })
	if got := out.got(); !slices.Equal(got, []uint64{1, 2, 3, 4}) {
		t.Fatalf("sent %v", got)
	}
	l.mu.Lock()
	reads := slices.Clone(l.reads)
	l.mu.Unlock()
	if reads[0] != 0 || !slices.Contains(reads, 2) {
		t.Fatalf("reads after %v: the reconnect drain must read after the cursor 2", reads)
	}
}

// S05: after the idle threshold without a hint the subscription publishes
// one; its receipt drains (a missed hint is recovered) and resets the
// deadline. S06: publishing it reads nothing, and nothing polls.
func TestS05_S06_IdleWatchdogRecoversMissedHintsWithoutPolling(t *testing.T) {
	l := &memLog{}
	h := &loopHints{}
	out := &sink{}
	cfg := testStreamConfig()
	cfg.Idle = 100 * time.Millisecond
	s := NewSubscription(cfg, l, h, zero(), out.send)

	// S06 first: every hint lost. Pings go out each idle period; storage
	// is never read.
	h.lose.Store(true)
	run(t, s)
	waitFor(t, "three idle pings", func() bool { _, _, p := s.Stats(); return p >= 4 })
	if n := l.readCount(); n != 0 {
		t.Fatalf("%d storage reads with no hint received: publishing a hint must not read, and nothing may poll", n)
	}
	// S05: events committed while their hints were lost arrive with the
	// next watchdog hint once hints flow again.
	l.add(3)
	h.lose.Store(false)
	waitFor(t, "the missed events", func() bool { return len(out.got()) == 3 })
	hints, reads, pings := s.Stats()
	if reads > hints+1 {
		t.Fatalf("%d reads for %d hints received", reads, hints)
	}
	t.Logf("hints %d, reads %d, pings %d", hints, reads, pings)
	if err := (StreamConfig{Idle: 0, Batch: 1, BatchBytes: 1, RetryMin: 1, RetryMax: 1}).Validate(); err == nil {
		t.Fatal("an idle threshold of 0 was accepted; it must be positive")
	}
	if DefaultStreamConfig().Idle != 10*time.Second {
		t.Fatal("the default idle threshold must be 10 s")
	}
}

// S05: a hint's receipt resets the idle deadline: while hints keep coming
// more often than the threshold, the watchdog never pings.
func TestS05_HintReceiptResetsTheIdleDeadline(t *testing.T) {
	const idle = time.Second
	for attempt := 1; ; attempt++ {
		h := &loopHints{}
		cfg := testStreamConfig()
		cfg.Idle = idle
		s := NewSubscription(cfg, &memLog{}, h, zero(), (&sink{}).send)
		cancel, _ := run(t, s)
		waitFor(t, "the startup ping", func() bool { _, _, p := s.Stats(); return p == 1 })
		var gap time.Duration
		last := time.Now()
		for end := last.Add(5 * idle / 2); time.Now().Before(end); {
			time.Sleep(idle / 20)
			h.hint()
			gap = max(gap, time.Since(last))
			last = time.Now()
		}
		_, _, pings := s.Stats()
		cancel()
		if gap >= idle/2 && attempt < 3 {
			t.Logf("hints stalled for %v (the machine is busy): trying again", gap)
			continue
		}
		if pings != 1 {
			t.Fatalf("%d pings while hints came every %v (threshold %v): want only the startup one", pings, idle/20, idle)
		}
		return
	}
}

// S07: a batch that breaks ascending order after the cursor is refused
// whole, before any of it is sent; the subscription ends.
func TestS07_BatchValidatedBeforeDelivery(t *testing.T) {
	l := &memLog{broken: true}
	l.add(3)
	out := &sink{}
	s := NewSubscription(testStreamConfig(), l, &loopHints{}, zero(), out.send)
	_, done := run(t, s)
	select {
	case err := <-done:
		if !errors.Is(err, ErrStreamOrder) {
			t.Fatalf("ended with %v, want ErrStreamOrder", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the subscription delivered on")
	}
	if got := out.got(); len(got) != 0 {
		t.Fatalf("sent %v from an invalid batch", got)
	}
}

// S08: hints coalesce into one pending wake-up, reads are bounded batches,
// and sends run one at a time (a slow consumer slows the reads).
func TestS08_OnePendingWakeupBoundedBatches(t *testing.T) {
	l := &memLog{}
	l.add(10)
	h := &loopHints{}
	out := &sink{gate: make(chan struct{})}
	cfg := testStreamConfig()
	s := NewSubscription(cfg, l, h, zero(), out.send)
	run(t, s)
	out.gate <- struct{}{} // the first send is under way: the drain holds
	for range 10_000 {
		h.hint()
	}
	if cap(s.wake) != 1 || len(s.wake) != 1 {
		t.Fatalf("pending wake-ups: %d of room %d, want the 10,000 hints held as one", len(s.wake), cap(s.wake))
	}
	// Held in memory while the consumer is stuck: one batch.
	l.mu.Lock()
	held := l.batches[len(l.batches)-1].events
	l.mu.Unlock()
	if held > cfg.Batch {
		t.Fatalf("%d events read for a stuck consumer: one batch is at most %d", held, cfg.Batch)
	}
	readsBefore := l.readCount()
	close(out.gate)
	l.add(5)
	h.hint()
	waitFor(t, "15 events", func() bool { return len(out.got()) == 15 })
	time.Sleep(20 * time.Millisecond)
	if extra := l.readCount() - readsBefore; extra > 8 {
		t.Fatalf("%d reads after 10,000 hints: they must coalesce", extra)
	}
	if got := out.got(); !slices.IsSorted(got) || len(got) != 15 {
		t.Fatalf("sent %v", got)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, b := range l.batches {
		if b.events > cfg.Batch {
			t.Fatalf("read %d returned %d events: a batch is at most %d", i, b.events, cfg.Batch)
		}
	}
}

// S08: a batch stops at the byte bound too (at least one event, however
// large), and the reads cover the log in order without gaps.
func TestS08_BatchesBoundedByBytes(t *testing.T) {
	l := &memLog{}
	l.addSized(12, 400)
	l.addSized(1, 5000) // alone past the bound: still sent
	l.addSized(3, 400)
	out := &sink{}
	cfg := testStreamConfig()
	cfg.Batch, cfg.BatchBytes = 100, 1000
	s := NewSubscription(cfg, l, &loopHints{}, zero(), out.send)
	run(t, s)
	waitFor(t, "16 events", func() bool { return len(out.got()) == 16 })
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, b := range l.batches {
		// Reading stops once the bound is reached: every event but the
		// last fits under it.
		if b.beforeLast >= cfg.BatchBytes || b.events > cfg.Batch {
			t.Fatalf("read %d returned %d events of %d bytes: the bound is %d events, %d bytes", i, b.events, b.bytes, cfg.Batch, cfg.BatchBytes)
		}
	}
	if len(l.batches) < 16*400/cfg.BatchBytes {
		t.Fatalf("%d reads for %d payload bytes under a %d-byte bound", len(l.batches), 16*400+5000, cfg.BatchBytes)
	}
	if !slices.Equal(out.got(), []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}) {
		t.Fatalf("sent %v", out.got())
	}
}

// S08 at the storage reader: a stream's read returns at most limit events
// and stops once maxBytes of payload are in, with or without a filter.
func TestS08_StorageReadIsBounded(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "pub.db")
	f, err := store.Open(ctx, path, "")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tx, err := f.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := tx.Append("t", []byte(fmt.Sprintf(`{"n":%d,"pad":"%0300d"}`, i+1, 0)), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	all, err := ParseFilter("")
	if err != nil {
		t.Fatal(err)
	}
	some, err := ParseFilter("pad=" + fmt.Sprintf("%0300d", 0))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name            string
		f               Filter
		limit, maxBytes int
		want            int
	}{
		{"by count", all, 4, 1 << 20, 4},
		{"by bytes", all, 100, 1000, 4}, // ~320 bytes each: the 4th reaches 1000
		{"one past the bytes", all, 100, 1, 1},
		{"filtered by count", some, 4, 1 << 20, 4},
		{"filtered by bytes", some, 100, 1000, 4},
	} {
		evs, err := store.Read(ctx, path, store.Query{After: 3, Topic: "t", Match: c.f.MatchFunc(), Limit: c.limit, MaxBytes: c.maxBytes})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != c.want || evs[0].Seq != 4 {
			t.Fatalf("%s: %d events %v, want %d from seq 4", c.name, len(evs), evs, c.want)
		}
	}
}

// S09: hints with nothing new read nothing new, send nothing, and never
// move the cursor.
func TestS09_DuplicateHintsNeverAdvanceTheCursor(t *testing.T) {
	l := &memLog{}
	l.add(3)
	h := &loopHints{}
	out := &sink{}
	s := NewSubscription(testStreamConfig(), l, h, zero(), out.send)
	run(t, s)
	waitFor(t, "3 events", func() bool { return len(out.got()) == 3 })
	for range 100 {
		h.hint()
	}
	waitFor(t, "the hints", func() bool { hi, _, _ := s.Stats(); return hi >= 101 })
	time.Sleep(20 * time.Millisecond)
	if got := out.got(); !slices.Equal(got, []uint64{1, 2, 3}) || s.Cursor() != 3 {
		t.Fatalf("after duplicate hints: sent %v, cursor %d", got, s.Cursor())
	}
}

// S10: the cursor advances after each successful send; a failed send ends
// the subscription with the cursor on the last event sent.
func TestS10_CursorAdvancesAfterSendErrorEnds(t *testing.T) {
	l := &memLog{}
	l.add(6)
	failed := errors.New("consumer went away")
	out := &sink{fail: func(seq uint64) error {
		if seq == 4 {
			return failed
		}
		return nil
	}}
	s := NewSubscription(testStreamConfig(), l, &loopHints{}, zero(), out.send)
	_, done := run(t, s)
	select {
	case err := <-done:
		if !errors.Is(err, failed) {
			t.Fatalf("ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a failed send did not end the subscription")
	}
	if s.Cursor() != 3 || !slices.Equal(out.got(), []uint64{1, 2, 3}) {
		t.Fatalf("cursor %d, sent %v; want 3 and [1 2 3]", s.Cursor(), out.got())
	}
	// Resuming from the consumer's checkpoint replays the failed event.
	again := &sink{}
	three := uint64(3)
	s2 := NewSubscription(testStreamConfig(), l, &loopHints{}, &three, again.send)
	run(t, s2)
	waitFor(t, "the rest", func() bool { return len(again.got()) == 3 })
	if !slices.Equal(again.got(), []uint64{4, 5, 6}) {
		t.Fatalf("resumed with %v", again.got())
	}
}

// S14: subscriptions progress independently: one stuck consumer does not
// hold another subscription back.
func TestS14_SubscriptionsProgressIndependently(t *testing.T) {
	a, b := &memLog{}, &memLog{}
	a.add(3)
	b.add(3)
	stuck := &sink{gate: make(chan struct{})}
	free := &sink{}
	ha, hb := &loopHints{}, &loopHints{}
	run(t, NewSubscription(testStreamConfig(), a, ha, zero(), stuck.send))
	run(t, NewSubscription(testStreamConfig(), b, hb, zero(), free.send))
	waitFor(t, "b's events", func() bool { return len(free.got()) == 3 })
	b.add(2)
	hb.hint()
	waitFor(t, "b's new events", func() bool { return len(free.got()) == 5 })
	if !slices.Equal(free.got(), []uint64{1, 2, 3, 4, 5}) || len(stuck.got()) != 0 {
		t.Fatalf("free %v, stuck %v", free.got(), stuck.got())
	}
	close(stuck.gate)
	waitFor(t, "a's events once unstuck", func() bool { return len(stuck.got()) == 3 })
	if !slices.Equal(stuck.got(), []uint64{1, 2, 3}) {
		t.Fatalf("a got %v", stuck.got())
	}
}

// A drain that sent events flushes once, after its last batch; a drain
// that sent nothing does not flush; a failed flush ends the subscription
// as a failed send does.
func TestStreamFlushesOncePerDrain(t *testing.T) {
	l := &memLog{}
	l.add(10) // three batches of at most 4
	h := &loopHints{}
	out := &sink{}
	var mu sync.Mutex
	var flushedAt []int // events sent at each flush
	var failFlush atomic.Bool
	s := NewSubscription(testStreamConfig(), l, h, zero(), out.send)
	s.SetFlush(func() error {
		mu.Lock()
		flushedAt = append(flushedAt, len(out.got()))
		mu.Unlock()
		if failFlush.Load() {
			return errors.New("client gone")
		}
		return nil
	})
	flushes := func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(flushedAt)
	}
	_, done := run(t, s)
	waitFor(t, "the catch-up flushed", func() bool { return len(flushes()) == 1 })
	if got := flushes(); !slices.Equal(got, []int{10}) {
		t.Fatalf("flushes after %v events, want one after all 10", got)
	}
	reads := l.readCount()
	h.hint() // nothing new: a read, no flush
	waitFor(t, "the empty drain", func() bool { return l.readCount() > reads })
	time.Sleep(20 * time.Millisecond)
	if got := flushes(); len(got) != 1 {
		t.Fatalf("an empty drain flushed: %v", got)
	}
	failFlush.Store(true)
	l.add(1)
	h.hint()
	select {
	case err := <-done:
		if err == nil || err.Error() != "client gone" {
			t.Fatalf("subscription ended with %v, want the flush error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a failed flush did not end the subscription")
	}
}
