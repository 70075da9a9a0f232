package host

import (
	"sync"

	"github.com/durable-host/host/delivery"
)

// inboxSmall is how many items an inbox holds without an allocation of its
// own: a socket keeps up with one event at a time, so its queue rarely
// holds more.
const inboxSmall = 4

// inbox is a connection's bounded FIFO of items, grown as it fills and
// shrunk back when its writer goes idle. A buffered channel of the
// default 256 slots held 2 KB per connection whether or not anything was
// queued; an idle inbox holds inboxSmall pointers inside the connection.
// Offers and takes are under a mutex, as a channel's are under its lock.
type inbox struct {
	mu    sync.Mutex
	small [inboxSmall]*delivery.Item
	buf   []*delivery.Item // a ring: small[:] or a larger array while busy
	head  int
	n     int
	max   int
}

// push appends it, or reports false when max items are queued.
func (q *inbox) push(it *delivery.Item) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n >= q.max {
		return false
	}
	if q.buf == nil {
		q.buf = q.small[:]
	}
	if q.n == len(q.buf) {
		grown := make([]*delivery.Item, min(2*len(q.buf), q.max))
		for i := range q.n {
			grown[i] = q.buf[(q.head+i)%len(q.buf)]
			q.buf[(q.head+i)%len(q.buf)] = nil
		}
		q.buf, q.head = grown, 0
	}
	q.buf[(q.head+q.n)%len(q.buf)] = it
	q.n++
	return true
}

// pop takes the oldest item, or nil when the inbox is empty.
func (q *inbox) pop() *delivery.Item {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == 0 {
		return nil
	}
	it := q.buf[q.head]
	q.buf[q.head] = nil
	q.head = (q.head + 1) % len(q.buf)
	q.n--
	return it
}

// len is how many items are queued.
func (q *inbox) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// shrink gives a grown array back once the inbox is empty: called by the
// writer as it goes idle, so a burst's array is kept for the burst only.
func (q *inbox) shrink() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == 0 && len(q.buf) > inboxSmall {
		q.buf, q.head = q.small[:], 0
	}
}
