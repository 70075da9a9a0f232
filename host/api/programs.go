package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/host/internal/tenancy"
)

func (s *server) handleUpload(w http.ResponseWriter, r *http.Request, p tenancy.Principal, qname string) {
	name := r.PathValue("name")
	tu := s.cfg.Usage.Of(p.Tenant)
	limit := int64(s.cfg.MaxModuleSize)
	if tu != nil && tu.Limits().ModuleBytes < limit {
		limit = tu.Limits().ModuleBytes
		if r.ContentLength > limit {
			s.failAs(w, p, tenancy.SizeLimit("module size", limit, r.ContentLength))
			return
		}
	}
	wasm, err := readBody(w, r, int(limit))
	if err != nil {
		if tu != nil && errors.Is(err, abi.ErrTooLarge) {
			err = tenancy.SizeLimit("module size", limit, limit+1)
		}
		s.failAs(w, p, err)
		return
	}
	if len(wasm) == 0 {
		s.failAs(w, p, fmt.Errorf("%w: empty body; send the module: curl -T app.wasm .../v1/programs/%s", abi.ErrBadRequest, name))
		return
	}
	if tu != nil {
		if err := s.checkProgramCount(r.Context(), tu, qname); err != nil {
			s.failAs(w, p, err)
			return
		}
	}
	pr, created, err := s.b.Upload(r.Context(), qname, wasm)
	if err != nil {
		s.failAs(w, p, err)
		return
	}
	st := http.StatusCreated
	if !created {
		st = http.StatusOK
	}
	pr.Name = p.Show(pr.Name)
	writeJSON(w, st, pr)
}

// checkProgramCount refuses a new program name past the tenant's limit.
func (s *server) checkProgramCount(ctx context.Context, tu *tenancy.Use, qname string) error {
	ns, err := s.b.ProgramNames(ctx, func(k string) bool { return tenancy.TenantOf(k) == tu.Tenant() })
	if err != nil {
		return err
	}
	return tu.AllowProgram(ns, qname)
}

func (s *server) handleListPrograms(w http.ResponseWriter, r *http.Request, p tenancy.Principal) {
	ps, err := s.b.ListPrograms(r.Context(), p.Owns)
	if err != nil {
		s.failAs(w, p, err)
		return
	}
	for i := range ps {
		ps[i].Name = p.Show(ps[i].Name)
	}
	writeJSON(w, http.StatusOK, map[string]any{"programs": ps})
}

func (s *server) handleGetProgram(w http.ResponseWriter, r *http.Request, p tenancy.Principal, qname string) {
	name := r.PathValue("name")
	ps, err := s.b.Programs(r.Context(), qname)
	if err != nil {
		s.failAs(w, p, err)
		return
	}
	for i := range ps {
		ps[i].Name = p.Show(ps[i].Name)
	}
	writeJSON(w, http.StatusOK, map[string]any{"name": name, "versions": ps})
}

// RollbackRequest is the body of POST /v1/programs/{name}/rollback: the
// version whose module becomes current again (0 or absent: the version
// before the newest).
type RollbackRequest struct {
	To int `json:"to,omitempty"`
}

func (s *server) handleRollback(w http.ResponseWriter, r *http.Request, p tenancy.Principal, qname string) {
	body, err := readBody(w, r, 4<<10)
	if err != nil {
		s.failAs(w, p, err)
		return
	}
	var req RollbackRequest
	if len(bytes.TrimSpace(body)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			s.failAs(w, p, fmt.Errorf(`%w: the body is {"to": VERSION} or empty (the version before the newest): %v`, abi.ErrBadRequest, err))
			return
		}
	}
	if req.To < 0 {
		s.failAs(w, p, fmt.Errorf("%w: to must be a version (1 or more), not %d", abi.ErrBadRequest, req.To))
		return
	}
	pr, err := s.b.Rollback(r.Context(), qname, req.To)
	if err != nil {
		s.failAs(w, p, err)
		return
	}
	pr.Name = p.Show(pr.Name)
	writeJSON(w, http.StatusCreated, pr)
}
