package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/cluster"
	"github.com/durable-host/host/host/internal/names"
	"github.com/durable-host/host/vm"
)

// ValidateProgramName reports whether name can name a program.
func ValidateProgramName(name string) error { return names.ValidateProgram(name) }

// ValidateQualifiedProgram reports whether name is a program name with an
// optional tenant prefix: PROGRAM or TENANT.PROGRAM.
func ValidateQualifiedProgram(name string) error { return names.ValidateQualifiedProgram(name) }

// ValidateObjectID reports whether id can name an object of a program.
func ValidateObjectID(id string) error { return names.ValidateID(id) }

// programs is the cluster's program registry: names and versions in a
// JetStream KV bucket (updated with compare-and-set, so versions are
// cluster-wide), module bytes in a JetStream object store by digest, and a
// local copy of each module under DATA/programs. Each node compiles a
// module once and keeps the newest version of every name from a watch.
type programs struct {
	dir    string
	engine *vm.Engine
	kv     jetstream.KeyValue
	blobs  jetstream.ObjectStore
	js     jetstream.JetStream

	// mu guards compiled, this node's own references to the modules of
	// the newest versions, by digest, and newest, the latest version of
	// each name.
	mu       sync.Mutex
	compiled map[string]*vm.Module
	newest   map[string]client.Program

	// fetchMu guards fetching, the module reads in flight by digest.
	fetchMu  sync.Mutex
	fetching map[string]*fetchCall

	// watchDelay holds each update the registry's watch brings for this
	// long (tests: the announcement of a new version must do without it).
	watchDelay atomic.Int64

	// prefetches queues the digests of newest versions to copy to this
	// node's disk ahead of their first use here (see prefetch).
	prefetches chan string
	log        *slog.Logger

	// changed, when set, is told (on a goroutine of its own) the name of a
	// program whose newest version now runs other code than before: the
	// node moves the objects active here onto it.
	changed func(name string)
}

const (
	programsBucket = "host_programs"
	modulesBucket  = "host_modules"
)

func openPrograms(ctx context.Context, log *slog.Logger, dataDir string, js jetstream.JetStream, replicas int, engine *vm.Engine) (*programs, error) {
	dir := filepath.Join(dataDir, "programs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var kv jetstream.KeyValue
	var blobs jetstream.ObjectStore
	err := cluster.RetryJS(ctx, log, "programs", func(ctx context.Context) error {
		var err error
		kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: programsBucket, Replicas: replicas, Storage: jetstream.FileStorage, History: 1,
			Description: "programs: every version of each name",
		})
		if err != nil {
			return err
		}
		blobs, err = js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
			Bucket: modulesBucket, Replicas: replicas, Storage: jetstream.FileStorage,
			Description: "program modules by sha256",
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	return &programs{dir: dir, engine: engine, kv: kv, blobs: blobs, js: js, compiled: map[string]*vm.Module{}, newest: map[string]client.Program{},
		prefetches: make(chan string, maxPrefetches), log: log}, nil
}

// watch keeps newest current as any node uploads, and this node's disk
// holding every newest version's module.
func (p *programs) watch(ctx context.Context) {
	w, err := p.kv.WatchAll(ctx)
	if err != nil {
		return
	}
	defer w.Stop()
	go p.prefetch(ctx)
	for e := range w.Updates() {
		if e == nil || e.Operation() != jetstream.KeyValuePut {
			continue
		}
		if d := time.Duration(p.watchDelay.Load()); d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		}
		var vs []client.Program
		if json.Unmarshal(e.Value(), &vs) == nil && len(vs) > 0 {
			pr := vs[len(vs)-1]
			p.setNewest(pr, nil)
			select {
			case p.prefetches <- pr.Digest:
			default: // a burst past the queue: fetched at first use
			}
		}
	}
}

// maxPrefetches bounds the modules queued for prefetch.
const maxPrefetches = 1024

// prefetch copies each queued module to this node's disk, one at a time,
// until ctx ends. Every node holds every program's newest module before it
// needs it: one that takes an object over (or gets its first call) then
// activates it from disk, not through the module store, whose stream
// leader may be the node that just stopped answering (a read then waits
// out the store's election: a paused home's successor could not activate
// the object for a minute).
func (p *programs) prefetch(ctx context.Context) {
	for {
		var digest string
		select {
		case <-ctx.Done():
			return
		case digest = <-p.prefetches:
		}
		if _, err := os.Stat(filepath.Join(p.dir, digest+".wasm")); err == nil {
			continue
		}
		if _, err := p.fetch(ctx, digest); err != nil && ctx.Err() == nil {
			p.log.Debug("prefetch a module; it is fetched at its first use", slog.String("digest", digest), slog.Any("err", err))
		}
	}
}

