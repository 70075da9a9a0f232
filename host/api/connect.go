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
// it to the node, which serves it until it ends.
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
	defer release()
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	ws.SetReadLimit(maxClientFrame)
	s.b.Connect(ws, Conn{Who: p, Object: id, UseEvent: slices.Contains(pr.Handlers, "event")})
}
