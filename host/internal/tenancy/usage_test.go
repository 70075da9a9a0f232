package tenancy

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"
)

// records is a tenant registry for tests: each tenant's own limits.
type records struct {
	mu sync.Mutex
	m  map[string]Limits
}

func (r *records) set(tenant string, l Limits) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[tenant] = l
}

func (r *records) limits(tenant string) (Limits, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l, ok := r.m[tenant]
	return l, ok
}

// newUsage is a node's usage with defaults d and the tenants' own limits
// in the returned records.
func newUsage(d Limits) (*Usage, *records) {
	r := &records{m: map[string]Limits{}}
	return NewUsage(d, r.limits), r
}

func small() Limits {
	d := DefaultLimits()
	d.Connections, d.Objects, d.TenantBytes, d.Concurrency, d.Programs = 2, 2, 1000, 1, 2
	return d
}

func wantLimit(t *testing.T, err error, what string, status int) {
	t.Helper()
	var le *LimitError
	if !errors.As(err, &le) || le.What != what || le.Status != status {
		t.Fatalf("got %v, want a %q limit error with status %d", err, what, status)
	}
}

func TestNoTenancyLimitsNothing(t *testing.T) {
	var u *Usage // a node without tenancy
	tu := u.Of("acme")
	if tu != nil {
		t.Fatalf("Of on a node without tenancy = %+v", tu)
	}
	if rel, err := tu.Acquire(context.Background()); err != nil {
		t.Fatal(err)
	} else {
		rel()
	}
	if rel, err := tu.OpenConn(); err != nil {
		t.Fatal(err)
	} else {
		rel()
	}
	if undo, err := tu.NewObject(); err != nil {
		t.Fatal(err)
	} else {
		undo()
	}
	if err := tu.Publish(1 << 20); err != nil {
		t.Fatal(err)
	}
	if err := tu.AllowProgram(make([]string, 1000), "p"); err != nil {
		t.Fatal(err)
	}
	if tu.MemoryPages() != 0 {
		t.Fatal("memory pages without tenancy")
	}
	u.Recount("acme", 1, 1) // no panic
	if u, _ := newUsage(small()); u.Of("") != nil {
		t.Fatal("the operator has a use record")
	}
}

// A limit change makes a new record, but one set of counts per tenant: a
// connection opened under the old limits is given back to the counter the
// new record checks.
func TestCountsSharedAcrossLimitChanges(t *testing.T) {
	u, recs := newUsage(small())
	old := u.Of("acme")
	rel1, err := old.OpenConn()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.OpenConn(); err != nil {
		t.Fatal(err)
	}
	if u.Of("acme") != old {
		t.Fatal("unchanged limits made a new record")
	}

	recs.set("acme", Limits{Connections: 3})
	cur := u.Of("acme")
	if cur == old {
		t.Fatal("a limit change kept the old record")
	}
	if cur.Limits().Connections != 3 || cur.Limits().Objects != small().Objects {
		t.Fatalf("limits in force = %+v: the tenant's own over the defaults", cur.Limits())
	}
	if c := cur.Counts().Connections; c != 2 {
		t.Fatalf("the new record counts %d connections, want the 2 open", c)
	}
	rel3, err := cur.OpenConn()
	if err != nil {
		t.Fatal(err)
	}
	_, err = cur.OpenConn()
	wantLimit(t, err, "connections", http.StatusTooManyRequests)

	rel1() // opened under the old record
	if c := cur.Counts().Connections; c != 2 {
		t.Fatalf("after an old connection closed the count is %d, want 2", c)
	}
	if _, err := cur.OpenConn(); err != nil {
		t.Fatalf("the old connection's slot was not given back: %v", err)
	}
	rel3()

	// Lowering the limit below what is open refuses new ones until enough
	// close, however many records there were.
	recs.set("acme", Limits{Connections: 1})
	_, err = u.Of("acme").OpenConn()
	wantLimit(t, err, "connections", http.StatusTooManyRequests)
}

// Connections opened and closed from many goroutines while the limits
// change under them all come back to zero, and never pass the limit in
// force when they were counted.
func TestCountsUnderConcurrentLimitChanges(t *testing.T) {
	u, recs := newUsage(small())
	stop := make(chan struct{})
	var flips sync.WaitGroup
	flips.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			recs.set("acme", Limits{Connections: 5 + i%3})
		}
	})
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 200 {
				tu := u.Of("acme")
				rel, err := tu.OpenConn()
				if err != nil {
					continue
				}
				if c := tu.Counts().Connections; c > int64(tu.Limits().Connections) {
					t.Errorf("%d connections open past a limit of %d", c, tu.Limits().Connections)
				}
				rel()
			}
		})
	}
	wg.Wait()
	close(stop)
	flips.Wait()
	if c := u.Of("acme").Counts().Connections; c != 0 {
		t.Fatalf("%d connections counted after all closed", c)
	}
}

