// Package replica keeps copies of objects' files on other nodes, so an
// object outlives its home: change capture's output (store change sets) is
// compressed with zstd and published to a JetStream subject of the object,
// the replicated, ordered log of its committed changes, before the
// transaction commits and before the call is answered (the output gate).
// Copies apply that stream to their own SQLite file, checking that
// positions are contiguous and a rolling checksum matches; a node taking an
// object over catches up from the stream to its end, then publishes a
// takeover mark that fences the old home: JetStream refuses its next
// publish (expected last subject sequence), so it never commits again.
//
// It does not decide where objects live (the cluster's directory does) nor
// when a node is gone; the host tells it which objects this node copies.
package replica

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc64"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/store"
)

// Stream is the JetStream stream holding every object's change sets, one
// subject per object (Subject).
const (
	Stream        = "HOST_CHANGES"
	subjectPrefix = "host.changes."
)

// Message headers of a change set.
const (
	hdrApplied = "Host-Applied" // the position's count after this change set
	hdrSum     = "Host-Sum"     // the rolling checksum after it, hex
	hdrEnc     = "Host-Enc"     // "zstd" or absent (raw)
	hdrMark    = "Host-Mark"    // present on a takeover mark (no changes)
	hdrNode    = "Host-Node"    // the node that shipped it
)

// Errors.
var (
	// ErrDiverged: a copy's position does not continue the stream (a gap,
	// a checksum mismatch, a change set that does not apply). The copy is
	// discarded and made again; nothing is skipped.
	ErrDiverged = errors.New("copy diverged from its change stream")
	// ErrFenced is store.ErrFenced: another node took the object over.
	ErrFenced = store.ErrFenced
)

var crcTable = crc64.MakeTable(crc64.ECMA)

// Chain is the rolling checksum after a change set: the CRC-64 of every
// change set of the object, in order.
func Chain(sum uint64, changes []byte) uint64 { return crc64.Update(sum, crcTable, changes) }

// Subject is the subject of an object's change stream.
func Subject(program, id string) string {
	return subjectPrefix + program + "." + hex.EncodeToString([]byte(id))
}

// Config is what a Log uses.
type Config struct {
	JetStream jetstream.JetStream
	// Replicas is the stream's own replication in the NATS cluster (R1 on
	// one server, R3 on three or more); zero means 1.
	Replicas int
	// MaxPayload is the largest message NATS takes; a change set that
	// compresses to more is refused with abi.ErrTooLarge. Zero means 1 MB.
	MaxPayload int
	// Timeout bounds each read of the stream and each takeover mark: a
	// stream without a leader (an election) fails the step, and the
	// caller retries. Zero means DefaultTimeout.
	Timeout time.Duration
}

// DefaultTimeout bounds one stream operation.
const DefaultTimeout = 5 * time.Second

// Log is the replicated log of every object's change sets.
type Log struct {
	stats   stats
	timeout time.Duration
	js      jetstream.JetStream
	stream  jetstream.Stream
	snaps   jetstream.ObjectStore
	max     int
	enc     *zstd.Encoder
	dec     *zstd.Decoder
}

// Stats counts what a Log shipped and applied.
type Stats struct {
	Shipped      int64 // change sets published (marks included)
	RawBytes     int64 // their size before compression
	ShippedBytes int64 // their size on the wire (message bodies)
	Applied      int64 // change sets applied to a file here (copies, catch-ups)
	Snapshots    int64 // snapshots stored
	Restores     int64 // files restored from a snapshot
}

type stats struct{ shipped, raw, wire, applied, snapshots, restores atomic.Int64 }

// Stats returns the counts so far.
func (l *Log) Stats() Stats {
	return Stats{l.stats.shipped.Load(), l.stats.raw.Load(), l.stats.wire.Load(), l.stats.applied.Load(), l.stats.snapshots.Load(), l.stats.restores.Load()}
}

