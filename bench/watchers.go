package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// watchers are WebSocket clients in this process, each following the
// publisher's "messages" topic through one node. Every reader parses the
// forward envelope's seq and time (the publisher's clock at publish, in
// ns: every process here shares the machine's clock) and, while measuring,
// keeps publish→socket latencies in its own slice.
type watchers struct {
	ws      []*websocket.Conn
	node    []int
	lat     [][]int64       // per watcher, ns; written only by its reader
	lastSeq []atomic.Uint64 // per watcher; written only by its reader

	measuring  atomic.Bool
	received   atomic.Int64 // event frames while measuring
	target     atomic.Int64
	reached    chan struct{}
	outOfOrder atomic.Int64
	notices    atomic.Int64 // non-event frames after the follow (behind, error)
	lastNotice atomic.Pointer[string]
	sample     atomic.Pointer[[]byte]
	wg         sync.WaitGroup
}

// dialWatchers opens w connections spread round-robin over urls and follows
// Publisher's "messages" topic on each.
func dialWatchers(ctx context.Context, urls []string, w int, progress Progress) (*watchers, error) {
	ws := &watchers{
		ws: make([]*websocket.Conn, w), node: make([]int, w),
		lat: make([][]int64, w), lastSeq: make([]atomic.Uint64, w),
		reached: make(chan struct{}, 1),
	}
	follow := []byte(`{"type":"follow","object":"` + Publisher + `","topic":"messages"}`)
	var next, done atomic.Int64
	errs := make(chan error, 64)
	var dialers sync.WaitGroup
	for d := 0; d < 32; d++ {
		dialers.Add(1)
		go func() {
			defer dialers.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= w {
					return
				}
				node := i % len(urls)
				url := "ws" + strings.TrimPrefix(urls[node], "http") + "/v1/objects/" + Publisher + "/connect"
				dctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				c, err := dialFollow(dctx, url, follow)
				cancel()
				if err != nil {
					errs <- fmt.Errorf("watcher %d on node %d: %w", i, node, err)
					return
				}
				ws.ws[i], ws.node[i] = c, node
				if n := int(done.Add(1)); progress != nil && (n%50 == 0 || n == w) {
					progress("watchers", n, w)
				}
			}
		}()
	}
	dialers.Wait()
	select {
	case err := <-errs:
		ws.close()
		return nil, err
	default:
	}
	for i := range ws.ws {
		ws.wg.Add(1)
		go ws.read(i)
	}
	return ws, nil
}

// dialRetries counts dials refused with 503 and retried (a node that does
// not see the uploaded program yet answers 503 for a while).
var (
	dialRetries     atomic.Int64
	lastDialRefusal atomic.Pointer[string]
)

func dialFollow(ctx context.Context, url string, follow []byte) (*websocket.Conn, error) {
	var c *websocket.Conn
	for attempt := 0; ; attempt++ {
		var resp *http.Response
		var err error
		c, resp, err = websocket.Dial(ctx, url, nil)
		if err == nil {
			break
		}
		if resp == nil || resp.StatusCode != http.StatusServiceUnavailable || attempt >= 50 {
			return nil, err
		}
		if attempt == 0 && resp.Body != nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			s := fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(b))
			lastDialRefusal.Store(&s)
		}
		dialRetries.Add(1)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(200 * time.Millisecond):
		}
	}
	c.SetReadLimit(1 << 20)
	if err := c.Write(ctx, websocket.MessageText, follow); err != nil {
		c.CloseNow()
		return nil, err
	}
	for {
		_, m, err := c.Read(ctx)
		if err != nil {
			c.CloseNow()
			return nil, err
		}
		if bytes.Contains(m, []byte(`"type":"error"`)) {
			c.CloseNow()
			return nil, fmt.Errorf("follow: %s", m)
		}
		if bytes.Contains(m, []byte(`"type":"followed"`)) {
			return c, nil
		}
	}
}

var (
	eventPrefix = []byte(`{"type":"event"`)
	seqKey      = []byte(`"seq":`)
	timeKey     = []byte(`"time":`)
)

// number parses the decimal integer after key in f.
func number(f, key []byte) (int64, bool) {
	i := bytes.Index(f, key)
	if i < 0 {
		return 0, false
	}
	var v int64
	ok := false
	for _, d := range f[i+len(key):] {
		if d < '0' || d > '9' {
			break
		}
		v, ok = v*10+int64(d-'0'), true
	}
	return v, ok
}

// readFrame reads one whole frame into buf (grown as needed) without
// allocating per frame, and returns it.
func readFrame(c *websocket.Conn, buf []byte) ([]byte, error) {
	_, r, err := c.Reader(context.Background())
	if err != nil {
		return nil, err
	}
	buf = buf[:cap(buf)]
	n := 0
	for {
		k, err := r.Read(buf[n:])
		n += k
		if err == io.EOF {
			return buf[:n], nil
		}
		if err != nil {
			return nil, err
		}
		if n == len(buf) {
			buf = append(buf, make([]byte, len(buf))...)
		}
	}
}

