package host

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/durable-host/host/vm"
)

var (
	programName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	objectID    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
)

// ValidateProgramName reports whether name can name a program.
func ValidateProgramName(name string) error {
	if !programName.MatchString(name) {
		return fmt.Errorf("%w: program name %q must be 1-63 of a-z 0-9 _ - and start with a letter or digit", ErrBadRequest, clip(name))
	}
	return nil
}

// ValidateObjectID reports whether id can name an object of a program.
func ValidateObjectID(id string) error {
	if !objectID.MatchString(id) {
		return fmt.Errorf("%w: object id %q must be 1-128 of A-Z a-z 0-9 . _ - and start with a letter or digit", ErrBadRequest, clip(id))
	}
	return nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// Program is one version of an uploaded program.
type Program struct {
	Name     string    `json:"name"`
	Version  int       `json:"version"`
	Digest   string    `json:"digest"`
	Size     int       `json:"size"`
	Exports  []string  `json:"exports"`
	Handlers []string  `json:"handlers"`
	Created  time.Time `json:"created"`
}

// programs stores modules content-addressed under DATA/programs and their
// names and versions in the node database.
type programs struct {
	dir    string
	db     *sql.DB
	engine *vm.Engine

	// mu guards compiled, the modules compiled by this node, by digest,
	// and newest, the latest version of each name this node has seen.
	mu       sync.Mutex
	compiled map[string]*vm.Module
	newest   map[string]Program
}

func openPrograms(ctx context.Context, dataDir string, db *sql.DB, engine *vm.Engine) (*programs, error) {
	dir := filepath.Join(dataDir, "programs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS programs (
		name     TEXT NOT NULL,
		version  INTEGER NOT NULL,
		digest   TEXT NOT NULL,
		size     INTEGER NOT NULL,
		exports  TEXT NOT NULL,
		handlers TEXT NOT NULL,
		created  INTEGER NOT NULL,
		PRIMARY KEY (name, version)
	)`); err != nil {
		return nil, err
	}
	return &programs{dir: dir, db: db, engine: engine, compiled: map[string]*vm.Module{}, newest: map[string]Program{}}, nil
}

func handlerNames(m *vm.Module) []string {
	out := []string{}
	for _, h := range []struct {
		bit  int32
		name string
	}{{1, "follow"}, {2, "receive"}, {4, "event"}} {
		if m.Has(h.bit) {
			out = append(out, h.name)
		}
	}
	return out
}

// upload validates wasm and stores it as the next version of name. The same
// bytes as the latest version are not a new version.
func (p *programs) upload(ctx context.Context, name string, wasm []byte) (Program, bool, error) {
	if err := ValidateProgramName(name); err != nil {
		return Program{}, false, err
	}
	m, err := p.module(ctx, vm.Digest(wasm), wasm)
	if err != nil {
		return Program{}, false, err
	}
	if latest, err := p.latest(ctx, name); err == nil && latest.Digest == m.Digest {
		return latest, false, nil
	}
	path := filepath.Join(p.dir, m.Digest+".wasm")
	if _, err := os.Stat(path); err != nil {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, wasm, 0o644); err != nil {
			return Program{}, false, err
		}
		if err := os.Rename(tmp, path); err != nil {
			return Program{}, false, err
		}
	}
	exports, _ := json.Marshal(m.Exports)
	handlers, _ := json.Marshal(handlerNames(m))
	now := time.Now()
	var version int
	err = p.db.QueryRowContext(ctx, `INSERT INTO programs (name, version, digest, size, exports, handlers, created)
		SELECT ?, COALESCE(MAX(version), 0) + 1, ?, ?, ?, ?, ? FROM programs WHERE name = ?
		RETURNING version`, name, m.Digest, m.Size, string(exports), string(handlers), now.UnixNano(), name).Scan(&version)
	if err != nil {
		return Program{}, false, fmt.Errorf("store program: %w", err)
	}
	pr := Program{Name: name, Version: version, Digest: m.Digest, Size: m.Size, Exports: m.Exports, Handlers: handlerNames(m), Created: now}
	p.mu.Lock()
	p.newest[name] = pr
	p.mu.Unlock()
	return pr, true, nil
}

// module returns the compiled module for digest, compiling wasm (or the
// stored blob when wasm is nil) on first use.
func (p *programs) module(ctx context.Context, digest string, wasm []byte) (*vm.Module, error) {
	p.mu.Lock()
	m, ok := p.compiled[digest]
	p.mu.Unlock()
	if ok {
		return m, nil
	}
	if wasm == nil {
		var err error
		if wasm, err = os.ReadFile(filepath.Join(p.dir, digest+".wasm")); err != nil {
			return nil, fmt.Errorf("read program %s: %w", digest, err)
		}
	}
	m, err := p.engine.Compile(ctx, wasm)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if prev, ok := p.compiled[digest]; ok {
		m.Close(ctx)
		return prev, nil
	}
	p.compiled[digest] = m
	return m, nil
}

func scanProgram(row interface{ Scan(...any) error }) (Program, error) {
	var pr Program
	var exports, handlers string
	var created int64
	if err := row.Scan(&pr.Name, &pr.Version, &pr.Digest, &pr.Size, &exports, &handlers, &created); err != nil {
		return pr, err
	}
	_ = json.Unmarshal([]byte(exports), &pr.Exports)
	_ = json.Unmarshal([]byte(handlers), &pr.Handlers)
	pr.Created = time.Unix(0, created).UTC()
	return pr, nil
}

const programCols = `name, version, digest, size, exports, handlers, created`

// latest returns the newest version of name, or ErrUnknownProgram.
func (p *programs) latest(ctx context.Context, name string) (Program, error) {
	p.mu.Lock()
	pr, ok := p.newest[name]
	p.mu.Unlock()
	if ok {
		return pr, nil
	}
	pr, err := scanProgram(p.db.QueryRowContext(ctx, `SELECT `+programCols+` FROM programs WHERE name = ? ORDER BY version DESC LIMIT 1`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return pr, fmt.Errorf("%w: %q (upload it with: host upload FILE.wasm --name %s)", ErrUnknownProgram, clip(name), clip(name))
	}
	if err == nil {
		p.mu.Lock()
		p.newest[name] = pr
		p.mu.Unlock()
	}
	return pr, err
}

// list returns the latest version of every program, or every version of
// name when name is not empty.
func (p *programs) list(ctx context.Context, name string) ([]Program, error) {
	q := `SELECT ` + programCols + ` FROM programs p WHERE version = (SELECT MAX(version) FROM programs WHERE name = p.name) ORDER BY name`
	args := []any{}
	if name != "" {
		q = `SELECT ` + programCols + ` FROM programs WHERE name = ? ORDER BY version`
		args = append(args, name)
	}
	rows, err := p.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Program{}
	for rows.Next() {
		pr, err := scanProgram(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, pr)
	}
	return out, rows.Err()
}

func (p *programs) close(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.compiled {
		m.Close(ctx)
	}
	p.compiled = map[string]*vm.Module{}
}
