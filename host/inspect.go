package host

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/durable-host/host/host/api"
	"github.com/durable-host/host/host/cluster"
	"github.com/durable-host/host/host/internal/tenancy"
	"github.com/durable-host/host/store"
)

// Inspection: listing objects, reading an object's state and log, for
// `host objects`, `host state` and `host log`. Every read goes through a
// read-only connection of its own to the object's file on its home: one
// read transaction, beside the object's handlers, never under its lock,
// and never activating it (an idle object stays idle, and a read of one
// never used claims nothing).

// Inspection page sizes: the default and the most a request may ask for.
const (
	DefaultPage = 100
	MaxPage     = 1000
)

// Inspection types, as the API answers them.
type (
	ObjectsQuery = api.ObjectsQuery
	ObjectPage   = api.ObjectPage
	ObjectInfo   = api.ObjectInfo
	StateQuery   = api.StateQuery
	StatePage    = api.StatePage
	LogQuery     = api.LogQuery
	LogPage      = api.LogPage
)

func pageSize(limit int) int {
	if limit <= 0 {
		return DefaultPage
	}
	return min(limit, MaxPage)
}

// ListObjects lists the objects q selects, across the cluster, in name
// order: each live node lists the files it holds as their home.
func (n *Node) ListObjects(ctx context.Context, q ObjectsQuery) (ObjectPage, error) {
	q.Limit = pageSize(q.Limit)
	if q.Program != "" {
		if _, err := n.programs.latest(ctx, q.Program); err != nil {
			return ObjectPage{}, err
		}
	}
	nodes := n.cluster.Nodes()
	type answer struct {
		node string
		page ObjectPage
		err  error
	}
	answers := make([]answer, len(nodes))
	var wg sync.WaitGroup
	for i, node := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := opObjects.on(ctx, n, node.ID, q)
			answers[i] = answer{node.ID, p, err}
		}()
	}
	wg.Wait()
	page := ObjectPage{Objects: []ObjectInfo{}}
	byName := map[string]int{}
	more := false
	for _, a := range answers {
		if a.err != nil {
			n.log.Warn("list a node's objects", slog.String("node", a.node), slog.Any("err", a.err))
			page.Unreachable = append(page.Unreachable, a.node)
			continue
		}
		more = more || a.page.Next != ""
		for _, o := range a.page.Objects {
			j, dup := byName[o.Object]
			if !dup {
				byName[o.Object] = len(page.Objects)
				page.Objects = append(page.Objects, o)
				continue
			}
			// Two nodes have a home file for it: one was taken over and
			// has not retired its file yet. The directory says which.
			id, err := ParseObjectID(o.Object)
			if err != nil {
				continue
			}
			if h, err := n.cluster.Holder(ctx, cluster.Object(id)); err == nil && h == o.Home {
				page.Objects[j] = o
			}
		}
	}
	slices.SortFunc(page.Objects, func(a, b ObjectInfo) int { return cmp.Compare(a.Object, b.Object) })
	if len(page.Objects) > q.Limit {
		page.Objects, more = page.Objects[:q.Limit], true
	}
	if more && len(page.Objects) > 0 {
		page.Next = page.Objects[len(page.Objects)-1].Object
	}
	return page, nil
}

// opObjects lists the objects homed on the node asked.
var opObjects = nodeOp("objects", quickWait, (*Node).objectsLocal)

// objectsLocal lists the objects q selects whose home file is here, up to
// q.Limit of them after q.After; Next is set when more are left.
func (n *Node) objectsLocal(_ context.Context, q ObjectsQuery) (ObjectPage, error) {
	var ids []ObjectID
	for _, id := range objectFiles(filepath.Join(n.cfg.DataDir, "objects")) {
		if q.Program != "" && id.Program != q.Program ||
			q.Program == "" && !q.All && tenancy.TenantOf(id.Program) != q.Tenant ||
			id.String() <= q.After {
			continue
		}
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b ObjectID) int { return cmp.Compare(a.String(), b.String()) })
	page := ObjectPage{Objects: []ObjectInfo{}}
	limit := pageSize(q.Limit)
	if len(ids) > limit {
		ids = ids[:limit]
		page.Next = ids[limit-1].String()
	}
	for _, id := range ids {
		info := ObjectInfo{Object: id.String(), Home: n.id}
		path := n.objectPath(id)
		for _, f := range []string{path, path + "-wal"} {
			if st, err := os.Stat(f); err == nil {
				info.Bytes += st.Size()
				if st.ModTime().After(info.Modified) {
					info.Modified = st.ModTime().UTC()
				}
			}
		}
		info.Active, info.LastUsed, info.Version = n.objects.lastUsed(id)
		page.Objects = append(page.Objects, info)
	}
	return page, nil
}

