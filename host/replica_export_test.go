package host

import (
	"context"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/store"
)

// ReadShipped reads events (after, through] of id from the shipped
// replica alone (the change stream applied to a scratch file), the read
// path's last tier.
func ReadShipped(ctx context.Context, n *Node, id ObjectID, after, through uint64) ([]abi.Event, error) {
	return n.replicas.readShipped(ctx, id, store.Query{After: after, Through: through})
}

// AfterShippedRestore runs f in n's shipped reads, between the snapshot's
// restore and the catch-up after it.
func AfterShippedRestore(n *Node, f func()) { n.replicas.afterRestore = f }

// FailHomeOpens makes the next k openings of an object's file as its home
// on n fail, as they do while its change stream has no leader.
func FailHomeOpens(n *Node, k int) { n.replicas.failOpens.Store(int32(k)) }

// Busy reports whether a handler (or the pump) holds id's lock on n now.
func Busy(n *Node, id string) bool {
	oid, err := ParseObjectID(id)
	if err != nil {
		return false
	}
	n.objects.mu.Lock()
	defer n.objects.mu.Unlock()
	o, ok := n.objects.active[oid]
	return ok && len(o.sem) == 1
}

// DelayProgramWatch holds each update n's program registry watch brings for
// d, so that n knows of a new version only if it is told.
func DelayProgramWatch(n *Node, d time.Duration) { n.programs.watchDelay.Store(int64(d)) }

// RunningVersions counts the objects of program active on n by the version
// they run (0: not yet called since they became active).
func RunningVersions(n *Node, program string) map[int]int {
	n.objects.mu.Lock()
	defer n.objects.mu.Unlock()
	out := map[int]int{}
	for id, o := range n.objects.active {
		if id.Program == program {
			out[int(o.running.Load())]++
		}
	}
	return out
}

// RecordAlarmDelays has n give f how late each alarm's first run began.
func RecordAlarmDelays(n *Node, f func(time.Duration)) { n.metrics.alarmDelays.Store(&f) }

// AlarmRunsHighWater is the most alarm runs n has had in progress at once,
// and the bound on them.
func AlarmRunsHighWater(n *Node) (high, bound int) {
	n.alarmsRunning.mu.Lock()
	defer n.alarmsRunning.mu.Unlock()
	return n.alarmsRunning.high, maxAlarmRuns
}

// HoldShips pauses n's asynchronous shipping before each publish until
// the returned func is called.
func HoldShips(n *Node) (release func()) {
	g := make(chan struct{})
	n.replicas.shipGate.Store(&g)
	return func() {
		n.replicas.shipGate.Store(nil)
		close(g)
	}
}

// HoldShipsOf pauses the shipping of id's change sets on n (async
// acknowledgement) until release is called.
func HoldShipsOf(n *Node, id ObjectID) (release func()) {
	g := make(chan struct{})
	n.replicas.shipHeld.Store(id, g)
	return func() {
		n.replicas.shipHeld.Delete(id)
		close(g)
	}
}

// Evict deactivates id on n (its file closed once its handler is done), as
// the idle reaper does.
func Evict(n *Node, id ObjectID) { n.objects.evict(id) }

// PauseLease stops (on) or resumes renewing n's lease.
func PauseLease(n *Node, on bool) { n.cluster.PauseRenewals(on) }