func handlerNames(m *vm.Module) []string {
	out := []string{}
	for _, h := range []struct {
		bit  int32
		name string
	}{{abi.HandlerFollow, "follow"}, {abi.HandlerReceive, "receive"}, {abi.HandlerEvent, "event"}, {abi.HandlerAlarm, "alarm"}} {
		if m.Has(h.bit) {
			out = append(out, h.name)
		}
	}
	return out
}

// versions reads every version of name with the entry's revision.
func (p *programs) versions(ctx context.Context, name string) ([]client.Program, uint64, error) {
	e, err := p.kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return p.leaderVersions(ctx, name)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("%w: program registry: %v", ErrUnavailable, err)
	}
	var vs []client.Program
	if err := json.Unmarshal(e.Value(), &vs); err != nil {
		return nil, 0, err
	}
	return vs, e.Revision(), nil
}

// leaderVersions reads name's versions from the registry stream's leader.
// A KV read is a direct get, which any replica may answer, also one that
// has not stored yet the upload another node just made: a name found
// missing is asked again of the leader before it is unknown.
func (p *programs) leaderVersions(ctx context.Context, name string) ([]client.Program, uint64, error) {
	req, err := json.Marshal(map[string]string{"last_by_subj": "$KV." + programsBucket + "." + name})
	if err != nil {
		return nil, 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := p.js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET.KV_"+programsBucket, req)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: program registry: %v", ErrUnavailable, err)
	}
	var resp struct {
		Message *struct {
			Seq  uint64 `json:"seq"`
			Hdrs []byte `json:"hdrs"`
			Data []byte `json:"data"`
		} `json:"message"`
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, 0, fmt.Errorf("%w: program registry: %v", ErrUnavailable, err)
	}
	switch {
	case resp.Error != nil && resp.Error.Code == 404:
		return nil, 0, nil
	case resp.Error != nil:
		return nil, 0, fmt.Errorf("%w: program registry: %s", ErrUnavailable, resp.Error.Description)
	case resp.Message == nil || bytes.Contains(resp.Message.Hdrs, []byte("KV-Operation")):
		return nil, 0, nil // deleted or purged
	}
	var vs []client.Program
	if err := json.Unmarshal(resp.Message.Data, &vs); err != nil {
		return nil, 0, err
	}
	return vs, resp.Message.Seq, nil
}

// upload validates wasm and stores it as the next version of name. The same
// bytes as the latest version are not a new version.
func (p *programs) upload(ctx context.Context, name string, wasm []byte) (client.Program, bool, error) {
	if err := ValidateQualifiedProgram(name); err != nil {
		return client.Program{}, false, err
	}
	m, err := p.load(ctx, vm.Digest(wasm), wasm)
	if err != nil {
		return client.Program{}, false, err
	}
	kept := false
	defer func() {
		if !kept {
			m.Close(ctx)
		}
	}()
	if err := p.storeLocal(m.Digest, wasm); err != nil {
		return client.Program{}, false, err
	}
	if err := p.storeModule(ctx, m.Digest, wasm); err != nil {
		return client.Program{}, false, err
	}
	for attempt := 0; attempt < 10; attempt++ {
		vs, rev, err := p.versions(ctx, name)
		if err != nil {
			return client.Program{}, false, err
		}
		if len(vs) > 0 && vs[len(vs)-1].Digest == m.Digest {
			return vs[len(vs)-1], false, nil
		}
		pr := client.Program{Name: name, Version: len(vs) + 1, Digest: m.Digest, Size: m.Size,
			Exports: m.Exports, Handlers: handlerNames(m), Created: time.Now().UTC()}
		b, _ := json.Marshal(append(vs, pr))
		if rev == 0 {
			_, err = p.kv.Create(ctx, name, b)
		} else {
			_, err = p.kv.Update(ctx, name, b, rev)
		}
		if err != nil {
			continue // another upload won the race: read again
		}
		p.setNewest(pr, m)
		kept = true
		return pr, true, nil
	}
	return client.Program{}, false, fmt.Errorf("%w: program %s: concurrent uploads", ErrUnavailable, name)
}

// storeModule puts wasm in the cluster's module store under digest unless
// it is there. A put that timed out waiting for the store's acks (a
// stream still electing its leader on a fresh or busy cluster) is tried
// again, twice: putting the same bytes again is harmless.
func (p *programs) storeModule(ctx context.Context, digest string, wasm []byte) error {
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		if _, err = p.blobs.GetInfo(ctx, digest); err == nil {
			return nil
		}
		if _, err = p.blobs.PutBytes(ctx, digest, wasm); err == nil {
			return nil
		}
		if ctx.Err() != nil || !(errors.Is(err, jetstream.ErrAsyncPublishTimeout) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded)) {
			break
		}
	}
	return fmt.Errorf("%w: store module: %v", ErrUnavailable, err)
}