// State reads a page of id's state, and its pending alarm.
func (n *Node) State(ctx context.Context, id ObjectID, q StateQuery) (StatePage, error) {
	if err := n.inspectable(ctx, id); err != nil {
		return StatePage{}, err
	}
	q.Object = id.String()
	return onHolder(ctx, n, id, opState, q)
}

var opState = nodeOp("state", quickWait, (*Node).stateLocal)

func (n *Node) stateLocal(ctx context.Context, q StateQuery) (StatePage, error) {
	id, err := ParseObjectID(q.Object)
	if err != nil {
		return StatePage{}, err
	}
	path := n.objectPath(id)
	pairs, more, err := store.ReadState(ctx, path, []byte(q.Prefix), q.After, pageSize(q.Limit))
	if err != nil {
		return StatePage{}, n.noFile(id, err)
	}
	page := StatePage{Object: q.Object, Home: n.id, Pairs: make([]api.Pair, 0, len(pairs))}
	for _, p := range pairs {
		page.Pairs = append(page.Pairs, api.PairOf(p))
	}
	if more {
		page.Next = pairs[len(pairs)-1].Key
	}
	if a, ok, err := store.ReadAlarm(ctx, path); err != nil {
		return StatePage{}, n.noFile(id, err)
	} else if ok {
		page.Alarm = &a
	}
	return page, nil
}

// Log reads a page of id's events.
func (n *Node) Log(ctx context.Context, id ObjectID, q LogQuery) (LogPage, error) {
	if err := n.inspectable(ctx, id); err != nil {
		return LogPage{}, err
	}
	q.Object = id.String()
	return onHolder(ctx, n, id, opLog, q)
}

var opLog = nodeOp("log", quickWait, (*Node).logLocal)

func (n *Node) logLocal(ctx context.Context, q LogQuery) (LogPage, error) {
	id, err := ParseObjectID(q.Object)
	if err != nil {
		return LogPage{}, err
	}
	path := n.objectPath(id)
	head, err := store.ReadHead(ctx, path)
	if err != nil {
		return LogPage{}, n.noFile(id, err)
	}
	limit := pageSize(q.Limit)
	evs, err := store.Read(ctx, path, store.Query{After: q.After, Through: head, Topic: q.Topic, Limit: limit})
	if err != nil && !errors.Is(err, store.ErrNoLog) {
		return LogPage{}, err
	}
	page := LogPage{Object: q.Object, Home: n.id, Head: head, Events: make([]api.LogEvent, 0, len(evs))}
	for i := range evs {
		page.Events = append(page.Events, api.LogEventOf(&evs[i]))
	}
	if len(evs) == limit && evs[len(evs)-1].Seq < head {
		page.Next = evs[len(evs)-1].Seq
	}
	return page, nil
}

// inspectable checks id names an object of a known program.
func (n *Node) inspectable(ctx context.Context, id ObjectID) error {
	if err := id.Validate(); err != nil {
		return err
	}
	_, err := n.programs.latest(ctx, id.Program)
	return err
}

// noFile says, for a read that found no file, that the object has no
// state yet: never used (or used only on a node gone for good).
func (n *Node) noFile(id ObjectID, err error) error {
	if errors.Is(err, store.ErrNoFile) {
		return fmt.Errorf("%w: %s has no state yet (no call has used it)", ErrUnknownObject, id)
	}
	return err
}

// onHolder runs o on the node the directory names id's holder, which has
// its file; this node when no node holds it yet (a single node's objects,
// or one never used, which then has no file). It claims nothing.
func onHolder[Req, Rep any](ctx context.Context, n *Node, id ObjectID, o *op[Req, Rep], req Req) (Rep, error) {
	h, err := n.cluster.Holder(ctx, cluster.Object(id))
	if err != nil {
		var zero Rep
		return zero, err
	}
	if h == "" || n.objects.isActive(id) {
		h = n.id
	}
	return o.on(ctx, n, h, req)
}

// lastUsed reports whether id is active here, and when so the time of
// its last call and the version of its program it runs.
func (r *objects) lastUsed(id ObjectID) (bool, *time.Time, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o, ok := r.active[id]
	if !ok {
		return false, nil, 0
	}
	t := o.lastUsed.UTC()
	return true, &t, int(o.running.Load())
}
