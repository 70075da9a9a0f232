package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/durable-host/host/host"
	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/hosttest"
	"github.com/durable-host/host/vm/vmtest"
)

// The leases of the replica process tests: short, so a takeover happens
// soon, but longer than a JetStream leader election (4-9 s after the
// leader is missed): the home may have led the lease bucket, and the
// survivors' leases must outlast the election. A paused leader is missed
// later than a killed one (its connections stay up), so the pause test's
// lease is longer.
const (
	replicaTTL = 12 * time.Second
	pausedTTL  = 20 * time.Second
)

// replicaCluster is three `host serve` processes with copies on (the
// default for three nodes), each restartable on its data directory.
type replicaCluster struct {
	t       *testing.T
	bin     string
	ttl     time.Duration
	addrs   []string
	routes  []string
	data    []string
	servers []*server
	cs      []*hclient.Client
	// flags are more `host serve` flags for every node.
	flags []string
	// past holds the logs of each node's earlier processes (killed or
	// stopped, then restarted), printed with the live ones on a failure.
	past [][]string
}

func startReplicaCluster(t *testing.T, ttl time.Duration, flags ...string) *replicaCluster {
	t.Helper()
	rc := &replicaCluster{t: t, bin: hostBinary(t), ttl: ttl, flags: flags}
	t.Cleanup(func() {
		if t.Failed() {
			for i, s := range rc.servers {
				for k, out := range rc.past[i] {
					t.Logf("node %d, process %d (ended):\n%s", i, k, out)
				}
				if s != nil {
					if !s.waited && os.Getenv("HOST_TEST_STACKS") != "" {
						// A paused node takes no signal but SIGKILL
						// until it is continued.
						s.cmd.Process.Signal(syscall.SIGCONT)
						s.cmd.Process.Signal(syscall.SIGQUIT)
						<-s.done
						s.waited = true
					}
					t.Logf("node %d:\n%s", i, s.out)
				}
			}
		}
	})
	for range 3 {
		rc.addrs = append(rc.addrs, freePort(t))
		rc.routes = append(rc.routes, freePort(t))
		rc.data = append(rc.data, t.TempDir())
	}
	rc.servers = make([]*server, 3)
	rc.past = make([][]string, 3)
	for i := range 3 {
		rc.start(i)
		rc.cs = append(rc.cs, &hclient.Client{Base: "http://" + rc.addrs[i]})
	}
	for i := range 3 {
		waitHealthy(t, rc.addrs[i], rc.servers[i])
	}
	rc.waitNodes(3)
	return rc
}

func (rc *replicaCluster) start(i int) {
	if s := rc.servers[i]; s != nil {
		rc.past[i] = append(rc.past[i], s.out.String())
	}
	var peers []string
	for j, r := range rc.routes {
		if j != i {
			peers = append(peers, r)
		}
	}
	rc.servers[i] = startClusterNode(rc.t, rc.bin, rc.data[i], rc.addrs[i], rc.routes[i], peers, append([]string{
		"--lease-ttl", rc.ttl.String(), "--heartbeat", "500ms", "--log-level", "info",
		// Snapshots (and the purges after them) happen under the kills
		// and pauses too: a restarted node's copy, behind the purge,
		// restores one.
		"--snapshot-every", "100"}, rc.flags...)...)
}