func (p *programs) storeLocal(digest string, wasm []byte) error {
	path := filepath.Join(p.dir, digest+".wasm")
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	tmp := fmt.Sprintf("%s.%d.tmp", path, time.Now().UnixNano())
	if err := os.WriteFile(tmp, wasm, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// module returns a reference to the compiled module for digest, which the
// caller closes when done with it: from the engine if it holds it, else
// compiling wasm (or the stored module when wasm is nil: the local copy,
// else the cluster's). The engine compiles each digest once at a time.
func (p *programs) module(ctx context.Context, digest string, wasm []byte) (*vm.Module, error) {
	m, err := p.load(ctx, digest, wasm)
	if err != nil {
		return nil, err
	}
	p.keepIfNewest(digest)
	return m, nil
}

// warm makes sure the newest version of name is compiled on this node, so
// an activation waiting for it holds no object's lock meanwhile.
func (p *programs) warm(ctx context.Context, name string) error {
	pr, err := p.latest(ctx, name)
	if err != nil {
		return err
	}
	m, err := p.module(ctx, pr.Digest, nil)
	if err != nil {
		return err
	}
	return m.Close(ctx)
}

// keepIfNewest keeps a reference of the programs' own to digest's module
// while it is the newest version of some name, so its code outlives the
// objects running it and the next activation does not compile again.
func (p *programs) keepIfNewest(digest string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.compiled[digest]; ok {
		return
	}
	for _, pr := range p.newest {
		if pr.Digest == digest {
			if m, ok := p.engine.Acquire(digest); ok {
				p.compiled[digest] = m
			}
			return
		}
	}
}

func (p *programs) load(ctx context.Context, digest string, wasm []byte) (*vm.Module, error) {
	if m, ok := p.engine.Acquire(digest); ok {
		return m, nil
	}
	if wasm == nil {
		var err error
		if wasm, err = p.fetch(ctx, digest); err != nil {
			return nil, err
		}
	}
	return p.engine.Compile(ctx, wasm)
}

// fetchCall is one read of a module's bytes that callers wanting the same
// digest share.
type fetchCall struct {
	done chan struct{}
	wasm []byte
	err  error
}

// fetch reads digest's module from the local copy, else from the
// cluster's store (keeping a local copy). Concurrent callers for one
// digest share one read: the first events shaped for a program uploaded
// elsewhere, on every socket's writer at once, would otherwise each pull
// the whole module through the cluster.
func (p *programs) fetch(ctx context.Context, digest string) ([]byte, error) {
	path := filepath.Join(p.dir, digest+".wasm")
	if wasm, err := os.ReadFile(path); err == nil {
		return wasm, nil
	}
	p.fetchMu.Lock()
	f, ok := p.fetching[digest]
	if !ok {
		f = &fetchCall{done: make(chan struct{})}
		if p.fetching == nil {
			p.fetching = map[string]*fetchCall{}
		}
		p.fetching[digest] = f
		go func() {
			// Not the first caller's context: the others wait for it too.
			fctx, cancel := context.WithTimeout(context.Background(), fetchWait)
			defer cancel()
			f.wasm, f.err = p.blobs.GetBytes(fctx, digest)
			if f.err != nil {
				f.err = fmt.Errorf("%w: fetch module %s: %v", ErrUnavailable, digest, f.err)
			} else if err := p.storeLocal(digest, f.wasm); err != nil {
				f.err = err
			}
			p.fetchMu.Lock()
			delete(p.fetching, digest)
			p.fetchMu.Unlock()
			close(f.done)
		}()
	}
	p.fetchMu.Unlock()
	select {
	case <-f.done:
		return f.wasm, f.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// fetchWait bounds one read of a module from the cluster's store.
const fetchWait = 30 * time.Second

// setNewest records pr as the newest version of its name and keeps that
// version's module compiled (when this node has it), giving back the
// reference kept for the version it replaces unless another name's newest
// uses the same module. Objects running the old version hold references
// of their own, so its code is closed only when the last of them is done.
func (p *programs) setNewest(pr client.Program, m *vm.Module) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old, had := p.newest[pr.Name]
	if had && pr.Version < old.Version {
		// A registry read older than what this node has seen (a watch
		// behind an activation's fresh read): versions only move on.
		if m != nil {
			m.Close(context.Background())
		}
		return
	}
	p.newest[pr.Name] = pr
	if m != nil {
		if _, kept := p.compiled[pr.Digest]; kept {
			m.Close(context.Background())
		} else {
			p.compiled[pr.Digest] = m
		}
	}
	if !had || old.Digest == pr.Digest {
		return
	}
	if p.changed != nil {
		go p.changed(pr.Name)
	}
	for _, n := range p.newest {
		if n.Digest == old.Digest {
			return
		}
	}
	p.engine.DropPooled(old.Digest)
	if km, ok := p.compiled[old.Digest]; ok {
		delete(p.compiled, old.Digest)
		km.Close(context.Background())
	}
}

// current returns the newest version of name this node knows of, without
// reading the registry.
func (p *programs) current(name string) (client.Program, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pr, ok := p.newest[name]
	return pr, ok
}

// rollback makes the module of version to (0: the version before the
// newest) current again, as a new version that says which one it reuses:
// the registry's history only grows, and every node moves its objects
// onto it as for an upload.
func (p *programs) rollback(ctx context.Context, name string, to int) (client.Program, error) {
	if err := ValidateQualifiedProgram(name); err != nil {
		return client.Program{}, err
	}
	for attempt := 0; attempt < 10; attempt++ {
		vs, rev, err := p.versions(ctx, name)
		if err != nil {
			return client.Program{}, err
		}
		if len(vs) == 0 {
			return client.Program{}, names.UnknownProgram(name)
		}
		latest := vs[len(vs)-1]
		target := to
		if target == 0 {
			target = latest.Version - 1
		}
		if target < 1 || target > len(vs) {
			if len(vs) == 1 {
				return client.Program{}, fmt.Errorf("%w: %s has one version, nothing to roll back to", abi.ErrBadRequest, name)
			}
			return client.Program{}, fmt.Errorf("%w: %s has versions 1 to %d, not %d", abi.ErrBadRequest, name, len(vs), target)
		}
		back := vs[target-1]
		if back.Digest == latest.Digest {
			return client.Program{}, fmt.Errorf("%w: version %d of %s runs the same module as the newest (%d)", abi.ErrBadRequest, target, name, latest.Version)
		}
		// Compiled here first, from the local copy or the cluster's: a
		// module that no longer loads is not made current.
		m, err := p.load(ctx, back.Digest, nil)
		if err != nil {
			return client.Program{}, err
		}
		pr := back
		pr.Version, pr.Created, pr.RollbackOf = len(vs)+1, time.Now().UTC(), back.Version
		b, _ := json.Marshal(append(vs, pr))
		if _, err := p.kv.Update(ctx, name, b, rev); err != nil {
			m.Close(ctx)
			continue // another upload or rollback won the race: read again
		}
		p.setNewest(pr, m)
		return pr, nil
	}
	return client.Program{}, fmt.Errorf("%w: program %s: concurrent uploads", ErrUnavailable, name)
}

// isNewest reports whether pr is the newest version of its name.
func (p *programs) isNewest(pr client.Program) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.newest[pr.Name].Digest == pr.Digest
}

// latest returns the newest version of name, or ErrUnknownProgram.
func (p *programs) latest(ctx context.Context, name string) (client.Program, error) {
	p.mu.Lock()
	pr, ok := p.newest[name]
	p.mu.Unlock()
	if ok {
		return pr, nil
	}
	return p.latestFresh(ctx, name)
}

// latestFresh reads the registry, for activations: an object picks up the
// newest version when it activates.
func (p *programs) latestFresh(ctx context.Context, name string) (client.Program, error) {
	vs, _, err := p.versions(ctx, name)
	if err != nil {
		return client.Program{}, err
	}
	if len(vs) == 0 {
		return client.Program{}, names.UnknownProgram(name)
	}
	pr := vs[len(vs)-1]
	p.setNewest(pr, nil)
	return pr, nil
}

// list returns the latest version of every program, or every version of
// name when name is not empty.
func (p *programs) list(ctx context.Context, name string) ([]client.Program, error) {
	return p.listIn(ctx, name, nil)
}

// names returns every program name keep accepts.
func (p *programs) names(ctx context.Context, keep func(string) bool) ([]string, error) {
	keys, err := p.kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: program registry: %v", ErrUnavailable, err)
	}
	out := keys[:0]
	for _, k := range keys {
		if keep == nil || keep(k) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out, nil
}

// listIn is list restricted to the names keep accepts.
func (p *programs) listIn(ctx context.Context, name string, keep func(string) bool) ([]client.Program, error) {
	if name != "" {
		vs, _, err := p.versions(ctx, name)
		if err != nil {
			return nil, err
		}
		if len(vs) == 0 {
			return nil, names.UnknownProgram(name)
		}
		return vs, nil
	}
	keys, err := p.names(ctx, keep)
	if err != nil {
		return nil, err
	}
	out := []client.Program{}
	for _, k := range keys {
		vs, _, err := p.versions(ctx, k)
		if err != nil {
			return nil, err
		}
		if len(vs) > 0 {
			out = append(out, vs[len(vs)-1])
		}
	}
	return out, nil
}

func (p *programs) close(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.compiled {
		m.Close(ctx)
	}
	p.compiled = map[string]*vm.Module{}
}