// Open creates (or finds) the change stream.
func Open(ctx context.Context, cfg Config) (*Log, error) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1), zstd.WithLowerEncoderMem(true))
	if err != nil {
		return nil, err
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(256<<20))
	if err != nil {
		return nil, err
	}
	// An existing stream is used as it is: updating it from a node that
	// is starting (its own server not yet counted by the meta layer) can
	// fail placement, and nothing here changes its config.
	st, err := cfg.JetStream.Stream(ctx, Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st, err = createStream(ctx, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("change stream: %w", err)
	}
	snaps, err := openSnapshots(ctx, cfg)
	if err != nil {
		return nil, err
	}
	l := &Log{js: cfg.JetStream, stream: st, snaps: snaps, max: cfg.MaxPayload, enc: enc, dec: dec, timeout: cfg.Timeout}
	if l.timeout <= 0 {
		l.timeout = DefaultTimeout
	}
	if l.max <= 0 {
		l.max = 1 << 20
	}
	return l, nil
}

func createStream(ctx context.Context, cfg Config) (jetstream.Stream, error) {
	st, err := cfg.JetStream.CreateStream(ctx, jetstream.StreamConfig{
		Name:        Stream,
		Description: "each object's committed change sets, zstd-compressed, in commit order",
		Subjects:    []string{subjectPrefix + ">"},
		Storage:     jetstream.FileStorage,
		Replicas:    max(cfg.Replicas, 1),
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardNew,
	})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return cfg.JetStream.Stream(ctx, Stream) // another node made it first
	}
	return st, err
}

// Close releases the codec.
func (l *Log) Close() {
	l.enc.Close()
	l.dec.Close()
}

// minCompress is the change set size below which zstd is not tried: its
// frame costs more than it saves.
const minCompress = 64

// Ship publishes one change set of an object whose file is at at, and
// returns the position after it. JetStream refuses it unless the subject's
// last message is the one at names (expected last subject sequence): a
// node whose object was taken over gets ErrFenced.
func (l *Log) Ship(ctx context.Context, subject, node string, changes []byte, at store.Position) (store.Position, error) {
	next, wire, err := l.publish(ctx, subject, node, changes, at, false)
	if err != nil {
		return at, err
	}
	l.stats.shipped.Add(1)
	l.stats.raw.Add(int64(len(changes)))
	l.stats.wire.Add(int64(wire))
	return next, nil
}

// publish sends the change set after at on subject (a takeover mark when
// mark is set: no changes) with the expectation that the subject's last
// message is the one at names, and returns the position after it and the
// size of the body it sent.
func (l *Log) publish(ctx context.Context, subject, node string, changes []byte, at store.Position, mark bool) (store.Position, int, error) {
	next := store.Position{Applied: at.Applied + 1, Sum: Chain(at.Sum, changes)}
	m := nats.NewMsg(subject)
	m.Header.Set(hdrNode, node)
	m.Header.Set(hdrApplied, strconv.FormatUint(next.Applied, 10))
	m.Header.Set(hdrSum, strconv.FormatUint(next.Sum, 16))
	what := "ship change set"
	if mark {
		m.Header.Set(hdrMark, "takeover")
		what = "takeover mark"
	}
	m.Data = changes
	if len(changes) >= minCompress {
		if z := l.enc.EncodeAll(changes, nil); len(z) < len(changes) {
			m.Data = z
			m.Header.Set(hdrEnc, "zstd")
		}
	}
	if len(m.Data) > l.max-1024 {
		return at, 0, fmt.Errorf("%w: the transaction's changes are %d bytes compressed, over the %d a replicated change set can carry", abi.ErrTooLarge, len(m.Data), l.max-1024)
	}
	// The message id makes a publish the client retried (its first
	// answer lost in a leader election) a duplicate JetStream answers
	// with the first one's sequence, not a second change set refused as
	// out of order.
	id := subject + ":" + strconv.FormatUint(next.Applied, 10) + ":" + strconv.FormatUint(next.Sum, 16)
	ack, err := l.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(at.Seq), jetstream.WithExpectStream(Stream), jetstream.WithMsgID(id))
	// The stream's leader refuses an expected-sequence publish while an
	// earlier message of the subject is still in process there (its
	// "wrong last sequence" without a sequence): this node's previous
	// change set, acknowledged a moment before the leader let go of it.
	// That is no fencing: the publish is tried again.
	for wait := time.Millisecond; isInProcess(err) && wait <= 256*time.Millisecond && ctx.Err() == nil; wait *= 2 {
		time.Sleep(wait)
		ack, err = l.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(at.Seq), jetstream.WithExpectStream(Stream), jetstream.WithMsgID(id))
	}
	if err != nil {
		if isWrongLast(err) {
			return at, 0, fmt.Errorf("%w (%s moved past stream sequence %d)", ErrFenced, subject, at.Seq)
		}
		return at, 0, fmt.Errorf("%w: %s: %v", abi.ErrUnavailable, what, err)
	}
	next.Seq = ack.Sequence
	return next, len(m.Data), nil
}