// waitNodes waits until every live node sees n live nodes.
func (rc *replicaCluster) waitNodes(n int) {
	rc.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for i := 0; i < 3; {
		var v struct{ Nodes []any }
		if rc.servers[i] == nil || rc.cs[i].Get(context.Background(), "/v1/cluster", &v) == nil && len(v.Nodes) == n {
			i++
			continue
		}
		if time.Now().After(deadline) {
			rc.t.Fatalf("node %d does not see %d nodes", i, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitCurrentCopy waits until node i holds a copy of obj (or is its home)
// at the stream's end.
func (rc *replicaCluster) waitCurrentCopy(obj string, i int) {
	rc.t.Helper()
	ctx := context.Background()
	var health struct{ Node string }
	deadline := time.Now().Add(90 * time.Second)
	for {
		var rep struct {
			Copies []struct {
				Node string `json:"node"`
				Lag  uint64 `json:"lag"`
			} `json:"copies"`
		}
		if rc.cs[i].Get(ctx, "/healthz", &health) == nil && rc.cs[i].Replicas(ctx, obj, &rep) == nil {
			for _, c := range rep.Copies {
				if c.Node == health.Node && c.Lag == 0 {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			rc.t.Fatalf("node %d keeps no current copy of %s", i, obj)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// home returns the index of the node that is obj's home.
func (rc *replicaCluster) home(obj string, via int) int {
	rc.t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var rep struct{ Home string }
		var health struct{ Node string }
		if err := rc.cs[via].Replicas(ctx, obj, &rep); err == nil {
			for i, c := range rc.cs {
				if rc.servers[i] != nil && c.Get(ctx, "/healthz", &health) == nil && health.Node == rep.Home {
					return i
				}
			}
		}
		if time.Now().After(deadline) {
			rc.t.Fatalf("no live node is the home of %s", obj)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// writers posts to chat/room1 from four clients until stopped, each under
// authors of its own, through whichever live node it picks; it records the
// seq each acknowledged post's reply gave.
type writers struct {
	mu      sync.Mutex
	ackedAt map[string]int64
	lastAck atomic.Int64 // Unix ns: when the latest acknowledged call was sent
	acked   atomic.Int64
	down    sync.Map // node index → true while it is down
	stop    chan struct{}
	wg      sync.WaitGroup
	errs    chan error
	lastErr atomic.Value // the latest failed call, for a failure's log
}

func (rc *replicaCluster) write(k int) *writers {
	w := &writers{ackedAt: map[string]int64{}, stop: make(chan struct{}), errs: make(chan error, 4)}
	for k := range k {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(k), 1))
			for i := 0; ; i++ {
				select {
				case <-w.stop:
					return
				default:
				}
				node := rng.IntN(3)
				if _, down := w.down.Load(node); down {
					continue
				}
				author := fmt.Sprintf("w%d-%05d", k, i)
				sent := time.Now()
				// A client that gives up soon and retries: a call sent to
				// a paused node (or forwarded to one) waits until then.
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				out, err := rc.cs[node].Call(ctx, "chat/room1", "post", []byte(fmt.Sprintf(`{"author":%q,"text":"x"}`, author)))
				cancel()
				if err != nil {
					w.lastErr.Store(fmt.Sprintf("%s node %d: %v", time.Now().Format("15:04:05.000"), node, err))
					time.Sleep(20 * time.Millisecond)
					continue
				}
				var r struct{ N int64 }
				if err := json.Unmarshal(out, &r); err != nil || r.N == 0 {
					w.errs <- fmt.Errorf("post reply %q: %v", out, err)
					return
				}
				w.mu.Lock()
				w.ackedAt[author] = r.N
				w.mu.Unlock()
				w.acked.Add(1)
				for {
					// The latest call sent that was acknowledged.
					prev := w.lastAck.Load()
					if prev >= sent.UnixNano() || w.lastAck.CompareAndSwap(prev, sent.UnixNano()) {
						break
					}
				}
			}
		}()
	}
	return w
}

func (w *writers) halt(t *testing.T) {
	close(w.stop)
	w.wg.Wait()
	select {
	case err := <-w.errs:
		t.Fatal(err)
	default:
	}
}

func (w *writers) waitAcked(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(120 * time.Second)
	for w.acked.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d posts acknowledged", w.acked.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitServed waits for a post sent after since to be acknowledged and
// returns how long after since it was sent: the object was served again
// by then.
func (w *writers) waitServed(t *testing.T, since time.Time, within time.Duration) time.Duration {
	t.Helper()
	for {
		if last := time.Unix(0, w.lastAck.Load()); last.After(since) {
			return last.Sub(since)
		}
		if time.Since(since) > within {
			t.Fatalf("the object did not answer within %v of losing its home; last error: %v", within, w.lastErr.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// history returns chat/room1's posts in seq order, after one last post
// that says how many committed in all: the room's whole log, read through
// its stream from the start.
func (rc *replicaCluster) history(t *testing.T, via int) []string {
	t.Helper()
	ctx := context.Background()
	out, err := rc.cs[via].Call(ctx, "chat/room1", "post", []byte(`{"author":"last","text":"end"}`))
	if err != nil {
		t.Fatal(err)
	}
	var last struct{ N int }
	if err := json.Unmarshal(out, &last); err != nil || last.N == 0 {
		t.Fatalf("last post: %q %v", out, err)
	}
	authors := make([]string, 0, last.N)
	zero := uint64(0)
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	err = rc.cs[via].Subscribe(sctx, "chat/room1", hclient.SubscribeOptions{Topic: "messages", After: &zero}, func(data []byte) bool {
		var ev struct {
			Seq     int `json:"seq"`
			Payload struct{ Author string }
		}
		if err := json.Unmarshal(data, &ev); err != nil {
			t.Errorf("stream event %q: %v", data, err)
			return false
		}
		if ev.Seq != len(authors)+1 {
			t.Errorf("stream event seq %d after %d events: a gap or a reorder", ev.Seq, len(authors))
			return false
		}
		authors = append(authors, ev.Payload.Author)
		return len(authors) < last.N
	})
	if t.Failed() {
		t.FailNow()
	}
	if len(authors) != last.N {
		t.Fatalf("the stream gave %d posts, the last post's seq is %d (%v)", len(authors), last.N, err)
	}
	return authors
}

// checkByIdentity: every acknowledged post is in the history at the seq its
// reply gave, and no post is there twice.
func (w *writers) checkByIdentity(t *testing.T, history []string) {
	t.Helper()
	seen := map[string]bool{}
	for _, a := range history {
		if seen[a] {
			t.Fatalf("post %s committed twice", a)
		}
		seen[a] = true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for author, n := range w.ackedAt {
		if n > int64(len(history)) || history[n-1] != author {
			got := "nothing"
			if n <= int64(len(history)) {
				got = history[n-1]
			}
			t.Fatalf("acknowledged post %s (seq %d) was lost: seq %d holds %s", author, n, n, got)
		}
	}
	t.Logf("%d posts acknowledged, %d committed in all", len(w.ackedAt), len(history))
}

// TestTakeoverAfterKill9 kills the home of a chat room with SIGKILL while
// four clients post to it through every node, three times in a row (the
// killed node restarted each time, under a new id). Each time the room
// answers again within the lease TTL plus 10 s; at the end every
// acknowledged post is there by identity, none twice, and the tally that
// follows the room (killed with it the first time: both are homed on
// node 0) counted each committed post exactly once with no failed attempt,
// and a stream subscriber that resumes from its last seq through another
// node whenever its stream ends received every post, with no gap and no
// reorder.
//
// conformance: D16 D17 D20 S10
func TestTakeoverAfterKill9(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills processes; not in -short")
	}
	rc := startReplicaCluster(t, replicaTTL)
	rc.roomWithTally(t)
	w := rc.write(4)
	sub := rc.follow(w, 2)
	for round := range 3 {
		w.waitAcked(t, int64(60*(round+1)))
		victim := rc.home("chat/room1", (round+1)%3)
		if round == 0 && victim != 0 {
			t.Fatalf("chat/room1's home is node %d, want node 0 (its first call)", victim)
		}
		w.down.Store(victim, true)
		rc.servers[victim].cmd.Process.Kill() // SIGKILL: no shutdown path runs
		killed := time.Now()
		<-rc.servers[victim].done
		rc.servers[victim].waited = true
		took := w.waitServed(t, killed, replicaTTL+10*time.Second)
		t.Logf("round %d: killed node %d at %d acknowledged posts; answered again after %v", round, victim, w.acked.Load(), took.Round(time.Millisecond))
		rc.start(victim)
		waitHealthy(t, rc.addrs[victim], rc.servers[victim])
		rc.waitNodes(3)
		w.down.Delete(victim)
		// One failure at a time: the next kill waits until the restarted
		// node keeps a current copy of the room and posts flow again.
		rc.waitCurrentCopy("chat/room1", victim)
		w.waitAcked(t, w.acked.Load()+30)
	}
	w.halt(t)
	history := rc.history(t, 1)
	w.checkByIdentity(t, history)
	sub.check(t, history)
	rc.checkTally(t, history)
}

// roomWithTally uploads chat and tally through node 0 and makes node 0 the
// home of chat/room1 (its first post) and of tally/t1, which follows it.
func (rc *replicaCluster) roomWithTally(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for _, p := range []string{"chat", "tally"} {
		if _, err := rc.cs[0].Upload(ctx, p, vmtest.Wasm(t, p)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := rc.cs[0].Call(ctx, "chat/room1", "post", []byte(`{"author":"first","text":"home on node 0"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := rc.cs[0].Call(ctx, "tally/t1", "follow", []byte(`{"publisher":"chat/room1"}`)); err != nil {
		t.Fatal(err)
	}
}

// checkTally checks that tally/t1, which followed chat/room1 after its
// first post, counted each later post of history exactly once, and that
// its edge has no failed attempt.
func (rc *replicaCluster) checkTally(t *testing.T, history []string) {
	t.Helper()
	ctx := context.Background()
	var counts struct {
		Total      int64            `json:"total"`
		Duplicates int64            `json:"duplicates"`
		Authors    map[string]int64 `json:"authors"`
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := rc.cs[2].Call(ctx, "tally/t1", "counts", nil)
		if err == nil && json.Unmarshal(out, &counts) == nil && counts.Total >= int64(len(history)-1) {
			break
		}
		if time.Now().After(deadline) {
			var edges, reps json.RawMessage
			eerr := rc.cs[2].Edges(ctx, "chat/room1", &edges)
			rerr := rc.cs[2].Replicas(ctx, "tally/t1", &reps)
			t.Fatalf("tally reached %d of %d (err %v)\nchat/room1's edges: %s (%v)\ntally/t1's replicas: %s (%v)",
				counts.Total, len(history)-1, err, edges, eerr, reps, rerr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The tally followed after the first post.
	if counts.Duplicates != 0 || counts.Total != int64(len(history)-1) {
		t.Fatalf("tally total %d, duplicates %d; want %d, none", counts.Total, counts.Duplicates, len(history)-1)
	}
	for _, a := range history[1:] {
		if counts.Authors[a] != 1 {
			t.Fatalf("tally counted post %s %d times, want once", a, counts.Authors[a])
		}
	}
	var edges struct {
		Edges []struct {
			Kind     string `json:"kind"`
			Attempts int    `json:"attempts"`
		} `json:"edges"`
	}
	if err := rc.cs[1].Get(ctx, "/v1/objects/chat/room1/edges", &edges); err != nil {
		t.Fatal(err)
	}
	if len(edges.Edges) != 1 || edges.Edges[0].Attempts != 0 {
		t.Fatalf("edges %+v: want the tally edge with no failed attempt", edges.Edges)
	}
}

// TestAsyncAckKill9LosesAtMostTheWindow kills the home of a chat room with
// SIGKILL while four clients post to it, with --replica-ack async: a call
// is answered once committed on the home and shipped right after. The
// posts acknowledged and lost are at most what the window bounds
// (host.AsyncWindow change sets, each one commit of up to a batch of
// calls), and what was lost was never seen by anyone else: the tally that
// follows the room counts each post of the final history exactly once,
// and the stream subscriber saw the final history with no gap, as in sync
// mode.
//
// conformance: D16 D17 S10
func TestAsyncAckKill9LosesAtMostTheWindow(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("kills processes; not in -short")
	}
	rc := startReplicaCluster(t, replicaTTL, "--replica-ack", "async")
	rc.roomWithTally(t)
	w := rc.write(4)
	sub := rc.follow(w, 2)
	w.waitAcked(t, 100)
	victim := rc.home("chat/room1", 1)
	if victim != 0 {
		t.Fatalf("chat/room1's home is node %d, want node 0 (its first call)", victim)
	}
	w.down.Store(victim, true)
	rc.servers[victim].cmd.Process.Kill()
	killed := time.Now()
	<-rc.servers[victim].done
	rc.servers[victim].waited = true
	took := w.waitServed(t, killed, replicaTTL+10*time.Second)
	w.waitAcked(t, w.acked.Load()+30)
	w.halt(t)
	history := rc.history(t, 1)

	seen := map[string]bool{}
	for _, a := range history {
		if seen[a] {
			t.Fatalf("post %s committed twice", a)
		}
		seen[a] = true
	}
	lost := 0
	w.mu.Lock()
	for author, n := range w.ackedAt {
		if n > int64(len(history)) || history[n-1] != author {
			lost++
		}
	}
	acked := len(w.ackedAt)
	w.mu.Unlock()
	// Each change set is one commit of at most a batch of calls.
	if bound := host.AsyncWindow * host.DefaultMaxBatch; lost > bound {
		t.Fatalf("%d acknowledged posts lost; the window bounds it at %d", lost, bound)
	}
	t.Logf("killed node %d at %d acknowledged posts; answered again after %v; %d of %d acknowledged posts lost",
		victim, acked, took.Round(time.Millisecond), lost, acked)
	sub.check(t, history)
	rc.checkTally(t, history)
}

// TestPausedHomeIsFenced stops the home of a chat room with SIGSTOP past
// its lease while clients post through the other nodes, then resumes
// it and sends posts to it too. The room is taken over meanwhile; the old
// home never commits another post: its own file is, post for post, a
// prefix of the room's final history, and every acknowledged post is in
// that history by identity.
//
// conformance: D16
func TestPausedHomeIsFenced(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("stops processes; not in -short")
	}
	// No snapshots here (the other process tests take them every 100
	// change sets): the old home's file is what this test reads, and a
	// new home's snapshot purges the stream past it, after which the
	// resumed node rightly drops that file instead of keeping it as a copy,
	// leaving nothing to check (1 full run in 2 once, under load).
	rc := startReplicaCluster(t, pausedTTL, "--snapshot-every", "-1")
	ctx := context.Background()
	if _, err := rc.cs[0].Upload(ctx, "chat", vmtest.Wasm(t, "chat")); err != nil {
		t.Fatal(err)
	}
	if _, err := rc.cs[0].Call(ctx, "chat/room1", "post", []byte(`{"author":"first","text":"home on node 0"}`)); err != nil {
		t.Fatal(err)
	}
	w := rc.write(4)
	w.waitAcked(t, 40)
	// The room's home now: node 0 unless a loaded machine moved it
	// already (once, in a full suite, the room answered 6 ms after node
	// 0 was paused, and node 0, paused for 2 s only, was never fenced).
	victim := rc.home("chat/room1", 1)
	var health struct{ Node string }
	if err := rc.cs[victim].Get(ctx, "/healthz", &health); err != nil {
		t.Fatal(err)
	}
	old := rc.servers[victim]
	w.down.Store(victim, true)
	if err := old.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	// No bound on the takeover's time here (the kill test has one): what
	// this test checks is that the paused home never commits again. The
	// wait only keeps a broken run from hanging. (In a full suite the
	// successor once claimed the room 22 s after the pause and posts
	// still timed out for 40 s more: the frozen NATS server's routes
	// stayed open. They now close after 8-10 s of silence,
	// TestRoutesToAFrozenPeerCloseBeforeItsLeaseRunsOut.)
	took := w.waitServed(t, paused, 5*pausedTTL)
	other := (victim + 1) % 3
	hosttest.WaitFor(t, "the room's home moved off the paused node", 3*pausedTTL, func() bool {
		var rep struct{ Home string }
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return rc.cs[other].Replicas(rctx, "chat/room1", &rep) == nil && rep.Home != "" && rep.Home != health.Node
	})
	t.Logf("paused node %d at %d acknowledged posts; the room answered again after %v", victim, w.acked.Load(), took.Round(time.Millisecond))
	time.Sleep(2 * time.Second) // the new home takes posts meanwhile
	if err := old.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// Posts sent to the resumed node: refused, or forwarded to the new
	// home; never committed in its stale file.
	w.down.Delete(victim)
	w.waitAcked(t, w.acked.Load()+40)
	w.halt(t)
	history := rc.history(t, 1)
	w.checkByIdentity(t, history)

	// The old home's file leaves its objects once it knows it was taken
	// over: kept as its copy (every node keeps one here), never as a home.
	homeFile := filepath.Join(rc.data[victim], "objects", "chat", "room1.db")
	hosttest.WaitFor(t, "the old home's file retired", 30*time.Second, func() bool {
		_, err := os.Stat(homeFile)
		return errors.Is(err, os.ErrNotExist)
	})

	// What the old home's file became (its copy, or a copy set aside as
	// diverged), read once it has had every chance to write (it rejoined
	// under a new id and took posts meanwhile): it holds no post the
	// room's history does not hold at the same seq.
	old.cmd.Process.Kill()
	<-old.done
	old.waited = true
	files, _ := filepath.Glob(filepath.Join(rc.data[victim], "*", "chat", "room1.db*"))
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, "-wal") || strings.HasSuffix(f, "-shm") {
			continue
		}
		n += checkPrefix(t, f, history)
	}
	if n == 0 {
		t.Fatalf("the old home's files %v hold no posts: the test checked nothing", files)
	}
	t.Logf("the old home's files %v hold %d posts, each at its seq in the room's %d", files, n, len(history))
}

// checkPrefix fails the test if the object file at path holds a post the
// room's history does not hold at the same seq, and returns how many
// posts it holds.
func checkPrefix(t *testing.T, path string, history []string) int {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT seq, payload FROM log ORDER BY seq`)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var seq int
		var payload []byte
		if err := rows.Scan(&seq, &payload); err != nil {
			t.Fatal(err)
		}
		var m struct{ Author string }
		json.Unmarshal(payload, &m)
		if seq > len(history) || history[seq-1] != m.Author {
			t.Fatalf("%s: the old home committed post %q at seq %d, which the room's history does not hold there", path, m.Author, seq)
		}
		n++
	}
	return n
}

// follower is a stream subscriber that reads chat/room1's messages through
// one node at a time, never the one that is down, and resumes from the
// last seq it received (the checkpoint a consumer keeps) each time its
// stream ends or fails.
type follower struct {
	mu      sync.Mutex
	authors []string
	bad     error // a gap or a reorder
	resumes int
	stop    chan struct{}
	done    chan struct{}
}

func (rc *replicaCluster) follow(w *writers, via int) *follower {
	f := &follower{stop: make(chan struct{}), done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-f.stop
		cancel()
	}()
	go func() {
		defer close(f.done)
		for node := via; ctx.Err() == nil; node = (node + 1) % 3 {
			if _, down := w.down.Load(node); down {
				continue
			}
			f.mu.Lock()
			after := uint64(len(f.authors))
			f.mu.Unlock()
			rc.cs[node].Subscribe(ctx, "chat/room1", hclient.SubscribeOptions{Topic: "messages", After: &after}, func(data []byte) bool {
				var ev struct {
					Seq     int `json:"seq"`
					Payload struct{ Author string }
				}
				f.mu.Lock()
				defer f.mu.Unlock()
				if err := json.Unmarshal(data, &ev); err != nil {
					f.bad = fmt.Errorf("stream event %q: %v", data, err)
					return false
				}
				if ev.Seq != len(f.authors)+1 {
					f.bad = fmt.Errorf("stream event seq %d after %d events through node %d: a gap or a reorder", ev.Seq, len(f.authors), node)
					return false
				}
				f.authors = append(f.authors, ev.Payload.Author)
				return true
			})
			f.mu.Lock()
			f.resumes++
			bad := f.bad
			f.mu.Unlock()
			if bad != nil {
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return f
}

// check waits for the follower to have received the whole history, then
// compares it post for post.
func (f *follower) check(t *testing.T, history []string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		f.mu.Lock()
		n, bad := len(f.authors), f.bad
		f.mu.Unlock()
		if bad != nil {
			t.Fatal(bad)
		}
		if n >= len(history) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream subscriber received %d of %d posts", n, len(history))
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(f.stop)
	<-f.done
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, a := range history {
		if f.authors[i] != a {
			t.Fatalf("the stream subscriber's post %d is %s, the room's is %s", i+1, f.authors[i], a)
		}
	}
	t.Logf("the stream subscriber received all %d posts in order, resuming %d times", len(history), f.resumes-1)
}
