package vm

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Instances made ahead. A fresh instance of a Go guest costs about 10 ms
// and 8 MB (its runtime starts in _initialize), most of an object's first
// call. The engine keeps a few instances made ahead, each of a module that
// was just instantiated, at the memory limit it was instantiated with, so
// the next activation of that module takes one ready. A pooled instance
// has run nothing but _initialize and is handed out once: an instance
// never goes back to the pool, so nothing of one object reaches another.
const (
	// DefaultPoolSize is how many instances the engine keeps made ahead.
	DefaultPoolSize = 4
	// poolIdle: a pooled instance nobody took for this long is closed.
	poolIdle = 30 * time.Second
)

type poolKey struct {
	digest string
	pages  uint32
}

type pooled struct {
	key  poolKey
	inst *Instance
	ref  *Module // the pool's reference to the module while pooled
	at   time.Time
}

// instancePool holds the instances made ahead, at most size of them
// (those being made count).
type instancePool struct {
	mu      sync.Mutex
	items   []pooled
	filling map[poolKey]bool
	closed  bool
	wg      sync.WaitGroup

	hits, misses atomic.Int64
}

// PoolStats counts activations that found an instance made ahead (Hits)
// and those that made their own (Misses).
type PoolStats struct{ Hits, Misses int64 }

// PoolStats returns the pool's counters.
func (e *Engine) PoolStats() PoolStats {
	return PoolStats{Hits: e.pool.hits.Load(), Misses: e.pool.misses.Load()}
}

// InstantiatePooled is InstantiateLimited for an activation: it takes an
// instance made ahead for m at pages when there is one and, with ahead
// set (m is a current version, whose next activation is likely), starts
// making the next one for whoever activates m after. hit reports which it
// was.
func (e *Engine) InstantiatePooled(ctx context.Context, m *Module, pages uint32, ahead bool) (inst *Instance, hit bool, err error) {
	if e.cfg.PoolSize <= 0 {
		inst, err = e.InstantiateLimited(ctx, m, pages)
		return inst, false, err
	}
	key := poolKey{m.Digest, pages}
	inst = e.take(key, m)
	if ahead {
		e.refill(key, m)
	}
	if inst != nil {
		e.pool.hits.Add(1)
		return inst, true, nil
	}
	e.pool.misses.Add(1)
	inst, err = e.InstantiateLimited(ctx, m, pages)
	return inst, false, err
}

// take removes and returns a pooled instance for key, now m's.
func (e *Engine) take(key poolKey, m *Module) *Instance {
	p := &e.pool
	p.mu.Lock()
	var found *pooled
	for i := range p.items {
		if p.items[i].key == key {
			it := p.items[i]
			found = &it
			p.items = append(p.items[:i], p.items[i+1:]...)
			break
		}
	}
	p.mu.Unlock()
	if found == nil {
		return nil
	}
	found.inst.module = m
	found.ref.Close(context.Background())
	return found.inst
}

// refill starts making an instance for key in the background unless one
// is pooled or being made, making room by closing the oldest.
func (e *Engine) refill(key poolKey, m *Module) {
	p := &e.pool
	p.mu.Lock()
	if p.closed || p.filling[key] {
		p.mu.Unlock()
		return
	}
	for _, it := range p.items {
		if it.key == key {
			p.mu.Unlock()
			return
		}
	}
	var evicted []pooled
	for len(p.items) > 0 && len(p.items)+len(p.filling) >= e.cfg.PoolSize {
		evicted = append(evicted, p.items[0])
		p.items = p.items[1:]
	}
	if len(p.items)+len(p.filling) >= e.cfg.PoolSize {
		p.mu.Unlock()
		closePooled(evicted)
		return
	}
	ref, ok := e.Acquire(key.digest)
	if !ok {
		p.mu.Unlock()
		closePooled(evicted)
		return
	}
	if p.filling == nil {
		p.filling = map[poolKey]bool{}
	}
	p.filling[key] = true
	p.wg.Add(1)
	p.mu.Unlock()
	closePooled(evicted)
	go func() {
		defer p.wg.Done()
		inst, err := e.InstantiateLimited(context.Background(), ref, key.pages)
		p.mu.Lock()
		delete(p.filling, key)
		if err == nil && !p.closed {
			p.items = append(p.items, pooled{key: key, inst: inst, ref: ref, at: time.Now()})
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		if inst != nil {
			inst.Close(context.Background())
		}
		ref.Close(context.Background())
	}()
}

// DropPooled closes the instances made ahead for the module digest (a
// version replaced by a newer one: its code is not kept for them).
func (e *Engine) DropPooled(digest string) {
	closePooled(e.pool.remove(func(it pooled) bool { return it.key.digest == digest }))
}

// expirePool closes the instances pooled for longer than poolIdle.
func (e *Engine) expirePool(now time.Time) {
	closePooled(e.pool.remove(func(it pooled) bool { return now.Sub(it.at) >= poolIdle }))
}

// remove takes the pooled instances drop picks out of the pool.
func (p *instancePool) remove(drop func(pooled) bool) []pooled {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []pooled
	keep := p.items[:0]
	for _, it := range p.items {
		if drop(it) {
			out = append(out, it)
		} else {
			keep = append(keep, it)
		}
	}
	clear(p.items[len(keep):])
	p.items = keep
	return out
}

// closePool waits for the instances being made and closes every pooled
// one; none is made after.
func (e *Engine) closePool() {
	p := &e.pool
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.wg.Wait()
	p.mu.Lock()
	items := p.items
	p.items = nil
	p.mu.Unlock()
	closePooled(items)
}

func closePooled(items []pooled) {
	for _, it := range items {
		it.inst.Close(context.Background())
		it.ref.Close(context.Background())
	}
}

// Pooled is how many instances are made ahead now.
func (e *Engine) Pooled() int {
	e.pool.mu.Lock()
	defer e.pool.mu.Unlock()
	return len(e.pool.items)
}