// MaxChanges is the largest change set Ship takes uncompressed: one that
// compresses well may be larger.
func (l *Log) MaxChanges() int { return l.max - 1024 }

// Shipper returns a store.Shipper shipping node's changes to subject, each
// publish bounded by timeout.
func (l *Log) Shipper(subject, node string, timeout time.Duration) store.Shipper {
	return func(changes []byte, at store.Position) (store.Position, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return l.Ship(ctx, subject, node, changes, at)
	}
}

// isInProcess reports the leader's refusal of an expected-sequence
// publish while another message of its subject is in process (JetStream's
// error 10164, "wrong last sequence" with no sequence).
func isInProcess(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrWrongLastSequenceConstant
}

// jsErrWrongLastSequenceConstant is nats-server's
// JSStreamWrongLastSequenceConstantErr, which nats.go does not name.
const jsErrWrongLastSequenceConstant jetstream.ErrorCode = 10164

func isWrongLast(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// Tail is the last change set of an object's stream.
type Tail struct {
	Seq     uint64 `json:"seq"`     // its stream sequence (0: none)
	Applied uint64 `json:"applied"` // the position count it brings the object to
	Sum     uint64 `json:"-"`       // the rolling checksum it brings the object to
	Node    string `json:"node"`    // the node that shipped it
}

// Last returns the last change set of subject.
func (l *Log) Last(ctx context.Context, subject string) (Tail, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	m, err := l.stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Tail{}, nil
	}
	if err != nil {
		return Tail{}, fmt.Errorf("%w: change stream: %v", abi.ErrUnavailable, err)
	}
	sum, _ := strconv.ParseUint(m.Header.Get(hdrSum), 16, 64)
	return Tail{Seq: m.Sequence, Applied: Applied(m.Header), Sum: sum, Node: m.Header.Get(hdrNode)}, nil
}

// Change is one change set read from the stream.
type Change struct {
	At      store.Position // the position after it
	Changes []byte         // raw
	Node    string         // the node that shipped it
	Mark    bool           // a takeover mark (no changes)
}

// Applied is the position count a stored change set brings its object to
// (0 when the message has none).
func Applied(h nats.Header) uint64 {
	v, _ := strconv.ParseUint(h.Get(hdrApplied), 10, 64)
	return v
}

// Shipped returns the node that shipped a stored change set.
func Shipped(h nats.Header) string { return h.Get(hdrNode) }

