package cluster

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	_ "modernc.org/sqlite"
)

// Short leases for tests; the binary keeps the defaults.
const (
	testTTL  = 3 * time.Second
	testBeat = 300 * time.Millisecond
)

// runJetStream starts an in-process NATS server with JetStream in a temp
// directory, listening on no port.
func runJetStream(t *testing.T) *server.Server {
	t.Helper()
	srv, err := server.NewServer(&server.Options{
		ServerName: "cluster-test", JetStream: true, StoreDir: t.TempDir(),
		DontListen: true, NoSigs: true, NoLog: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server did not start")
	}
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	return srv
}

func connect(t *testing.T, srv *server.Server) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect("", nats.InProcessServer(srv))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// openDB is a data directory's node database (the identities table).
func openDB(t *testing.T, dir string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "node.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

var quiet = slog.New(slog.DiscardHandler)

func freshID() string {
	var b [6]byte
	rand.Read(b[:])
	return "n-" + hex.EncodeToString(b[:])
}

// member is a Cluster as a node would run it, recording its callbacks.
type member struct {
	*Cluster
	mu       sync.Mutex
	gone     []string
	lost     chan struct{}
	lostOnce sync.Once
}

func (m *member) wasGone(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, g := range m.gone {
		if g == id {
			return true
		}
	}
	return false
}

// heard reports whether m has heard id's heartbeat.
func (m *member) heard(id string) bool {
	m.Cluster.mu.Lock()
	defer m.Cluster.mu.Unlock()
	return !m.lastSeen[id].IsZero()
}

// join starts a member on srv with the data directory's database db.
func join(t *testing.T, srv *server.Server, db *sql.DB, mutate func(*Config)) *member {
	t.Helper()
	m := &member{lost: make(chan struct{})}
	cfg := Config{
		JetStream: connect(t, srv), Self: freshID(), DB: db,
		LeaseTTL: testTTL, Heartbeat: testBeat, Logger: quiet,
		Info: func() NodeInfo { return NodeInfo{URL: "http://test"} },
		NodeGone: func(id string) {
			m.mu.Lock()
			m.gone = append(m.gone, id)
			m.mu.Unlock()
		},
		LeaseLost: func() { m.lostOnce.Do(func() { close(m.lost) }) },
	}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.Cluster = c
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Open(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(true) })
	return m
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (m *member) pause(on bool) {
	m.Cluster.mu.Lock()
	m.paused = on
	m.Cluster.mu.Unlock()
}

// A node that stops renewing its lease is dropped by its peers; when it
// comes back it is refused under its old id (its renewal fails and it is
// told its lease is lost), and peers never count the old id live again,
// even if the id's key reappears.
//
// conformance: D21
func TestLeaseLostIsGoneForGood(t *testing.T) {
	t.Parallel()
	srv := runJetStream(t)
	a := join(t, srv, openDB(t, t.TempDir()), nil)
	b := join(t, srv, openDB(t, t.TempDir()), nil)
	waitFor(t, "a hears b", func() bool { return a.heard(b.Self()) })

	b.pause(true)
	waitFor(t, "a drops b", func() bool { return !a.Live(b.Self()) })
	if !a.wasGone(b.Self()) {
		t.Fatal("a dropped b without saying it is gone")
	}

	// b comes back: its renewal is refused and it is told to leave.
	b.pause(false)
	select {
	case <-b.lost:
	case <-time.After(30 * time.Second):
		t.Fatal("b kept its lapsed lease")
	}
	if b.LeaseValid() {
		t.Fatal("b acts on a lease it lost")
	}

	// Even if the old id's key reappears, it stays dead.
	ctx := context.Background()
	if _, err := a.nodes.Put(ctx, "n."+b.Self(), []byte(`{"id":"`+b.Self()+`"}`)); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(3 * testBeat); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if a.Live(b.Self()) {
			t.Fatal("a node id came back")
		}
	}
	for _, n := range a.Nodes() {
		if n.ID == b.Self() {
			t.Fatal("a lists a node id that is gone")
		}
	}
}

// A starting node prunes nothing until it has read the live set: Start
// returns only after the watch's first full read, however slow the store
// is to answer it. And a node not heard of yet is live until the store
// says it is gone.
//
// conformance: D21
func TestStartReadsTheLiveSetFirst(t *testing.T) {
	t.Parallel()
	srv := runJetStream(t)
	dirA := t.TempDir()
	a := join(t, srv, openDB(t, dirA), nil)
	b := join(t, srv, openDB(t, t.TempDir()), nil)
	waitFor(t, "a hears b", func() bool { return a.heard(b.Self()) })

	// Restart a (same data directory, new id) while its lease watch is
	// slow to start.
	a.Close(true)
	a2 := join(t, srv, openDB(t, dirA), func(c *Config) {
		c.BeforeWatch = func() { time.Sleep(time.Second) }
	})
	if !a2.heard(b.Self()) {
		t.Fatal("the node started before it read the live set: it has not heard of its live peer")
	}
	if a2.Live(a.Self()) {
		t.Fatal("the restarted node counts its own earlier id live")
	}
	waitFor(t, "b learns a's old id is gone", func() bool { return !b.Live(a.Self()) && b.wasGone(a.Self()) })

	// Not heard of is not dead: live until the store has no lease for it.
	ghost := "n-000000000000"
	if !a2.Live(ghost) {
		t.Fatal("a node id not heard of yet counted as dead without asking the store")
	}
	waitFor(t, "a node id with no lease in the store is dropped", func() bool { return !a2.Live(ghost) })
	if !a2.Live(b.Self()) {
		t.Fatal("the live peer counted dead")
	}
}

// An object's home is claimed once: a herd of first uses on two nodes
// agrees on one home. A live home stays; a home gone for good is
// unavailable to others and reclaimed by its own data directory restarted
// under a new id, which its peers then route to.
//
// conformance: D20
func TestHomeIsClaimedOnceAndReclaimed(t *testing.T) {
	t.Parallel()
	srv := runJetStream(t)
	dirA := t.TempDir()
	a := join(t, srv, openDB(t, dirA), nil)
	b := join(t, srv, openDB(t, t.TempDir()), nil)
	ctx := context.Background()

	obj := Object{"chat", "room/1"}
	homes := make([]string, 16)
	var wg sync.WaitGroup
	for i := range homes {
		m := a
		if i%2 == 1 {
			m = b
		}
		wg.Go(func() {
			h, err := m.Home(ctx, obj)
			if err != nil {
				t.Error(err)
			}
			homes[i] = h
		})
	}
	wg.Wait()
	for _, h := range homes {
		if h != homes[0] || (h != a.Self() && h != b.Self()) {
			t.Fatalf("one object, homes %v", homes)
		}
	}
	// Make a the home of an object whose file is "in its directory".
	mine := Object{"chat", "mine"}
	if h, err := a.Home(ctx, mine); err != nil || h != a.Self() {
		t.Fatalf("home %q %v", h, err)
	}
	if h, err := b.Home(ctx, mine); err != nil || h != a.Self() {
		t.Fatalf("b sees home %q %v, want a", h, err)
	}

	// a leaves for good: its objects are unavailable to b.
	a.Close(true)
	waitFor(t, "b drops a", func() bool { return !b.Live(a.Self()) })
	if _, err := b.Home(ctx, mine); !errors.Is(err, ErrObjectUnavailable) {
		t.Fatalf("home on a gone node: %v, want ErrObjectUnavailable", err)
	}

	// a's data directory restarts under a new id and reclaims its files.
	a2 := join(t, srv, openDB(t, dirA), func(c *Config) {
		c.LocalObjects = func() []Object { return []Object{mine} }
	})
	a2.Reclaim(ctx)
	if h, err := b.Home(ctx, mine); err != nil || h != a2.Self() {
		t.Fatalf("after the restart b sees home %q %v, want %s", h, err, a2.Self())
	}
	// A herd right after the restart agrees too.
	homes = make([]string, 16)
	for i := range homes {
		m := a2
		if i%2 == 1 {
			m = b
		}
		wg.Go(func() {
			m.Forget(mine)
			h, err := m.Home(ctx, mine)
			if err != nil {
				t.Error(err)
			}
			homes[i] = h
		})
	}
	wg.Wait()
	for _, h := range homes {
		if h != a2.Self() {
			t.Fatalf("after the restart, homes %v, want all %s", homes, a2.Self())
		}
	}
}

func TestRetryJSRetriesUntilReady(t *testing.T) {
	t.Parallel()
	tries := 0
	err := RetryJS(context.Background(), quiet, "test", func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("an attempt without a deadline")
		}
		if tries++; tries < 3 {
			return jetstream.ErrJetStreamNotEnabled
		}
		return nil
	})
	if err != nil || tries != 3 {
		t.Fatalf("err %v after %d tries", err, tries)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	want := errors.New("not ready")
	if err := RetryJS(ctx, quiet, "test", func(context.Context) error { return want }); err != want {
		t.Fatalf("a cancelled retry returned %v", err)
	}
}

