package api

import (
	"net/http"
	"slices"

	"github.com/coder/websocket"

	"github.com/durable-host/host/host/internal/names"
	"github.com/durable-host/host/host/internal/tenancy"
)

// maxClientFrame bounds a frame a WebSocket client may send.
const maxClientFrame = 64 << 10

// handleConnect upgrades GET …/connect to a WebSocket once the object's
// program exists and the tenant may open one more connection, then hands
// it to the node, which serves it until it ends, on a goroutine of its own:
// the handler returns, so the HTTP request, its response and the handler's
// stack are not held for the socket's lifetime (about 2.5 KB of heap and a
// deeper stack per idle connection).
func (s *server) handleConnect(w http.ResponseWriter, r *http.Request, p tenancy.Principal, id names.Object) {
	pr, err := s.b.Program(r.Context(), id.Program)
	if err != nil {
		s.failAs(w, p, err)
		return
	}
	release, ok := s.openConn(w, p)
	if !ok {
		return
	}
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		release()
		return
	}
	ws.SetReadLimit(maxClientFrame)
	c := Conn{Who: p, Object: id, UseEvent: slices.Contains(pr.Handlers, "event")}
	go func() {
		defer release()
		s.b.Connect(ws, c)
	}()
}
