package host_test

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/durable-host/host/delivery"
	"github.com/durable-host/host/host"
	"github.com/durable-host/host/host/hosttest"
	"github.com/durable-host/host/store"
)

// sseReader reads a stream's server-sent events over real HTTP and keeps
// the last event id it saw.
type sseReader struct {
	last   atomic.Uint64
	events atomic.Int64
	cancel context.CancelFunc
	done   chan struct{}
}

func openSSE(b *testing.B, base, object, query string) *sseReader {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/objects/"+object+"/stream?"+query, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		cancel()
		b.Fatalf("stream: %s", resp.Status)
	}
	r := &sseReader{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		defer resp.Body.Close()
		br := bufio.NewReaderSize(resp.Body, 64<<10)
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return
			}
			if id, ok := bytes.CutPrefix(line, []byte("id: ")); ok {
				seq, _ := strconv.ParseUint(string(bytes.TrimSpace(id)), 10, 64)
				r.events.Add(1)
				r.last.Store(seq)
			}
		}
	}()
	return r
}

func (r *sseReader) close() { r.cancel(); <-r.done }

func (r *sseReader) waitSeq(b *testing.B, seq uint64) time.Time { return waitLast(b, &r.last, seq) }

// waitLast spins until last reaches seq and returns when it did.
func waitLast(b *testing.B, last *atomic.Uint64, seq uint64) time.Time {
	deadline := time.Now().Add(30 * time.Second)
	for last.Load() < seq {
		if time.Now().After(deadline) {
			b.Fatalf("reader at seq %d, want %d", last.Load(), seq)
		}
		runtime.Gosched()
	}
	return time.Now()
}

// measureLive times post → arrive (arrive returns when the posted event
// is in) b.N times and reports p50 and p99.
func measureLive(b *testing.B, post func(), arrive func() time.Time) {
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		post()
		lat = append(lat, arrive().Sub(t0))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2]), "p50-ns")
	b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)]), "p99-ns")
}

// BenchmarkStream measures streams (seed 003) through the HTTP surface.
//
//   - live/sse: publish one event (chat post) → a stream subscriber has it;
//     live/websocket: the same publish → a WebSocket watcher has it (the
//     forward-envelope path, the baseline in the same run).
//   - catchup/sse: open a stream at after=0 over 10,000 stored events and
//     read to the last; catchup/read: the same reads straight from the
//     object's file (store.Read in batches of the stream's size),
//     the baseline without HTTP.
func BenchmarkStream(b *testing.B) {
	n, c := hosttest.Start(b, hosttest.Options{Programs: []string{"chat"}})
	ctx := context.Background()
	obj := host.ObjectID{Program: "chat", ID: "streamed"}
	var seq uint64
	post := func() {
		if _, err := n.Call(ctx, obj, "post", fbPayload); err != nil {
			b.Fatal(err)
		}
		seq++
	}
	post()
	fbWaitIdle(b, n, obj)

	b.Run("live/sse", func(b *testing.B) {
		r := openSSE(b, c.Base, "chat/streamed", "after="+strconv.FormatUint(seq, 10))
		defer r.close()
		post()
		r.waitSeq(b, seq)
		measureLive(b, post, func() time.Time { return r.waitSeq(b, seq) })
	})

	b.Run("live/websocket", func(b *testing.B) {
		url := "ws" + c.Base[len("http"):] + "/v1/objects/chat/lobby/connect"
		ws, _, err := websocket.Dial(ctx, url, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer ws.CloseNow()
		if err := ws.Write(ctx, websocket.MessageText, []byte(`{"type":"follow","object":"chat/streamed","topic":"messages"}`)); err != nil {
			b.Fatal(err)
		}
		var last atomic.Uint64
		go func() {
			seqKey := []byte(`"seq":`)
			for {
				_, m, err := ws.Read(ctx)
				if err != nil {
					return
				}
				if _, rest, ok := bytes.Cut(m, seqKey); ok {
					end := bytes.IndexByte(rest, ',')
					if v, err := strconv.ParseUint(string(rest[:max(end, 0)]), 10, 64); err == nil {
						last.Store(v)
					}
				}
			}
		}()
		wait := func() time.Time { return waitLast(b, &last, seq) }
		// The follow lands asynchronously: publish until one arrives.
		for deadline := time.Now().Add(30 * time.Second); last.Load() == 0; {
			post()
			time.Sleep(10 * time.Millisecond)
			if time.Now().After(deadline) {
				b.Fatal("the watcher never got an event")
			}
		}
		wait()
		measureLive(b, post, wait)
	})

	const stored = 10000
	for seq < stored {
		post()
	}
	fbWaitIdle(b, n, obj)

	b.Run("catchup/sse", func(b *testing.B) {
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			r := openSSE(b, c.Base, "chat/streamed", "after=0")
			r.waitSeq(b, stored)
			r.close()
			if got := r.events.Load(); got < stored {
				b.Fatalf("read %d events, want %d", got, stored)
			}
		}
		b.ReportMetric(float64(b.N*stored)/b.Elapsed().Seconds(), "events/s")
	})

	b.Run("catchup/read", func(b *testing.B) {
		path := filepath.Join(n.DataDir(), "objects", "chat", "streamed.db")
		cfg := delivery.DefaultStreamConfig()
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			var after uint64
			for after < stored {
				evs, err := store.Read(ctx, path, store.Query{After: after, Limit: cfg.Batch, MaxBytes: cfg.BatchBytes})
				if err != nil {
					b.Fatal(err)
				}
				if len(evs) == 0 {
					b.Fatalf("no events after %d", after)
				}
				after = evs[len(evs)-1].Seq
			}
		}
		b.ReportMetric(float64(b.N*stored)/b.Elapsed().Seconds(), "events/s")
	})
}
