package api

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
	"github.com/durable-host/host/host/internal/names"
	"github.com/durable-host/host/host/internal/tenancy"
)

// handleStream serves a subscription as server-sent events: each event is
//
//	id: SEQ
//	event: event
//	data: {"type":"event","publisher":...,"topic":...,"seq":SEQ,"time":...,"payload":...}
//
// and a subscription that ends on an error sends `event: error` with
// {"error": "..."} before closing. The id is the consumer's checkpoint:
// reconnect with ?after=ID (or the Last-Event-ID header) to resume.
func (s *server) handleStream(w http.ResponseWriter, r *http.Request, p tenancy.Principal, id names.Object) {
	if _, err := s.b.Program(r.Context(), id.Program); err != nil {
		s.failAs(w, p, err)
		return
	}
	q := r.URL.Query()
	topic := q.Get("topic")
	if len(topic) > abi.MaxTopicLen {
		s.failAs(w, p, fmt.Errorf("%w: topic is longer than %d bytes", abi.ErrBadRequest, abi.MaxTopicLen))
		return
	}
	filter := q.Get("filter")
	if _, err := delivery.ParseFilter(filter); err != nil {
		s.failAs(w, p, fmt.Errorf("%w: %v", abi.ErrBadRequest, err))
		return
	}
	var after *uint64
	if v := cmp.Or(q.Get("after"), r.Header.Get("Last-Event-ID")); v != "" {
		seq, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			s.failAs(w, p, fmt.Errorf("%w: after must be an event seq (a non-negative integer), not %q", abi.ErrBadRequest, names.Clip(v)))
			return
		}
		after = &seq
	}
	if _, ok := w.(http.Flusher); !ok {
		s.failAs(w, p, fmt.Errorf("streaming is not supported on this connection"))
		return
	}
	release, ok := s.openConn(w, p)
	if !ok {
		return
	}
	defer release()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()

	var buf []byte
	send := func(e *abi.Event) error {
		e.Publisher = names.Show(p, id)
		buf = append(buf[:0], "id: "...)
		buf = strconv.AppendUint(buf, e.Seq, 10)
		buf = append(buf, "\nevent: event\ndata: "...)
		buf = delivery.AppendEnvelope(buf, e)
		buf = append(buf, "\n\n"...)
		_, err := w.Write(buf)
		return err
	}
	// One flush per drain: a catch-up goes out in full buffers, a live
	// event at once.
	err := s.b.Stream(r.Context(), StreamQuery{Object: id, Topic: topic, Filter: filter, After: after}, send, rc.Flush)
	if err == nil {
		return
	}
	b, _ := json.Marshal(map[string]string{"error": p.Strip(err.Error())})
	fmt.Fprintf(w, "event: error\ndata: %s\n\n", b)
	rc.Flush()
}