// Decode checks a stored change set (stream sequence seq) against the
// position it must continue: the next in count, and the rolling checksum
// over its raw bytes as its home computed it. Anything else is
// ErrDiverged.
func (l *Log) Decode(seq uint64, h nats.Header, data []byte, at store.Position) (Change, error) {
	applied, err1 := strconv.ParseUint(h.Get(hdrApplied), 10, 64)
	sum, err2 := strconv.ParseUint(h.Get(hdrSum), 16, 64)
	if err1 != nil || err2 != nil {
		return Change{}, fmt.Errorf("%w: stream sequence %d has no position", ErrDiverged, seq)
	}
	if applied != at.Applied+1 {
		return Change{}, fmt.Errorf("%w: stream sequence %d is change %d, the copy is at %d", ErrDiverged, seq, applied, at.Applied)
	}
	raw := data
	if h.Get(hdrEnc) == "zstd" {
		if raw, err1 = l.dec.DecodeAll(data, nil); err1 != nil {
			return Change{}, fmt.Errorf("%w: stream sequence %d: %v", ErrDiverged, seq, err1)
		}
	}
	if Chain(at.Sum, raw) != sum {
		return Change{}, fmt.Errorf("%w: checksum mismatch at stream sequence %d (change %d)", ErrDiverged, seq, applied)
	}
	return Change{At: store.Position{Applied: applied, Seq: seq, Sum: sum}, Changes: raw, Node: h.Get(hdrNode), Mark: h.Get(hdrMark) != ""}, nil
}

// Next returns the change set after at on subject, or ok false when at is
// the stream's end for it.
func (l *Log) Next(ctx context.Context, subject string, at store.Position) (c Change, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	m, err := l.stream.GetMsg(ctx, at.Seq+1, jetstream.WithGetMsgSubject(subject))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Change{}, false, nil
	}
	if err != nil {
		return Change{}, false, fmt.Errorf("%w: change stream: %v", abi.ErrUnavailable, err)
	}
	c, err = l.Decode(m.Sequence, m.Header, m.Data, at)
	return c, err == nil, err
}

// Apply applies one change set to f in a transaction of its own, with its
// position, and counts it.
func (l *Log) Apply(f *store.File, c Change) error { return l.applyBatch(f, []Change{c}) }

// CatchUp applies to f every change set of subject after f's position, to
// the stream's end, and returns the position reached. A copy that does not
// continue the stream fails with ErrDiverged and is left as it was at the
// last change that did; one whose next change sets were purged after a
// snapshot fails with ErrBehindSnapshot. A few change sets are read one by one; a longer
// way behind is read in batches through a consumer of its own and applied
// a batch per transaction.
func (l *Log) CatchUp(ctx context.Context, subject string, f *store.File) (store.Position, int, error) {
	at, n, err := l.catchUp(ctx, subject, f)
	if errors.Is(err, ErrDiverged) && l.behind(ctx, subject, at) {
		err = fmt.Errorf("%w (at change %d): %v", ErrBehindSnapshot, at.Applied, err)
	}
	return at, n, err
}

func (l *Log) catchUp(ctx context.Context, subject string, f *store.File) (store.Position, int, error) {
	at := f.Position()
	tail, err := l.Last(ctx, subject)
	if err != nil || tail.Seq <= at.Seq {
		return at, 0, err
	}
	if tail.Applied > at.Applied+batchFrom {
		if l.behind(ctx, subject, at) {
			return at, 0, fmt.Errorf("%w: the stream holds no change %d", ErrDiverged, at.Applied+1)
		}
		return l.catchUpBatches(ctx, subject, f, at, tail)
	}
	n := 0
	for {
		c, ok, err := l.Next(ctx, subject, at)
		if err != nil || !ok {
			return at, n, err
		}
		if err := l.Apply(f, c); err != nil {
			return at, n, err
		}
		at = c.At
		n++
	}
}

// Catch-up batches: how far behind a copy must be to read through a
// consumer, and how many change sets one transaction applies.
const (
	batchFrom = 16
	batchSize = 256
)

// consumerIdle is how long the server keeps a catch-up's consumer nobody
// fetches from.
const consumerIdle = 30 * time.Second

