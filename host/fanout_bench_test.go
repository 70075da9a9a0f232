package host_test

// Benchmarks of event delivery on one node (issue 3, "Benchmarks"). They run
// only with -bench, e.g.
//
//	go test ./host/ -run '^$' -bench Fanout -benchtime 200x -timeout 20m
//
// Clients are real github.com/coder/websocket clients in this process, on
// loopback. Allocation figures are process-wide runtime.MemStats.Mallocs
// deltas over the timed loop: they include the server (method call, pump,
// slice, inbox, socket write), the clients' reads and anything else running
// in the process; the raw ceiling shares the client side, so the difference
// between the two is the delivery path's own cost.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/durable-host/host/host"
	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/hosttest"
)

var (
	fbPublisher = host.ObjectID{Program: "chat", ID: "room1"}
	fbPayload   = []byte(`{"author":"ann","text":"hello, fan-out"}`)
)

// fbRaiseNoFile lifts RLIMIT_NOFILE to its hard limit and fails the
// benchmark when that is still short of need descriptors.
func fbRaiseNoFile(b *testing.B, need uint64) {
	b.Helper()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		b.Fatalf("getrlimit: %v", err)
	}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			b.Logf("setrlimit: %v", err)
		}
		syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl)
	}
	if rl.Cur < need {
		b.Skipf("open file limit %d < %d needed (client and server sockets in one process); raise ulimit -n", rl.Cur, need)
	}
}

// fbWaitIdle waits (untimed work, but inside the loop) until the
// publisher's pump has finished its round, cursor updates included.
func fbWaitIdle(b *testing.B, n *host.Node, id host.ObjectID) {
	deadline := time.Now().Add(30 * time.Second)
	for host.FbPumpBusy(n, id) {
		if time.Now().After(deadline) {
			b.Fatal("pump still busy after 30s")
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// fbClients are WebSocket clients following one topic; each reader counts
// event frames down to zero and the last one stamps the time.
type fbClients struct {
	conns     []*websocket.Conn
	remaining atomic.Int64
	want      atomic.Uint64 // expected seq, 0 = any
	capture   atomic.Bool   // keep a copy of the next event frame in last
	last      atomic.Pointer[[]byte]
	wrong     atomic.Int64
	done      chan time.Time
	wg        sync.WaitGroup
}

func fbDial(b *testing.B, c *hclient.Client, sockets int) *fbClients {
	b.Helper()
	url := "ws" + c.Base[len("http"):] + "/v1/objects/chat/lobby/connect"
	follow := []byte(`{"type":"follow","object":"chat/room1","topic":"messages"}`)
	cl := &fbClients{conns: make([]*websocket.Conn, sockets), done: make(chan time.Time, 1)}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var next atomic.Int64
	errs := make(chan error, 32)
	var wg sync.WaitGroup
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= sockets {
					return
				}
				ws, _, err := websocket.Dial(ctx, url, nil)
				if err != nil {
					errs <- fmt.Errorf("dial %d: %w", i, err)
					return
				}
				cl.conns[i] = ws
				if err := ws.Write(ctx, websocket.MessageText, follow); err != nil {
					errs <- err
					return
				}
				for {
					_, m, err := ws.Read(ctx)
					if err != nil {
						errs <- fmt.Errorf("follow %d: %w", i, err)
						return
					}
					if bytes.Contains(m, []byte(`"type":"error"`)) {
						errs <- fmt.Errorf("follow %d: %s", i, m)
						return
					}
					if bytes.Contains(m, []byte(`"type":"followed"`)) {
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	b.Cleanup(func() {
		for _, ws := range cl.conns {
			if ws != nil {
				ws.CloseNow()
			}
		}
		cl.wg.Wait()
	})
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	for _, ws := range cl.conns {
		cl.wg.Add(1)
		go cl.read(ws)
	}
	return cl
}

var fbSeqKey = []byte(`"seq":`)

// read consumes frames into a reused buffer (the client allocates as little
// as the library lets it).
func (cl *fbClients) read(ws *websocket.Conn) {
	defer cl.wg.Done()
	buf := make([]byte, 4096)
	for {
		_, r, err := ws.Reader(context.Background())
		if err != nil {
			return
		}
		n := 0
		for {
			k, err := r.Read(buf[n:])
			n += k
			if err == io.EOF {
				break
			}
			if err != nil {
				return
			}
			if n == len(buf) {
				buf = append(buf, make([]byte, len(buf))...)
			}
		}
		f := buf[:n]
		if !bytes.HasPrefix(f, []byte(`{"type":"event"`)) {
			continue
		}
		if cl.capture.Load() {
			cp := bytes.Clone(f)
			cl.last.Store(&cp)
		}
		if want := cl.want.Load(); want != 0 {
			var seq uint64
			if i := bytes.Index(f, fbSeqKey); i >= 0 {
				for _, d := range f[i+len(fbSeqKey):] {
					if d < '0' || d > '9' {
						break
					}
					seq = seq*10 + uint64(d-'0')
				}
			}
			if seq != want {
				cl.wrong.Add(1)
			}
		}
		if cl.remaining.Add(-1) == 0 {
			cl.done <- time.Now()
		}
	}
}

// arm expects one frame on every socket.
func (cl *fbClients) arm(seq uint64) {
	cl.want.Store(seq)
	cl.remaining.Store(int64(len(cl.conns)))
}

func (cl *fbClients) wait(b *testing.B) time.Time {
	select {
	case t := <-cl.done:
		return t
	case <-time.After(60 * time.Second):
		b.Fatalf("%d of %d sockets still waiting after 60s", cl.remaining.Load(), len(cl.conns))
		return time.Time{}
	}
}

// fbReport reports latency percentiles (ns) and the per-unit rates and
// allocations of one timed loop.
func fbReport(b *testing.B, lat []time.Duration, elapsed time.Duration, m0, m1 *runtime.MemStats, units int, unit string) {
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))]) }
	b.ReportMetric(pct(0.50), "p50-ns")
	b.ReportMetric(pct(0.99), "p99-ns")
	total := float64(b.N) * float64(units)
	b.ReportMetric(total/elapsed.Seconds(), unit+"/s")
	b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)/total, "allocs/"+unit)
	b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/total, "B/"+unit)
}

