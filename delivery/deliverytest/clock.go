// Package deliverytest is for tests of what runs on a delivery.Clock:
// Clock, a clock that moves only when the test says. It imports nothing
// of the module's but delivery's Clock interface.
package deliverytest

import (
	"sort"
	"sync"
	"time"

	"github.com/durable-host/host/delivery"
)

// Clock is a clock that moves only when the test says (Advance): a pump's
// retries, or a node's (delivery.Config.Clock: what its handlers read as
// the time, and what alarms and delivery retries are scheduled by).
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	waiting []*clockTimer
}

type clockTimer struct {
	at      time.Time
	f       func()
	stopped bool
}

var _ delivery.Clock = (*Clock)(nil)

// NewClock returns a clock at start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc calls f once the clock has been advanced by d.
func (c *Clock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &clockTimer{at: c.now.Add(d), f: f}
	c.waiting = append(c.waiting, t)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		was := !t.stopped
		t.stopped = true
		return was
	}
}

// Advance moves the clock by d and calls, in time order and on the
// caller's goroutine, every function whose time has come.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due, rest []*clockTimer
	for _, t := range c.waiting {
		switch {
		case t.stopped:
		case t.at.After(c.now):
			rest = append(rest, t)
		default:
			t.stopped = true
			due = append(due, t)
		}
	}
	c.waiting = rest
	c.mu.Unlock()
	sort.SliceStable(due, func(i, j int) bool { return due[i].at.Before(due[j].at) })
	for _, t := range due {
		t.f()
	}
}
