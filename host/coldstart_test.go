package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	host "github.com/durable-host/host/host"
	"github.com/durable-host/host/host/hosttest"
)

// TestColdStartHerd: a node restarted with programs stored takes a burst of
// concurrent first uses (calls to objects not yet active, WebSocket
// connects that follow) two restarts in a row. Every request is
// answered, and each module is compiled once per restart however many
// first uses wait for it: concurrent compiles of one module used to panic
// the node (closing a duplicate freed the code wazero shares between them)
// and cost a gigabyte per thousand connects.
func TestColdStartHerd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n, _ := hosttest.Start(t, hosttest.Options{DataDir: dir})
	for _, p := range []string{"counter", "counter-rust", "chat"} {
		upload(t, n, p, p)
	}
	shut(t, n)
	const goCalls, rustCalls, sockets, rooms = 20, 100, 100, 10
	for round := range 2 {
		// The herd's first uses queue for the Go guests' starts (one per
		// CPU at a time): on a loaded 2-core machine under -race a room's
		// tenth follow waited past the default handler budget's lock wait
		// (20 s). What this test checks is that every one is answered
		// and compiles happen once, not how fast: a longer budget.
		n, _ := hosttest.Start(t, hosttest.Options{DataDir: dir, Configure: func(c *host.Config) { c.VM.Budget = time.Minute }})
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, goCalls+rustCalls+sockets)
		for i := range goCalls + rustCalls {
			prog := "counter"
			if i >= goCalls {
				prog = "counter-rust"
			}
			wg.Go(func() {
				<-start
				obj := fmt.Sprintf("%s/r%d-%d", prog, round, i)
				resp, err := http.Post(n.URL()+"/v1/objects/"+obj+"/inc", "", nil)
				if err != nil {
					errs <- fmt.Errorf("%s inc: %v", obj, err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || string(b) != "1" {
					errs <- fmt.Errorf("%s inc: HTTP %d %q", obj, resp.StatusCode, b)
				}
			})
		}
		for i := range sockets {
			wg.Go(func() {
				<-start
				if err := coldFollow(n.URL(), fmt.Sprintf("chat/r%d-room%d", round, i%rooms)); err != nil {
					errs <- err
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		failed := 0
		for err := range errs {
			if failed++; failed <= 5 {
				t.Errorf("round %d: %v", round, err)
			}
		}
		if failed > 0 {
			t.Fatalf("round %d: %d of %d first requests failed", round, failed, goCalls+rustCalls+sockets)
		}
		c := client(n)
		if got := metric(t, c, "host_module_compiles_total"); got != 3 {
			t.Fatalf("round %d: %v module compiles for a burst of first uses of 3 modules, want 3 (one each)", round, got)
		}
		shut(t, n)
	}
}

// coldFollow connects a WebSocket to room, follows its messages and waits
// for the answer.
func coldFollow(base, room string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id, _ := host.ParseObjectID(room)
	url := "ws" + strings.TrimPrefix(base, "http") + "/v1/objects/" + id.Program + "/" + id.ID + "/connect"
	ws, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		return fmt.Errorf("connect %s: %v", room, err)
	}
	defer ws.CloseNow()
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"type":"follow","topic":"messages"}`)); err != nil {
		return fmt.Errorf("follow %s: %v", room, err)
	}
	for {
		_, b, err := ws.Read(ctx)
		if err != nil {
			return fmt.Errorf("follow %s: %v", room, err)
		}
		var f struct{ Type, Error string }
		json.Unmarshal(b, &f)
		switch f.Type {
		case "followed":
			return nil
		case "error":
			return fmt.Errorf("follow %s: %s", room, f.Error)
		}
	}
}

func shut(t *testing.T, n *host.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}

// A replaced version's code goes with the last object running it: the
// object active on v1 moves onto v2 (ahead of its next call) and v1's
// compiled module is closed; the object keeps its state and answers v2's
// methods.
func TestReplacedVersionsCodeGoesWithItsLastObject(t *testing.T) {
	hosttest.Heavy(t)
	t.Parallel()
	n, _ := hosttest.Start(t, hosttest.Options{})
	c := client(n)
	upload(t, n, "p", "counter")
	wantReply(t, n, "p/h1", "inc", nil, "1")
	upload(t, n, "p", "hostile") // v2: another module under the same name
	waitUntil(t, "v1's code closed once its object moved onto v2", 10*time.Second, func() bool {
		return metric(t, c, "host_modules_compiled") == 1
	})
	wantReply(t, n, "p/h1", "ok", nil, "ok") // v2's method, on the same object
	upload(t, n, "p", "counter")             // v3: v1's bytes again
	wantReply(t, n, "p/h1", "inc", nil, "2") // its state was kept throughout
	waitUntil(t, "v2's code closed", 10*time.Second, func() bool { return metric(t, c, "host_modules_compiled") == 1 })
}

// An activation takes an instance made ahead when there is one, and an
// instance never serves two objects: what one object left in its
// instance's memory another object of the program never sees, also when
// the first was deactivated before the second started.
func TestPooledInstanceIsFresh(t *testing.T) {
	t.Parallel()
	n, c := hosttest.Start(t, hosttest.Options{Programs: []string{"hostile"}, Configure: func(cfg *host.Config) {
		cfg.MaxActiveObjects = 1 // each activation deactivates the one before
	}})
	ctx := context.Background()
	a, b := host.ObjectID{Program: "hostile", ID: "a"}, host.ObjectID{Program: "hostile", ID: "b"}
	if _, err := n.Call(ctx, a, "remember", []byte("secret of a")); err != nil {
		t.Fatal(err)
	}
	if v, err := n.Call(ctx, a, "recall", nil); err != nil || string(v) != "secret of a" {
		t.Fatalf("a recalls %q (%v): the instance's memory does not hold what it was given", v, err)
	}
	pooled := `host_activations_total{instance="pooled"}`
	before := metric(t, c, pooled)
	for i, id := range []host.ObjectID{b, a, b} {
		waitUntil(t, "an instance made ahead", 30*time.Second, func() bool { return host.PooledInstances(n) > 0 })
		v, err := n.Call(ctx, id, "recall", nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(v) != 0 {
			t.Fatalf("activation %d of %s recalls %q: it ran in an instance another object used", i, id, v)
		}
		if _, err := n.Call(ctx, id, "remember", fmt.Appendf(nil, "secret of activation %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := metric(t, c, pooled) - before; got != 3 {
		t.Fatalf("%v of 3 activations took an instance made ahead", got)
	}
}
