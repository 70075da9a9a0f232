package cluster

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Object names an object in the directory: a program and an id within it.
type Object struct {
	Program string
	ID      string
}

func (o Object) String() string { return o.Program + "/" + o.ID }

func dirKey(o Object) string {
	return "o." + o.Program + "." + hex.EncodeToString([]byte(o.ID))
}

// Home returns the node that is obj's home, claiming it for this node if it
// has none. An object whose home is one of this data directory's earlier ids
// is reclaimed (its file is here). An object whose home is another node
// that is gone is unavailable until replicas can move it.
func (c *Cluster) Home(ctx context.Context, obj Object) (string, error) {
	c.mu.Lock()
	h, ok := c.homes[obj]
	c.mu.Unlock()
	if ok && (h == c.self || c.Live(h)) {
		return h, nil
	}
	key := dirKey(obj)
	for attempt := 0; attempt < 8; attempt++ {
		if attempt > 0 {
			// A lost compare-and-set reads again; the read may come from a
			// replica of the directory that has not seen the winning
			// write yet, so give it a moment rather than spin.
			select {
			case <-ctx.Done():
				return "", fmt.Errorf("%w: object directory: %v", ErrUnavailable, ctx.Err())
			case <-time.After(time.Duration(attempt) * 25 * time.Millisecond):
			}
		}
		e, err := c.dir.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			if _, err := c.dir.Create(ctx, key, []byte(c.self)); err == nil {
				return c.cache(obj, c.self), nil
			}
			continue // someone else claimed it first: read again
		case err != nil:
			return "", fmt.Errorf("%w: object directory: %v", ErrUnavailable, err)
		}
		holder := string(e.Value())
		if holder == c.self || c.alive(ctx, holder) {
			return c.cache(obj, holder), nil
		}
		c.mu.Lock()
		mine := c.previous[holder]
		c.mu.Unlock()
		if mine {
			// Fencing: the compare-and-set fails if anyone moved it meanwhile.
			if _, err := c.dir.Update(ctx, key, []byte(c.self), e.Revision()); err == nil {
				c.cache(obj, c.self)
				if c.cfg.Moved != nil {
					c.cfg.Moved(obj)
				}
				return c.self, nil
			}
			continue
		}
		if c.cfg.Takeover {
			// The object's successor (the first live node in its order,
			// which holds a copy) takes it over; others send it there.
			succ := c.successor(obj)
			if succ != c.self {
				c.log.Debug("object's home is gone; its successor takes it over", slog.String("object", obj.String()), slog.String("gone", holder), slog.String("successor", succ))
				return succ, nil
			}
			_, err := c.dir.Update(ctx, key, []byte(c.self), e.Revision())
			if err == nil {
				c.log.Info("object taken over", slog.String("object", obj.String()), slog.String("from", holder))
				c.cache(obj, c.self)
				if c.cfg.Moved != nil {
					c.cfg.Moved(obj)
				}
				return c.self, nil
			}
			c.log.Debug("take over", slog.String("object", obj.String()), slog.Any("err", err))
			continue
		}
		return "", fmt.Errorf("%w: %s lived on node %s, which is gone; it is served again once its replica is taken over", ErrObjectUnavailable, obj, holder)
	}
	return "", fmt.Errorf("%w: %s: directory contention", ErrUnavailable, obj)
}

// Ranked returns the live nodes in obj's own order (rendezvous hashing):
// an object's copies are on the first nodes after its home, and when its
// home is gone the first live one takes it over. Every node computes the
// same order from the same live set; a moment's disagreement costs a
// forward or a copy made late, never a second home (the directory's
// compare-and-set decides).
func (c *Cluster) Ranked(obj Object) []string {
	c.mu.Lock()
	ids := make([]string, 0, len(c.seen))
	for id := range c.seen {
		if !c.dead[id] {
			ids = append(ids, id)
		}
	}
	c.mu.Unlock()
	sort.Slice(ids, func(i, j int) bool {
		si, sj := score(obj, ids[i]), score(obj, ids[j])
		if si != sj {
			return si > sj
		}
		return ids[i] < ids[j]
	})
	return ids
}

// Copies returns the n nodes that keep a copy of obj whose home is home:
// the first live ones in its order, the home left out.
func (c *Cluster) Copies(obj Object, home string, n int) []string {
	var out []string
	for _, id := range c.Ranked(obj) {
		if len(out) == n {
			break
		}
		if id != home {
			out = append(out, id)
		}
	}
	return out
}

// WasCopy reports whether gone, a node no longer live, was one of obj's n
// copies besides home: after it left, another node keeps that copy.
func (c *Cluster) WasCopy(obj Object, home, gone string, n int) bool {
	g := score(obj, gone)
	above := 0
	for _, id := range c.Ranked(obj) {
		if id != home && id != gone && score(obj, id) > g {
			above++
		}
	}
	return above < n
}

// successor is the node that takes obj over when its home is gone.
func (c *Cluster) successor(obj Object) string {
	if r := c.Ranked(obj); len(r) > 0 {
		return r[0]
	}
	return c.self
}

// Holder returns the directory's entry for obj without claiming it ("":
// none), for operators.
func (c *Cluster) Holder(ctx context.Context, obj Object) (string, error) {
	e, err := c.dir.Get(ctx, dirKey(obj))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("%w: object directory: %v", ErrUnavailable, err)
	}
	return string(e.Value()), nil
}

func (c *Cluster) cache(obj Object, node string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.homes[obj] = node
	return node
}

// Learn caches node as obj's home, as the node that claimed it in the
// directory says: a read of the directory through a replica that has not
// seen the claim yet would name the node it moved from. A node known dead
// is not learned.
func (c *Cluster) Learn(obj Object, node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.dead[node] {
		c.homes[obj] = node
	}
}

// Forget drops a cached home (a forward found it stale).
func (c *Cluster) Forget(obj Object) {
	c.mu.Lock()
	delete(c.homes, obj)
	c.mu.Unlock()
}

// Reclaim takes back, in the directory, every object whose file is in this
// data directory (Config.LocalObjects) and whose home is one of its earlier
// ids: after a restart its followers and callers find it here again.
func (c *Cluster) Reclaim(ctx context.Context) {
	n := 0
	for _, obj := range c.cfg.LocalObjects() {
		if ctx.Err() != nil {
			return
		}
		if h, err := c.Home(ctx, obj); err == nil && h == c.self {
			n++
		}
	}
	if n > 0 {
		c.log.Info("objects home here", slog.Int("count", n))
	}
}

// score is node id's rendezvous weight for obj.
func score(obj Object, id string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(obj.Program))
	h.Write([]byte{0})
	h.Write([]byte(obj.ID))
	h.Write([]byte{0})
	h.Write([]byte(id))
	return h.Sum64()
}