// read consumes frames into a reused buffer.
func (ws *watchers) read(i int) {
	defer ws.wg.Done()
	c := ws.ws[i]
	buf := make([]byte, 4096)
	for {
		f, err := readFrame(c, buf)
		if err != nil {
			return
		}
		buf = f[:cap(f)]
		now := time.Now().UnixNano()
		if !bytes.HasPrefix(f, eventPrefix) {
			ws.notices.Add(1)
			s := string(f)
			ws.lastNotice.Store(&s)
			continue
		}
		if ws.sample.Load() == nil {
			cp := bytes.Clone(f)
			ws.sample.CompareAndSwap(nil, &cp)
		}
		seq, _ := number(f, seqKey)
		if uint64(seq) <= ws.lastSeq[i].Load() {
			ws.outOfOrder.Add(1)
		}
		ws.lastSeq[i].Store(uint64(seq))
		if !ws.measuring.Load() {
			continue
		}
		if t, ok := number(f, timeKey); ok {
			ws.lat[i] = append(ws.lat[i], now-t)
		}
		if ws.received.Add(1) >= ws.target.Load() {
			select {
			case ws.reached <- struct{}{}:
			default:
			}
		}
	}
}

// waitFor waits until received reaches target or timeout passes.
func (ws *watchers) waitFor(ctx context.Context, target int64, timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for ws.received.Load() < target {
		select {
		case <-ws.reached:
		case <-t.C:
			return ws.received.Load() >= target
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// warmUp posts n messages one at a time (post gets 1..n) and waits until
// every watcher has each, at most timeout each; done hears each one.
func (ws *watchers) warmUp(n int, timeout time.Duration, post func(i int) error, done func(i int)) error {
	for i := 1; i <= n; i++ {
		before := seqMax(ws)
		if err := post(i); err != nil {
			return err
		}
		deadline := time.Now().Add(timeout)
		for !allPast(ws, before) {
			if time.Now().After(deadline) {
				return fmt.Errorf("warm-up message %d did not reach every watcher in %v (%d notices; last: %v)", i, timeout, ws.notices.Load(), deref(ws.lastNotice.Load()))
			}
			time.Sleep(time.Millisecond)
		}
		done(i)
	}
	return nil
}

// roundTrip posts one measured message and waits until every watcher has
// it (at most timeout): the time from before the post, and whether all got
// it.
func (ws *watchers) roundTrip(ctx context.Context, timeout time.Duration, post func() error) (time.Duration, bool, error) {
	base := ws.received.Load()
	target := base + int64(len(ws.ws))
	ws.target.Store(target)
	t0 := time.Now()
	if err := post(); err != nil {
		return 0, false, err
	}
	ok := ws.waitFor(ctx, target, timeout)
	return time.Since(t0), ok, nil
}

// close closes every socket and waits for the readers.
func (ws *watchers) close() {
	for _, c := range ws.ws {
		if c != nil {
			c.CloseNow()
		}
	}
	ws.wg.Wait()
}

// churn is watchers joining and leaving while the messages go out: every
// tick it dials the due number of new ones (round-robin over the nodes,
// following the same topic, their frames read and dropped; up to
// churnDials at once, so a slow dial does not hold back the rate) and
// closes as many of the oldest once a second's worth are open.
type churn struct {
	cancel context.CancelFunc
	done   chan struct{}
	start  time.Time
	took   time.Duration // set once stopped

	mu           sync.Mutex // guards open
	open         []*websocket.Conn
	joined, left atomic.Int64
}

const (
	// churnTick is how often churn acts.
	churnTick = 100 * time.Millisecond
	// churnDials bounds the dials in flight.
	churnDials = 32
)

func startChurn(ctx context.Context, urls []string, rate float64, watchers int) *churn {
	ctx, cancel := context.WithCancel(ctx)
	ch := &churn{cancel: cancel, done: make(chan struct{}), start: time.Now()}
	if rate <= 0 {
		close(ch.done)
		return ch
	}
	perSec := rate * float64(watchers)
	keep := max(1, int(perSec))
	follow := []byte(`{"type":"follow","object":"` + Publisher + `","topic":"messages"}`)
	go func() {
		defer close(ch.done)
		var dials sync.WaitGroup
		defer func() {
			dials.Wait()
			for _, c := range ch.open {
				c.CloseNow()
			}
		}()
		slots := make(chan struct{}, churnDials)
		t := time.NewTicker(churnTick)
		defer t.Stop()
		owed, next := 0.0, 0
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			for owed += perSec * churnTick.Seconds(); owed >= 1; owed-- {
				select {
				case slots <- struct{}{}:
				default:
					continue // as many dials in flight as allowed: this one is skipped
				}
				url := "ws" + strings.TrimPrefix(urls[next%len(urls)], "http") + "/v1/objects/" + Publisher + "/connect"
				next++
				dials.Go(func() {
					defer func() { <-slots }()
					if c, err := dialFollow(ctx, url, follow); err == nil {
						go discard(c)
						ch.joined.Add(1)
						ch.add(c, keep)
					}
				})
			}
		}
	}()
	return ch
}

// add keeps c open and closes the oldest beyond keep.
func (ch *churn) add(c *websocket.Conn, keep int) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.open = append(ch.open, c)
	for len(ch.open) > keep {
		ch.open[0].CloseNow()
		ch.open = ch.open[1:]
		ch.left.Add(1)
	}
}

// discard reads a churning watcher's frames until it closes.
func discard(c *websocket.Conn) {
	for {
		if _, _, err := c.Read(context.Background()); err != nil {
			return
		}
	}
}

// stop ends the churn (again: no-op) and reports how many joined and
// left, and for how long it ran.
func (ch *churn) stop() (joined, left int64, took time.Duration) {
	ch.cancel()
	<-ch.done
	if ch.took == 0 {
		ch.took = time.Since(ch.start)
	}
	return ch.joined.Load(), ch.left.Load(), ch.took
}