func (l *Log) catchUpBatches(ctx context.Context, subject string, f *store.File, at store.Position, tail Tail) (store.Position, int, error) {
	cctx, cancel := context.WithTimeout(ctx, l.timeout)
	cons, err := l.stream.OrderedConsumer(cctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    at.Seq + 1,
		// Each Fetch (re)creates the consumer; without a bound a stream
		// that cannot make one (no leader) holds the caller for good.
		MaxResetAttempts: 3,
		// A stream takes at most 1,000 consumers (the server's default).
		// Each Fetch deletes the consumer before it, in the background;
		// the last is deleted below, and one whose delete failed (the
		// stream without a leader) goes after this idle time, not the
		// library's 5 minutes: after a few faults, catch-ups of a few
		// hundred objects' copies left more than 1,000 behind, and every
		// copy's catch-up was refused until they lapsed.
		InactiveThreshold: consumerIdle,
	})
	cancel()
	if err != nil {
		return at, 0, fmt.Errorf("%w: change stream: %v", abi.ErrUnavailable, err)
	}
	defer func() {
		if info := cons.CachedInfo(); info != nil {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
				defer cancel()
				l.stream.DeleteConsumer(ctx, info.Name)
			}()
		}
	}()
	n := 0
	for at.Seq < tail.Seq {
		// Exactly what is left (change counts are contiguous), so the last
		// batch does not wait for more.
		want := int(min(batchSize, tail.Applied-at.Applied))
		if tail.Applied <= at.Applied {
			want = 1
		}
		batch, err := cons.Fetch(want, jetstream.FetchMaxWait(l.timeout))
		if err != nil {
			return at, n, fmt.Errorf("%w: change stream: %v", abi.ErrUnavailable, err)
		}
		var cs []Change
		next := at
		for m := range batch.Messages() {
			meta, err := m.Metadata()
			if err != nil {
				return at, n, fmt.Errorf("%w: change stream: %v", abi.ErrUnavailable, err)
			}
			c, err := l.Decode(meta.Sequence.Stream, m.Headers(), m.Data(), next)
			if err != nil {
				// Apply what continued the stream, then report.
				if aerr := l.applyBatch(f, cs); aerr != nil {
					return at, n, aerr
				}
				return next, n + len(cs), err
			}
			cs = append(cs, c)
			next = c.At
		}
		if err := batch.Error(); err != nil && len(cs) == 0 {
			return at, n, fmt.Errorf("%w: change stream: %v", abi.ErrUnavailable, err)
		}
		if len(cs) == 0 {
			return at, n, fmt.Errorf("%w: change stream: no change sets after stream sequence %d", abi.ErrUnavailable, at.Seq)
		}
		if err := l.applyBatch(f, cs); err != nil {
			return at, n, err
		}
		at, n = next, n+len(cs)
	}
	return at, n, nil
}

// applyBatch applies change sets in one transaction, with the last one's
// position, and counts them.
func (l *Log) applyBatch(f *store.File, cs []Change) error {
	if err := commitChanges(f, cs); err != nil {
		return err
	}
	l.stats.applied.Add(int64(len(cs)))
	return nil
}

// commitChanges applies change sets to f in one transaction that records
// the last one's position.
func commitChanges(f *store.File, cs []Change) error {
	if len(cs) == 0 {
		return nil
	}
	tx, err := f.Begin()
	if err != nil {
		return err
	}
	for _, c := range cs {
		if err := tx.Apply(c.Changes); err != nil {
			tx.Rollback()
			return fmt.Errorf("%w: change %d: %v", ErrDiverged, c.At.Applied, err)
		}
	}
	if err := tx.SetPosition(cs[len(cs)-1].At); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// Mark publishes a takeover mark on subject for a file caught up to the
// stream's end: from then on the old home's publishes are refused. It
// fails with ErrFenced if the stream moved meanwhile (catch up again).
func (l *Log) Mark(ctx context.Context, subject, node string, f *store.File) (store.Position, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	at := f.Position()
	next, _, err := l.publish(ctx, subject, node, nil, at, true)
	if err != nil {
		return at, err
	}
	if err := commitChanges(f, []Change{{At: next}}); err != nil {
		return at, err
	}
	return next, nil
}