// fbProfile, when FB_PROFILE_DIR is set, profiles one timed loop: a CPU
// profile of the loop and heap profiles before and after it (diff them with
// go tool pprof -sample_index=alloc_objects -base NAME.heap0 NAME.heap1).
// It returns the function that ends the profile.
func fbProfile(b *testing.B, name string) func() {
	dir := os.Getenv("FB_PROFILE_DIR")
	if dir == "" {
		return func() {}
	}
	heap := func(suffix string) {
		f, err := os.Create(filepath.Join(dir, name+suffix))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		runtime.GC() // the allocs profile is as of the last GC
		pprof.Lookup("allocs").WriteTo(f, 0)
	}
	heap(".heap0")
	f, err := os.Create(filepath.Join(dir, name+".cpu"))
	if err != nil {
		b.Fatal(err)
	}
	pprof.StartCPUProfile(f)
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		heap(".heap1")
	}
}

// fbRaw holds the raw ceiling of the last run per socket count.
var fbRaw = map[int]float64{}

// BenchmarkFanoutSockets: publish → every socket has the event, for 1, 100
// and 5,000 WebSocket clients following chat/room1's "messages" topic; and,
// on the same sockets, the raw ceiling: a bare server-side loop writing the
// same pre-encoded envelope to every socket (no method, no pump, no inbox).
func BenchmarkFanoutSockets(b *testing.B) {
	for _, sockets := range []int{1, 100, 5000} {
		b.Run(fmt.Sprintf("sockets=%d", sockets), func(b *testing.B) {
			fbRaiseNoFile(b, uint64(2*sockets+512))
			n, c := hosttest.Start(b, hosttest.Options{Programs: []string{"chat"}})
			ctx := context.Background()
			if _, err := n.Call(ctx, fbPublisher, "post", fbPayload); err != nil {
				b.Fatal(err)
			}
			cl := fbDial(b, c, sockets)
			server := host.FbServerSockets(n)
			if len(server) != sockets {
				b.Fatalf("node holds %d sockets, want %d", len(server), sockets)
			}
			seq := uint64(1)
			publish := func() {
				seq++
				cl.arm(seq)
				if _, err := n.Call(ctx, fbPublisher, "post", fbPayload); err != nil {
					b.Fatal(err)
				}
			}
			// Warm up the pump, the slice and every socket, and keep the
			// last envelope: the raw ceiling writes that very frame.
			cl.capture.Store(true)
			for i := 0; i < 3; i++ {
				publish()
				cl.wait(b)
				fbWaitIdle(b, n, fbPublisher)
			}
			cl.capture.Store(false)
			frame := *cl.last.Load()

			// The raw ceiling: one goroutine per CPU, each writing the frame
			// to its share of the sockets in a bare loop.
			workers := min(runtime.GOMAXPROCS(0), len(server))
			write := func(b *testing.B) {
				var wg sync.WaitGroup
				for w := 0; w < workers; w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := w; i < len(server); i += workers {
							if err := server[i].Write(ctx, websocket.MessageText, frame); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
			}

			b.Run("raw", func(b *testing.B) {
				lat := make([]time.Duration, 0, b.N)
				b.ReportAllocs()
				var m0, m1 runtime.MemStats
				stop := fbProfile(b, fmt.Sprintf("sockets%d-raw", sockets))
				runtime.ReadMemStats(&m0)
				b.ResetTimer()
				start := time.Now()
				for i := 0; i < b.N; i++ {
					cl.arm(0)
					t0 := time.Now()
					write(b)
					lat = append(lat, cl.wait(b).Sub(t0))
				}
				elapsed := time.Since(start)
				b.StopTimer()
				runtime.ReadMemStats(&m1)
				stop()
				fbReport(b, lat, elapsed, &m0, &m1, sockets, "frames")
				fbRaw[sockets] = float64(b.N*sockets) / elapsed.Seconds()
			})

			b.Run("publish", func(b *testing.B) {
				lat := make([]time.Duration, 0, b.N)
				b.ReportAllocs()
				var m0, m1 runtime.MemStats
				stop := fbProfile(b, fmt.Sprintf("sockets%d-publish", sockets))
				runtime.ReadMemStats(&m0)
				b.ResetTimer()
				start := time.Now()
				for i := 0; i < b.N; i++ {
					t0 := time.Now()
					publish()
					lat = append(lat, cl.wait(b).Sub(t0))
					// The next publish starts on a quiet publisher: its
					// round (cursor updates included) is part of ns/op and
					// of the rate, not of the next event's latency.
					fbWaitIdle(b, n, fbPublisher)
				}
				elapsed := time.Since(start)
				b.StopTimer()
				runtime.ReadMemStats(&m1)
				stop()
				if w := cl.wrong.Load(); w != 0 {
					b.Fatalf("%d frames carried an unexpected seq", w)
				}
				fbReport(b, lat, elapsed, &m0, &m1, sockets, "deliveries")
				if raw := fbRaw[sockets]; raw > 0 {
					b.ReportMetric(100*float64(b.N*sockets)/elapsed.Seconds()/raw, "%-of-raw")
				}
			})

			// paired alternates one raw frame and one publish per
			// iteration, so both meet the same machine: on a shared
			// 2-core box the raw and publish loops, run a few seconds
			// apart, drift by 20% or more between runs. %-of-raw here is
			// the raw loop's total time over the publish loop's (a
			// publish counted until its round is done, as above); the
			// p50 is the median of the per-iteration ratios.
			b.Run("paired", func(b *testing.B) {
				var rawSum, pubSum time.Duration
				ratios := make([]float64, 0, b.N)
				for i := 0; i < b.N; i++ {
					cl.arm(0)
					t0 := time.Now()
					write(b)
					cl.wait(b)
					raw := time.Since(t0)

					t0 = time.Now()
					publish()
					cl.wait(b)
					fbWaitIdle(b, n, fbPublisher)
					pub := time.Since(t0)

					rawSum += raw
					pubSum += pub
					ratios = append(ratios, 100*raw.Seconds()/pub.Seconds())
				}
				if w := cl.wrong.Load(); w != 0 {
					b.Fatalf("%d frames carried an unexpected seq", w)
				}
				slices.Sort(ratios)
				b.ReportMetric(100*rawSum.Seconds()/pubSum.Seconds(), "%-of-raw")
				b.ReportMetric(ratios[len(ratios)/2], "p50-%-of-raw")
				b.ReportMetric(float64(rawSum.Nanoseconds())/float64(b.N), "raw-ns")
				b.ReportMetric(float64(pubSum.Nanoseconds())/float64(b.N), "publish-ns")
			})
		})
	}
}

// BenchmarkFanoutObjects: publish → every object follower's receive has
// committed (tally objects following chat/room1's "messages" topic), with 1
// and 50 followers.
func BenchmarkFanoutObjects(b *testing.B) {
	for _, followers := range []int{1, 50} {
		b.Run(fmt.Sprintf("followers=%d", followers), func(b *testing.B) {
			n, _ := hosttest.Start(b, hosttest.Options{Programs: []string{"chat", "tally"}})
			ctx := context.Background()
			if _, err := n.Call(ctx, fbPublisher, "post", fbPayload); err != nil {
				b.Fatal(err)
			}
			for i := 0; i < followers; i++ {
				id := host.ObjectID{Program: "tally", ID: fmt.Sprintf("f%d", i)}
				if _, err := n.Call(ctx, id, "follow", []byte(`{"publisher":"chat/room1","topic":"messages"}`)); err != nil {
					b.Fatal(err)
				}
			}
			// waitCommits waits until want receives have committed and
			// returns when the last one was seen.
			waitCommits := func(want float64) time.Time {
				deadline := time.Now().Add(60 * time.Second)
				for {
					if host.FbReceiveCommits(n) >= want {
						return time.Now()
					}
					if time.Now().After(deadline) {
						b.Fatalf("%v of %v receives committed after 60s", host.FbReceiveCommits(n), want)
					}
					time.Sleep(20 * time.Microsecond)
				}
			}
			post := func() float64 {
				want := host.FbReceiveCommits(n) + float64(followers)
				if _, err := n.Call(ctx, fbPublisher, "post", fbPayload); err != nil {
					b.Fatal(err)
				}
				return want
			}
			for i := 0; i < 3; i++ {
				waitCommits(post())
				fbWaitIdle(b, n, fbPublisher)
			}
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			var m0, m1 runtime.MemStats
			stop := fbProfile(b, fmt.Sprintf("objects%d", followers))
			runtime.ReadMemStats(&m0)
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				lat = append(lat, waitCommits(post()).Sub(t0))
				fbWaitIdle(b, n, fbPublisher)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			runtime.ReadMemStats(&m1)
			stop()
			fbReport(b, lat, elapsed, &m0, &m1, followers, "receives")
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
		})
	}
}
