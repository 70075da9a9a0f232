package delivery

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/durable-host/host/abi"
)

// Streams are the catch-up subscription surface for external consumers
// (seed 003, a boundary is one publisher object). Storage is the truth:
// every event a subscription sends comes from a read of the publisher's
// log; NATS carries only empty hints that the log may have grown. A
// Subscription is one consumer's reader: it registers its hint listener
// before its first read, drains after its cursor on each hint, and pings
// itself when hints have been silent for the idle threshold, so a lost
// hint delays delivery but never loses it. There is no polling.

// StreamConfig sets a subscription's bounds and timings.
type StreamConfig struct {
	// Idle is the idle threshold: after this long without a hint the
	// subscription publishes one. Must be positive.
	Idle time.Duration
	// Batch and BatchBytes bound one read: at most Batch events, and no
	// more once BatchBytes of payload are in (at least one event).
	Batch      int
	BatchBytes int
	// RetryMin and RetryMax bound the backoff between failed attempts to
	// register the hint listener.
	RetryMin, RetryMax time.Duration
}

// DefaultStreamIdle is the default idle threshold.
const DefaultStreamIdle = 10 * time.Second

// DefaultStreamConfig returns the documented defaults.
func DefaultStreamConfig() StreamConfig {
	return StreamConfig{Idle: DefaultStreamIdle, Batch: 256, BatchBytes: 1 << 20,
		RetryMin: 100 * time.Millisecond, RetryMax: 5 * time.Second}
}

// Validate checks the configuration.
func (c StreamConfig) Validate() error {
	switch {
	case c.Idle <= 0:
		return errors.New("stream idle threshold must be positive")
	case c.Batch <= 0 || c.BatchBytes <= 0:
		return errors.New("stream batch bounds must be positive")
	case c.RetryMin <= 0 || c.RetryMax < c.RetryMin:
		return errors.New("stream retry backoff must be positive, min at most max")
	}
	return nil
}

// StreamReader reads the publisher's log for one subscription: its topic
// and filter are the reader's, so the storage side evaluates the whole
// query for old and new events alike.
type StreamReader interface {
	// After returns matching events with seq > after, ascending, at most
	// limit and stopping once maxBytes of payload are in.
	After(ctx context.Context, after uint64, limit, maxBytes int) ([]abi.Event, error)
	// Latest returns the latest stored matching event, if there is one.
	Latest(ctx context.Context) (abi.Event, bool, error)
}

// Hints is the notification transport of one publisher.
type Hints interface {
	// Listen registers f for the publisher's hints and returns once the
	// registration is flushed to the server.
	Listen(f func()) (stop func(), err error)
	// Ping publishes one empty hint.
	Ping() error
}

// ErrStreamOrder is returned when a read breaks the ascending order after
// the cursor; the subscription ends rather than deliver it.
var ErrStreamOrder = errors.New("stream read out of order")

// Subscription is one consumer's catch-up subscription.
type Subscription struct {
	cfg   StreamConfig
	r     StreamReader
	h     Hints
	send  func(*abi.Event) error
	flush func() error
	sleep func(context.Context, time.Duration) bool
	sent  bool // sent since the last flush

	cursor     atomic.Uint64
	positioned bool // the cursor is set: after was given, or the first drain ran

	// wake is the one pending wake-up: hints coalesce into it.
	wake chan struct{}

	hints, reads, pings atomic.Int64
}

// NewSubscription makes a subscription that sends each event with send.
// after is exclusive; nil means "the latest stored matching event, then
// newer ones".
func NewSubscription(cfg StreamConfig, r StreamReader, h Hints, after *uint64, send func(*abi.Event) error) *Subscription {
	s := &Subscription{cfg: cfg, r: r, h: h, send: send, sleep: sleepCtx, wake: make(chan struct{}, 1)}
	if after != nil {
		s.cursor.Store(*after)
		s.positioned = true
	}
	return s
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// SetFlush sets f to run once at the end of each drain that sent events:
// a transport that buffers writes pushes a whole catch-up at once instead
// of once per event. An error from f ends the subscription as a failed
// send does. Call it before Run.
func (s *Subscription) SetFlush(f func() error) { s.flush = f }

// Cursor is the seq of the last event sent (or the given after).
func (s *Subscription) Cursor() uint64 { return s.cursor.Load() }

// Stats reports the hints received, the storage reads made and the pings
// published so far.
func (s *Subscription) Stats() (hints, reads, pings int64) {
	return s.hints.Load(), s.reads.Load(), s.pings.Load()
}

// hint is the listener: it records one pending wake-up and returns.
func (s *Subscription) hint() {
	s.hints.Add(1)
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Reconnected publishes a hint after the transport reconnected: its
// receipt drains whatever was missed meanwhile.
func (s *Subscription) Reconnected() { s.ping() }

func (s *Subscription) ping() {
	s.pings.Add(1)
	_ = s.h.Ping() // a lost ping is the idle watchdog's to repeat
}

// Run delivers until ctx ends (returning its error), a read fails or
// breaks order, or a send fails (returning that error). The cursor then
// holds the last event sent: the consumer resumes after its own checkpoint.
func (s *Subscription) Run(ctx context.Context) error {
	var stop func()
	for delay := s.cfg.RetryMin; ; delay = min(2*delay, s.cfg.RetryMax) {
		var err error
		if stop, err = s.h.Listen(s.hint); err == nil {
			break
		}
		if !s.sleep(ctx, delay) {
			return ctx.Err()
		}
	}
	defer stop()
	// The startup hint: its receipt runs the first drain.
	s.ping()
	idle := time.NewTimer(s.cfg.Idle)
	defer idle.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.wake:
			idle.Reset(s.cfg.Idle)
			if err := s.drain(ctx); err != nil {
				return err
			}
		case <-idle.C:
			// Silence: ask for a hint. Publishing it reads nothing; its
			// receipt drains as any hint does.
			s.ping()
			idle.Reset(s.cfg.Idle)
		}
	}
}

// drain sends everything stored after the cursor, then flushes.
func (s *Subscription) drain(ctx context.Context) (err error) {
	defer func() {
		if s.sent && s.flush != nil {
			s.sent = false
			if ferr := s.flush(); err == nil {
				err = ferr
			}
		}
	}()
	if !s.positioned {
		s.reads.Add(1)
		e, ok, err := s.r.Latest(ctx)
		if err != nil {
			return fmt.Errorf("stream read: %w", err)
		}
		s.positioned = true
		if ok {
			if err := s.send(&e); err != nil {
				return err
			}
			s.sent = true
			s.cursor.Store(e.Seq)
		}
	}
	for {
		after := s.cursor.Load()
		s.reads.Add(1)
		evs, err := s.r.After(ctx, after, s.cfg.Batch, s.cfg.BatchBytes)
		if err != nil {
			return fmt.Errorf("stream read: %w", err)
		}
		if len(evs) == 0 {
			return nil
		}
		// The whole batch is checked before any of it goes out.
		prev := after
		size := 0
		for i := range evs {
			if evs[i].Seq <= prev {
				return fmt.Errorf("%w: seq %d after %d", ErrStreamOrder, evs[i].Seq, prev)
			}
			prev = evs[i].Seq
			size += len(evs[i].Payload)
		}
		for i := range evs {
			if err := s.send(&evs[i]); err != nil {
				return err
			}
			s.sent = true
			s.cursor.Store(evs[i].Seq)
		}
		if len(evs) < s.cfg.Batch && size < s.cfg.BatchBytes {
			return nil
		}
	}
}
