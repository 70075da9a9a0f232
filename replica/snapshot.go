package replica

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/store"
)

// Snapshots bound the change stream: a home stores a copy of its file (a
// consistent SQLite copy, zstd-compressed) in the JetStream object store
// SnapshotBucket under the name of its position, then purges the object's
// change sets before that position. The change set at the snapshot's
// position stays, as the subject's first: it names the snapshot a copy
// that is further behind restores from (ErrBehindSnapshot), and it keeps
// the subject's last sequence for the fencing of the next publish.
//
// A snapshot's name is its position, so a node that stores one twice, or a
// fenced home that stores an older one late, never replaces a snapshot
// with different contents: every file at a position of the stream holds
// the same change sets.
const SnapshotBucket = "HOST_SNAPSHOTS"

// ErrBehindSnapshot: the change sets a file needs next were purged after a
// snapshot; restore the snapshot (Restore), then catch up from it.
var ErrBehindSnapshot = errors.New("copy is behind its change stream's snapshot")

// snapshotName is the object store name of subject's snapshot at applied.
func snapshotName(subject string, applied uint64) string {
	return subject + "@" + strconv.FormatUint(applied, 10)
}

func openSnapshots(ctx context.Context, cfg Config) (jetstream.ObjectStore, error) {
	obs, err := cfg.JetStream.ObjectStore(ctx, SnapshotBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		obs, err = cfg.JetStream.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{
			Bucket:      SnapshotBucket,
			Description: "each object's latest snapshot: its file at a position of its change stream, zstd-compressed",
			Storage:     jetstream.FileStorage,
			Replicas:    max(cfg.Replicas, 1),
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			obs, err = cfg.JetStream.ObjectStore(ctx, SnapshotBucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	return obs, nil
}

// First returns the first change set subject still holds (zero: none).
func (l *Log) First(ctx context.Context, subject string) (Tail, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	m, err := l.stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subject))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Tail{}, nil
	}
	if err != nil {
		return Tail{}, fmt.Errorf("%w: change stream: %v", abi.ErrUnavailable, err)
	}
	return Tail{Seq: m.Sequence, Applied: Applied(m.Header), Node: m.Header.Get(hdrNode)}, nil
}

// behind reports whether a file at at needs a snapshot: the first change
// set the stream still holds for subject does not follow at.
func (l *Log) behind(ctx context.Context, subject string, at store.Position) bool {
	first, err := l.First(ctx, subject)
	return err == nil && first.Applied > at.Applied+1
}

// Snapshot stores a snapshot of the object file at src (its home's, or a
// current copy's) as subject's, purges subject's change sets before the
// snapshot's position, and deletes the snapshot at prev (the one it
// replaces, 0 for none). It returns the snapshot's position and its size
// as stored. The file's handlers keep running meanwhile (the copy is made
// through a read-only connection of its own).
func (l *Log) Snapshot(ctx context.Context, subject, src string, prev uint64) (store.Position, int64, error) {
	return l.SnapshotShipped(ctx, subject, src, prev, nil)
}

// SeqOf returns the stream sequence of the change set that brought an
// object to change count applied, once it is shipped.
type SeqOf func(ctx context.Context, applied uint64) (uint64, error)

// SnapshotShipped is Snapshot for a home whose file records no stream
// sequences (its change sets are shipped after they commit): seqOf names
// the copy's, and a copy whose change sets are not all in the stream is
// never stored.
func (l *Log) SnapshotShipped(ctx context.Context, subject, src string, prev uint64, seqOf SeqOf) (store.Position, int64, error) {
	tmp, err := os.CreateTemp(filepath.Dir(src), ".snapshot-*")
	if err != nil {
		return store.Position{}, 0, err
	}
	tmp.Close()
	defer store.RemoveFile(tmp.Name())
	os.Remove(tmp.Name()) // VACUUM INTO makes it
	at, err := store.SnapshotTo(ctx, src, tmp.Name())
	if err != nil {
		return at, 0, err
	}
	if at.Applied <= prev {
		return at, 0, nil // nothing newer than the snapshot it would replace
	}
	if at.Seq == 0 {
		if seqOf == nil {
			return at, 0, fmt.Errorf("%w: snapshot of %s at change %d has no stream sequence", ErrDiverged, src, at.Applied)
		}
		if at.Seq, err = seqOf(ctx, at.Applied); err != nil {
			return at, 0, fmt.Errorf("snapshot of %s at change %d: %w", src, at.Applied, err)
		}
		if err := store.WritePosition(ctx, tmp.Name(), at); err != nil {
			return at, 0, err
		}
	}
	in, err := os.Open(tmp.Name())
	if err != nil {
		return at, 0, err
	}
	defer in.Close()
	pr, pw := io.Pipe()
	go func() {
		zw, err := zstd.NewWriter(pw, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
		if err == nil {
			if _, err = io.Copy(zw, in); err == nil {
				err = zw.Close()
			} else {
				zw.Close()
			}
		}
		pw.CloseWithError(err)
	}()
	info, err := l.snaps.Put(ctx, jetstream.ObjectMeta{
		Name: snapshotName(subject, at.Applied),
		Metadata: map[string]string{
			"applied": strconv.FormatUint(at.Applied, 10),
			"seq":     strconv.FormatUint(at.Seq, 10),
			"sum":     strconv.FormatUint(at.Sum, 16),
		},
	}, pr)
	pr.CloseWithError(err) // unblock the encoder if Put gave up
	if err != nil {
		return at, 0, fmt.Errorf("%w: store snapshot: %v", abi.ErrUnavailable, err)
	}
	// The change set at the snapshot's position stays: it names the
	// snapshot and keeps the subject's last sequence.
	if err := l.stream.Purge(ctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(at.Seq)); err != nil {
		return at, int64(info.Size), fmt.Errorf("%w: purge before the snapshot: %v", abi.ErrUnavailable, err)
	}
	if prev > 0 {
		if err := l.snaps.Delete(ctx, snapshotName(subject, prev)); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return at, int64(info.Size), fmt.Errorf("%w: delete the previous snapshot: %v", abi.ErrUnavailable, err)
		}
	}
	l.stats.snapshots.Add(1)
	return at, int64(info.Size), nil
}