// within is a context for a wait that must end: a broken release fails
// the test instead of hanging it.
func within(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestHandlerSlots(t *testing.T) {
	u, _ := newUsage(small()) // one slot
	tu := u.Of("acme")
	release, err := tu.Acquire(within(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tu.Acquire(within(t, 20*time.Millisecond)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a second slot of one: %v, want ErrUnavailable when the wait ends", err)
	}

	// Another tenant has slots of its own.
	if rel, err := u.Of("other").Acquire(within(t, 5*time.Second)); err != nil {
		t.Fatalf("another tenant waited for acme's slot: %v", err)
	} else {
		rel()
	}

	// A call chain holding acme's slot (a handler's follow running the
	// publisher's hook) takes none; holding another tenant's does not help.
	nested, err := tu.Acquire(HoldingSlot(within(t, 5*time.Second), "acme"))
	if err != nil {
		t.Fatalf("a chain holding the slot waited for itself: %v", err)
	}
	nested() // gives back nothing
	if _, err := tu.Acquire(HoldingSlot(within(t, 20*time.Millisecond), "other")); err == nil {
		t.Fatal("holding another tenant's slot took one of acme's")
	}

	release()
	if rel, err := tu.Acquire(within(t, 5*time.Second)); err != nil {
		t.Fatalf("a released slot was not given back: %v", err)
	} else {
		rel()
	}
}

// A waiter gets the slot the moment its holder releases it.
func TestHandlerSlotWaiterGetsRelease(t *testing.T) {
	u, _ := newUsage(small())
	tu := u.Of("acme")
	release, err := tu.Acquire(within(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		rel, err := tu.Acquire(within(t, 10*time.Second))
		if err == nil {
			rel()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("a waiter ran beside the holder of the only slot: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	release()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

func TestNewObjectLimits(t *testing.T) {
	u, _ := newUsage(small()) // 2 objects, 1000 bytes
	tu := u.Of("acme")
	undo1, err := tu.NewObject()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tu.NewObject(); err != nil {
		t.Fatal(err)
	}
	_, err = tu.NewObject()
	wantLimit(t, err, "objects", http.StatusTooManyRequests)
	if c := tu.Counts().Objects; c != 2 {
		t.Fatalf("a refused object was counted: %d", c)
	}
	undo1() // its file was not made after all
	undo, err := tu.NewObject()
	if err != nil {
		t.Fatalf("an undone object kept its count: %v", err)
	}
	undo()

	// At its storage no new file is made, and its files are frozen, until
	// a recount finds room.
	if tu.Frozen() {
		t.Fatal("frozen with nothing stored")
	}
	u.Recount("acme", 1, 1000)
	if !tu.Frozen() {
		t.Fatal("not frozen at the tenant's storage limit")
	}
	_, err = tu.NewObject()
	wantLimit(t, err, "tenant storage", http.StatusRequestEntityTooLarge)
	wantLimit(t, tu.StorageFull(true, 10), "tenant storage", http.StatusRequestEntityTooLarge)
	wantLimit(t, tu.StorageFull(false, 10), "object storage", http.StatusRequestEntityTooLarge)
	u.Recount("acme", 1, 999)
	if tu.Frozen() {
		t.Fatal("still frozen after a recount found room")
	}
	if undo, err := tu.NewObject(); err != nil {
		t.Fatal(err)
	} else {
		undo()
	}
}

func TestAllowProgram(t *testing.T) {
	u, _ := newUsage(small()) // 2 programs
	tu := u.Of("acme")
	if err := tu.AllowProgram([]string{"acme.a"}, "acme.b"); err != nil {
		t.Fatal(err)
	}
	err := tu.AllowProgram([]string{"acme.a", "acme.b"}, "acme.c")
	wantLimit(t, err, "programs", http.StatusTooManyRequests)
	if err := tu.AllowProgram([]string{"acme.a", "acme.b"}, "acme.b"); err != nil {
		t.Fatalf("a new version of a program at the limit: %v", err)
	}
}

func TestPublishRate(t *testing.T) {
	d := small()
	d.PublishRate, d.PublishBurst = 1, 5
	u, _ := newUsage(d)
	tu := u.Of("acme")
	if err := tu.Publish(5); err != nil {
		t.Fatal(err)
	}
	wantLimit(t, tu.Publish(1), "publish rate", http.StatusTooManyRequests)
	if err := tu.Publish(0); err != nil {
		t.Fatalf("a call that published nothing: %v", err)
	}
}