func TestNewRefusesAnIncompleteConfig(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{Self: "n-1"}); err == nil {
		t.Fatal("no JetStream accepted")
	}
}

// A renewal that landed though this node never heard back (a timeout
// during a leader election) leaves the store one revision ahead: the next
// renewal fails on the revision, and the node must adopt the store's,
// read through the bucket's leader, not declare its lease lost. A lease
// that did end (deleted) is still lost.
func TestRenewalThatLandedUnheardKeepsTheLease(t *testing.T) {
	srv := runJetStream(t)
	m := join(t, srv, openDB(t, t.TempDir()), nil)
	ctx := context.Background()
	m.Cluster.mu.Lock()
	m.paused = true
	m.Cluster.mu.Unlock()
	// The landed renewal: the node's own info, one revision on.
	if _, err := m.nodes.Put(ctx, "n."+m.Self(), m.info()); err != nil {
		t.Fatal(err)
	}
	m.Cluster.mu.Lock()
	m.paused = false
	m.Cluster.mu.Unlock()
	deadline := time.Now().Add(3 * testTTL)
	for {
		m.Cluster.mu.Lock()
		renewed := time.Since(m.renewed) < testBeat
		m.Cluster.mu.Unlock()
		select {
		case <-m.lost:
			t.Fatal("the lease was declared lost after a renewal that landed unheard")
		default:
		}
		if renewed && time.Now().After(deadline.Add(-2*testTTL)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lease is not renewed")
		}
		time.Sleep(testBeat / 3)
	}
	if !m.LeaseValid() {
		t.Fatal("the lease is not valid")
	}
	// A lease that ended is lost.
	if err := m.nodes.Delete(ctx, "n."+m.Self()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.lost:
	case <-time.After(3 * testTTL):
		t.Fatal("a deleted lease was not declared lost")
	}
}