// Restore writes subject's snapshot to the object file at dst (replacing
// what is there) and returns its position; ok is false when the stream
// holds the subject from its first change set, so there is no snapshot to
// restore and an empty file catches up from the start. The restored file
// is checked against the change set that names it.
func (l *Log) Restore(ctx context.Context, subject, dst string) (at store.Position, ok bool, err error) {
	first, err := l.First(ctx, subject)
	if err != nil || first.Applied <= 1 {
		return at, false, err
	}
	name := snapshotName(subject, first.Applied)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return at, false, err
	}
	tmp := dst + ".restore"
	defer store.RemoveFile(tmp)
	// A read of the object store can stall for good (its consumer cannot
	// be made while the stream has no leader, for a while after a node
	// left): a read that gets nothing for the Log's timeout is started
	// again, a few times, then fails for the caller to try later.
	for attempt := 1; ; attempt++ {
		err = l.fetchSnapshot(ctx, name, tmp)
		if !errors.Is(err, errStalled) || attempt == restoreAttempts || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return at, false, err
	}
	at, err = store.ReadPosition(ctx, tmp)
	if err != nil {
		return at, false, fmt.Errorf("%w: snapshot %s: %v", ErrDiverged, name, err)
	}
	if at.Applied != first.Applied || at.Seq != first.Seq {
		return at, false, fmt.Errorf("%w: snapshot %s is at change %d (stream sequence %d), its change set at %d (%d)", ErrDiverged, name, at.Applied, at.Seq, first.Applied, first.Seq)
	}
	if err := store.RemoveFile(dst); err != nil {
		return at, false, err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return at, false, err
	}
	l.stats.restores.Add(1)
	return at, true, nil
}

// restoreAttempts bounds the reads of one snapshot that stall.
const restoreAttempts = 3

// errStalled: a snapshot read got nothing for the Log's timeout.
var errStalled = errors.New("nothing read")

// fetchSnapshot writes the snapshot name, decoded, to a new file at tmp.
func (l *Log) fetchSnapshot(ctx context.Context, name, tmp string) error {
	store.RemoveFile(tmp)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	idle := time.AfterFunc(l.timeout, cancel)
	defer idle.Stop()
	obj, err := l.snaps.Get(ctx, name)
	if err != nil {
		if ctx.Err() != nil && !idle.Stop() {
			return fmt.Errorf("%w: snapshot %s: %w for %v", abi.ErrUnavailable, name, errStalled, l.timeout)
		}
		// A newer snapshot replaced it meanwhile: the caller retries.
		return fmt.Errorf("%w: snapshot %s: %v", abi.ErrUnavailable, name, err)
	}
	defer obj.Close()
	if err := writeDecoded(tmp, idleReader{obj, idle, l.timeout}); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%w: snapshot %s: %w for %v", abi.ErrUnavailable, name, errStalled, l.timeout)
		}
		return fmt.Errorf("%w: snapshot %s: %v", ErrDiverged, name, err)
	}
	return nil
}

// idleReader restarts its timer at each read that returns data.
type idleReader struct {
	r    io.Reader
	t    *time.Timer
	idle time.Duration
}

func (r idleReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.t.Reset(r.idle)
	}
	return n, err
}

// writeDecoded writes the zstd stream r to a new file at path, synced.
func writeDecoded(path string, r io.Reader) error {
	zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(64<<20))
	if err != nil {
		return err
	}
	defer zr.Close()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, zr); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
