package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// The bare writer is the baseline of `host bench tails`: a process that
// does nothing but accept WebSocket clients and, on POST /publish, write one
// frame to every one of them. It speaks just enough of the node's socket
// protocol for the same watchers to use it: a connect at any
// /v1/objects/.../connect, a first message (the follow) answered with
// {"type":"followed"}, then event frames shaped like the node's
// ({"type":"event","seq":N,"time":NS,...}, padded to the length asked), so
// the watchers parse both the same way. The frame is encoded once per
// publish; GOMAXPROCS goroutines each write it to their share of the
// sockets (the loop the in-process raw ceiling runs); each socket has one
// reader goroutine, as in the node.
type bareWriter struct {
	mu    sync.Mutex // guards conns
	conns map[*websocket.Conn]struct{}
	pub   sync.Mutex // one publish at a time
	seq   int64
}

// ServeBare serves the bare writer on l until ctx ends.
func ServeBare(ctx context.Context, l net.Listener) error {
	bw := &bareWriter{conns: map[*websocket.Conn]struct{}{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /v1/objects/", bw.connect)
	mux.HandleFunc("POST /publish", bw.publish)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	err := srv.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func (bw *bareWriter) connect(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	ctx := context.Background()
	if _, _, err := c.Read(ctx); err != nil {
		return
	}
	// Registered before the answer: a client that has its "followed" may
	// be sent the next publish at once.
	bw.mu.Lock()
	bw.conns[c] = struct{}{}
	bw.mu.Unlock()
	defer func() {
		bw.mu.Lock()
		delete(bw.conns, c)
		bw.mu.Unlock()
	}()
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"followed"}`)); err != nil {
		return
	}
	for {
		if _, _, err := c.Read(ctx); err != nil {
			return
		}
	}
}

// publish writes one frame of ?len= bytes (at least the bare fields) to
// every socket, and answers once the writes have started.
func (bw *bareWriter) publish(w http.ResponseWriter, r *http.Request) {
	size, _ := strconv.Atoi(r.URL.Query().Get("len"))
	bw.pub.Lock()
	bw.seq++
	frame := bareFrame(bw.seq, time.Now().UnixNano(), size)
	bw.mu.Lock()
	conns := make([]*websocket.Conn, 0, len(bw.conns))
	for c := range bw.conns {
		conns = append(conns, c)
	}
	bw.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
	go func() {
		defer bw.pub.Unlock()
		workers := min(runtime.GOMAXPROCS(0), len(conns))
		var wg sync.WaitGroup
		for k := 0; k < workers; k++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := k; i < len(conns); i += workers {
					conns[i].Write(context.Background(), websocket.MessageText, frame)
				}
			}()
		}
		wg.Wait()
	}()
}

// bareFrame is an event frame the watchers parse like the node's, padded
// to size bytes when size is larger than the fields.
func bareFrame(seq, t int64, size int) []byte {
	f := fmt.Appendf(nil, `{"type":"event","seq":%d,"time":%d,"pad":"`, seq, t)
	for len(f)+2 < size {
		f = append(f, 'x')
	}
	return append(f, `"}`...)
}
