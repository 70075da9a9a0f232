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
// connects that follow) three restarts in a row. Every request is
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
	for round := range 3 {
		n, _ := hosttest.Start(t, hosttest.Options{DataDir: dir})
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

// A new version's upload does not take the old version's code from the
// objects still running it: an active object on v1 can drop a trapped
// instance and make a fresh one from v1 after v2 is current, and v1's code
// is closed once its last object is deactivated.
func TestReplacedVersionKeepsItsCodeUntilItsLastObject(t *testing.T) {
	t.Parallel()
	n, _ := hosttest.Start(t, hosttest.Options{Configure: func(c *host.Config) { c.MaxActiveObjects = 1 }})
	c := client(n)
	upload(t, n, "p", "hostile")
	wantReply(t, n, "p/h1", "ok", nil, "ok")
	upload(t, n, "p", "counter") // v2: another module under the same name
	if got := metric(t, c, "host_modules_compiled"); got != 2 {
		t.Fatalf("%v modules compiled after v2's upload with an object on v1, want 2", got)
	}
	// Still v1 (its next activation picks v2): a trap drops the instance,
	// and the next call instantiates v1's code again.
	if r := call(t, n, "p/h1", "trap", nil); r.status == http.StatusOK {
		t.Fatalf("trap answered %d %s", r.status, r.body)
	}
	wantReply(t, n, "p/h1", "ok", nil, "ok")
	wantReply(t, n, "p/other", "inc", nil, "1") // on v2; h1 is evicted
	if got := metric(t, c, "host_modules_compiled"); got != 1 {
		t.Fatalf("%v modules compiled after v1's last object was deactivated, want 1", got)
	}
	wantReply(t, n, "p/h1", "inc", nil, "1") // reactivated on v2
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
