package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// RawResult is the single-process WebSocket ceiling: the server side of W
// sockets written in a bare loop (one pre-encoded frame; one goroutine per
// CPU, each over its share; no method, no pump, no inbox, no NATS), read by
// W clients in the same process.
type RawResult struct {
	Sockets    int `json:"sockets"`
	Rounds     int `json:"rounds"`
	FrameBytes int `json:"frame_bytes"`
	// Round start → a client read the frame, over every (round, socket).
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
	// Round start → the last socket read it, per round.
	AllP50Ms     float64 `json:"all_p50_ms"`
	AllP99Ms     float64 `json:"all_p99_ms"`
	FramesPerSec float64 `json:"frames_per_s"`
	CPUPerRound  float64 `json:"cpu_s_per_round"`
}

// RunRaw measures the raw ceiling for sockets sockets over rounds rounds
// (closed loop, like the publishes: the next round starts when every
// socket has the frame).
func RunRaw(ctx context.Context, sockets, rounds int, frame []byte, progress Progress) (*RawResult, error) {
	if progress == nil {
		progress = func(string, int, int) {}
	}
	if err := RaiseNoFile(uint64(2*sockets + 512)); err != nil {
		return nil, err
	}
	if len(frame) == 0 {
		frame = []byte(`{"type":"event","publisher":"chat/room1","topic":"messages","seq":7,"time":1700000000000000000,"payload":{"author":"bench","text":"message 7","time":1700000000000000000}}`)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	serverConns := make(chan *websocket.Conn, sockets)
	stop := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		serverConns <- c
		<-stop
	})}
	go srv.Serve(ln)
	defer func() {
		close(stop)
		srv.Close()
	}()
	url := "ws://" + ln.Addr().String() + "/"

	clients := make([]*websocket.Conn, sockets)
	var next, done atomic.Int64
	errs := make(chan error, 32)
	var dialers sync.WaitGroup
	for d := 0; d < 32; d++ {
		dialers.Add(1)
		go func() {
			defer dialers.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= sockets {
					return
				}
				c, _, err := websocket.Dial(ctx, url, nil)
				if err != nil {
					errs <- err
					return
				}
				clients[i] = c
				if n := int(done.Add(1)); n%200 == 0 || n == sockets {
					progress("raw: sockets", n, sockets)
				}
			}
		}()
	}
	dialers.Wait()
	defer func() {
		for _, c := range clients {
			if c != nil {
				c.CloseNow()
			}
		}
	}()
	select {
	case err := <-errs:
		return nil, fmt.Errorf("raw: dial: %w", err)
	default:
	}
	server := make([]*websocket.Conn, 0, sockets)
	for len(server) < sockets {
		select {
		case c := <-serverConns:
			server = append(server, c)
		case <-time.After(30 * time.Second):
			return nil, errors.New("raw: server side of the sockets did not appear")
		}
	}
	defer func() {
		for _, c := range server {
			c.CloseNow()
		}
	}()

	var t0 atomic.Int64
	var measuring atomic.Bool
	var received atomic.Int64
	reached := make(chan struct{}, 1)
	var target atomic.Int64
	lat := make([][]int64, sockets)
	var readers sync.WaitGroup
	for i, c := range clients {
		readers.Add(1)
		go func() {
			defer readers.Done()
			buf := make([]byte, 4096)
			for {
				var err error
				if buf, err = readFrame(c, buf); err != nil {
					return
				}
				now := time.Now().UnixNano()
				if measuring.Load() {
					lat[i] = append(lat[i], now-t0.Load())
				}
				if received.Add(1) >= target.Load() {
					select {
					case reached <- struct{}{}:
					default:
					}
				}
			}
		}()
	}
	workers := min(runtime.GOMAXPROCS(0), sockets)
	write := func() error {
		var wg sync.WaitGroup
		errs := make([]error, workers)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < len(server); i += workers {
					if err := server[i].Write(context.Background(), websocket.MessageText, frame); err != nil {
						errs[w] = err
						return
					}
				}
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	round := func() (time.Duration, error) {
		tgt := received.Load() + int64(sockets)
		target.Store(tgt)
		start := time.Now()
		t0.Store(start.UnixNano())
		if err := write(); err != nil {
			return 0, err
		}
		deadline := time.After(60 * time.Second)
		for received.Load() < tgt {
			select {
			case <-reached:
			case <-deadline:
				return 0, fmt.Errorf("raw: %d of %d frames after 60s", received.Load()-tgt+int64(sockets), sockets)
			}
		}
		return time.Since(start), nil
	}
	for i := 0; i < 3; i++ {
		if _, err := round(); err != nil {
			return nil, err
		}
	}
	var ru0, ru1 rusage
	ru0.read()
	measuring.Store(true)
	all := make([]int64, 0, rounds)
	start := time.Now()
	for i := 0; i < rounds; i++ {
		d, err := round()
		if err != nil {
			return nil, err
		}
		all = append(all, d.Nanoseconds())
		progress("raw: rounds", i+1, rounds)
	}
	elapsed := time.Since(start)
	measuring.Store(false)
	ru1.read()
	for _, c := range clients {
		c.CloseNow()
	}
	readers.Wait()
	var flat []int64
	for _, l := range lat {
		flat = append(flat, l...)
	}
	return &RawResult{
		Sockets: sockets, Rounds: rounds, FrameBytes: len(frame),
		P50Ms: pctMs(flat, 0.50), P99Ms: pctMs(flat, 0.99), P999Ms: pctMs(flat, 0.999),
		AllP50Ms: pctMs(all, 0.50), AllP99Ms: pctMs(all, 0.99),
		FramesPerSec: float64(len(flat)) / elapsed.Seconds(),
		CPUPerRound:  (ru1.cpu() - ru0.cpu()) / float64(rounds),
	}, nil
}