// TestLeasesAreKeptOnFile: a NATS server that restarts comes back with the
// live nodes' leases (the bucket is on file), so it rejoins the bucket's
// raft group current instead of empty.
func TestLeasesAreKeptOnFile(t *testing.T) {
	store := t.TempDir()
	start := func() *server.Server {
		srv, err := server.NewServer(&server.Options{
			ServerName: "lease-file", JetStream: true, StoreDir: store,
			DontListen: true, NoSigs: true, NoLog: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		go srv.Start()
		if !srv.ReadyForConnections(10 * time.Second) {
			t.Fatal("nats server did not start")
		}
		return srv
	}
	srv := start()
	m := join(t, srv, openDB(t, t.TempDir()), nil)
	ctx := context.Background()
	st, err := m.nodes.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Storage; got != jetstream.FileStorage {
		t.Fatalf("lease bucket storage %v, want file", got)
	}
	m.pause(true) // no renewals while the server is away
	srv.Shutdown()
	srv.WaitForShutdown()

	srv = start()
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	kv, err := connect(t, srv).KeyValue(ctx, NodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "n."+m.Self()); err != nil {
		t.Fatalf("the live node's lease after the server restarted: %v", err)
	}
}

// TestLeasesMadeInMemoryStayUsable: a lease bucket an earlier version made
// in memory is used as it is (its storage cannot change in place, and
// recreating it would drop the live leases).
func TestLeasesMadeInMemoryStayUsable(t *testing.T) {
	srv := runJetStream(t)
	ctx := context.Background()
	if _, err := connect(t, srv).CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: NodesBucket, TTL: testTTL, LimitMarkerTTL: testTTL, Storage: jetstream.MemoryStorage,
	}); err != nil {
		t.Fatal(err)
	}
	a := join(t, srv, openDB(t, t.TempDir()), nil)
	b := join(t, srv, openDB(t, t.TempDir()), nil)
	waitFor(t, "each node hears the other", func() bool { return a.heard(b.Self()) && b.heard(a.Self()) })
	st, err := a.nodes.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Storage; got != jetstream.MemoryStorage {
		t.Fatalf("lease bucket storage %v, want memory as it was made", got)
	}
}

// A lease watch can fall silent without closing (its consumer lost when
// the bucket's leader moves, or its server paused). A node whose watch
// is silent must still learn of nodes that join: its own renewals stop
// coming through the watch, and it watches again.
func TestSilentLeaseWatchIsMadeAgain(t *testing.T) {
	t.Parallel()
	srv := runJetStream(t)
	a := join(t, srv, openDB(t, t.TempDir()), nil)
	a.Cluster.mu.Lock()
	a.mute = true
	a.Cluster.mu.Unlock()
	b := join(t, srv, openDB(t, t.TempDir()), nil)
	waitFor(t, "the node with a silent watch lists the node that joined", func() bool {
		for _, n := range a.Nodes() {
			if n.ID == b.Self() {
				return true
			}
		}
		return false
	})
	if a.WatchStalls() == 0 {
		t.Fatal("the node learned of the new one without watching again")
	}
}
