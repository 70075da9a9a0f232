// Package examples builds the example programs in this directory into
// WebAssembly modules, for `make examples`, `host dev` and the tests.
//
// Each subdirectory with a main.go is a Go program built as a WASI reactor
// (GOOS=wasip1 GOARCH=wasm -buildmode=c-shared) into out/NAME.wasm; each
// subdirectory with a lib.rs is a Rust program built with the system rustc for
// wasm32-unknown-unknown into out/NAME-rust.wasm (NAME without its "-rust"
// suffix when the directory already has it).
package examples

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
)

// SourceDir returns the directory holding the examples' sources: the one
// this package was compiled from, a checkout or, for a `go install`ed
// binary, the read-only module cache. It need not exist where the binary
// runs (built with -trimpath, or copied to another machine).
func SourceDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

// Built is one built module.
type Built struct {
	Name string // program name: "counter", "counter-rust"
	Path string
	Lang string // "go" or "rust"
}

// Options select what Build builds.
type Options struct {
	// Source is the directory of the examples' sources, read only (it may
	// be in the read-only module cache); empty is SourceDir(). The Rust
	// SDK is read from ../../sdk/rust beside it, as in this repository.
	Source string
	// Only builds just these programs (by name); empty builds all.
	Only []string
	// SkipRust skips the Rust examples.
	SkipRust bool
}

// Build builds the examples into outDir (created if needed) and returns what
// it built. Outputs are written atomically, so concurrent builds into one
// directory are safe.
func Build(ctx context.Context, outDir string, opt Options) ([]Built, error) {
	src := opt.Source
	if src == "" {
		src = SourceDir()
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, n := range opt.Only {
		want[n] = true
	}
	var jobs []Built
	for _, e := range entries {
		if !e.IsDir() || e.Name() == "out" || e.Name() == "testdata" {
			continue
		}
		dir := filepath.Join(src, e.Name())
		switch {
		case exists(filepath.Join(dir, "main.go")):
			jobs = append(jobs, Built{Name: e.Name(), Path: filepath.Join(outDir, e.Name()+".wasm"), Lang: "go"})
		case exists(filepath.Join(dir, "lib.rs")) && !opt.SkipRust:
			name := strings.TrimSuffix(e.Name(), "-rust") + "-rust"
			jobs = append(jobs, Built{Name: name, Path: filepath.Join(outDir, name+".wasm"), Lang: "rust"})
		}
	}
	if len(want) > 0 {
		kept := jobs[:0]
		for _, j := range jobs {
			if want[j.Name] {
				kept = append(kept, j)
			}
		}
		jobs = kept
	}
	sort.Slice(jobs, func(a, b int) bool { return jobs[a].Name < jobs[b].Name })
	sdk := &rustSDK{src: rustSDKSource(src)}
	defer sdk.close()
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2)
	for n, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[n] = build(ctx, src, j, sdk)
		}()
	}
	wg.Wait()
	return jobs, errors.Join(errs...)
}

func build(ctx context.Context, src string, j Built, sdk *rustSDK) error {
	tmp := fmt.Sprintf("%s.%d.tmp", j.Path, os.Getpid())
	var cmd *exec.Cmd
	dir := strings.TrimSuffix(j.Name, "-rust")
	switch j.Lang {
	case "go":
		cmd = exec.CommandContext(ctx, goTool(), "build", "-buildmode=c-shared", "-trimpath", "-ldflags=-s -w", "-o", tmp, "./"+dir)
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	case "rust":
		return buildRust(ctx, src, j, dir, tmp, sdk)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("build %s: %v\n%s", j.Name, err, out.String())
	}
	return os.Rename(tmp, j.Path)
}

// rustSDK is the Rust SDK compiled once per Build, on first use, in a
// private directory: rustc names its intermediate files after the output's
// stem, so concurrent builds (even from several processes) never meet.
type rustSDK struct {
	src  string
	once sync.Once
	dir  string
	rlib string
	err  error
}

func (s *rustSDK) get(ctx context.Context, rustc string) (string, error) {
	s.once.Do(func() {
		if s.dir, s.err = os.MkdirTemp("", "host-rust-sdk-"); s.err != nil {
			return
		}
		s.rlib = filepath.Join(s.dir, "libhost_sdk.rlib")
		s.err = runRustc(ctx, rustc, s.dir, rustSDKArgs(s.src, s.rlib))
	})
	return s.rlib, s.err
}

func (s *rustSDK) close() {
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
}

// buildRust builds the program at src/DIR-rust/lib.rs (or src/DIR/lib.rs)
// against the SDK, in a private directory, and moves the module into place
// atomically through tmp. rustc keeps no cache, and a build takes seconds:
// a module whose recorded key (compiler, flags, sources) matches is kept.
func buildRust(ctx context.Context, src string, j Built, dir, tmp string, sdk *rustSDK) error {
	rdir := filepath.Join(src, dir+"-rust")
	if !exists(rdir) {
		rdir = filepath.Join(src, dir)
	}
	rustc, err := Rustc()
	if err != nil {
		return fmt.Errorf("build %s: %w", j.Name, err)
	}
	prog := filepath.Join(rdir, "lib.rs")
	key, err := rustKey(rustc, sdk.src, prog)
	if err != nil {
		return fmt.Errorf("build %s: %w", j.Name, err)
	}
	if old, err := os.ReadFile(j.Path + ".key"); err == nil && string(old) == key && exists(j.Path) {
		return nil
	}
	rlib, err := sdk.get(ctx, rustc)
	if err != nil {
		return fmt.Errorf("build %s: %w", j.Name, err)
	}
	work, err := os.MkdirTemp("", "host-rust-"+j.Name+"-")
	if err != nil {
		return fmt.Errorf("build %s: %w", j.Name, err)
	}
	defer os.RemoveAll(work)
	wasm := filepath.Join(work, "module.wasm")
	if err := runRustc(ctx, rustc, work, rustProgramArgs(prog, rlib, wasm)); err != nil {
		return fmt.Errorf("build %s: %w", j.Name, err)
	}
	b, err := os.ReadFile(wasm)
	if err != nil {
		return fmt.Errorf("build %s: %w", j.Name, err)
	}
	// The module first, then its key: a reader never takes a stale module
	// for a current one.
	if err := writeAtomic(j.Path, tmp, b); err != nil {
		return fmt.Errorf("build %s: %w", j.Name, err)
	}
	if err := writeAtomic(j.Path+".key", tmp, []byte(key)); err != nil {
		return fmt.Errorf("build %s: %w", j.Name, err)
	}
	return nil
}

func runRustc(ctx context.Context, rustc, dir string, args []string) error {
	cmd := exec.CommandContext(ctx, rustc, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %v\n%s", rustc, strings.Join(args, " "), err, out.String())
	}
	return nil
}

// rustKey identifies a Rust build: the compiler (path, size, time), the
// flags and both sources.
func rustKey(rustc, sdk, prog string) (string, error) {
	h := sha256.New()
	fi, err := os.Stat(rustc)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(h, "%s %d %d\n", rustc, fi.Size(), fi.ModTime().UnixNano())
	fmt.Fprintln(h, strings.Join(rustSDKArgs("SDK", "RLIB"), " "))
	fmt.Fprintln(h, strings.Join(rustProgramArgs("PROG", "RLIB", "OUT"), " "))
	for _, p := range []string{sdk, prog} {
		b, err := os.ReadFile(p)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%d\n", len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func writeAtomic(path, tmp string, b []byte) error {
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// Rustc returns the rustc that can target wasm32-unknown-unknown: Debian's
// /usr/bin/rustc (with libstd-rust-dev-wasm32), or $RUSTC.
func Rustc() (string, error) {
	for _, c := range []string{os.Getenv("RUSTC"), "/usr/bin/rustc"} {
		if c != "" && exists(c) {
			return c, nil
		}
	}
	return "", errors.New("no rustc with the wasm32 target: install Debian's rustc and libstd-rust-dev-wasm32")
}

// rustSDKSource is the Rust SDK's crate root, sdk/rust/src/lib.rs, for the
// examples in src (examples/wasm).
func rustSDKSource(src string) string {
	return filepath.Join(src, "..", "..", "sdk", "rust", "src", "lib.rs")
}

// rustCommon are the flags the SDK and the programs share: size
// optimisation, one codegen unit, and panics that abort (a trap the host
// reports as a TrapError).
var rustCommon = []string{"--edition=2021", "--target=wasm32-unknown-unknown",
	"-C", "opt-level=s", "-C", "panic=abort", "-C", "codegen-units=1"}

// rustSDKArgs compiles the SDK crate (host_sdk) into the rlib out; the same
// command is documented in sdk/rust/README.md.
func rustSDKArgs(src, out string) []string {
	return append(append([]string(nil), rustCommon...),
		"--crate-type=rlib", "--crate-name=host_sdk", "-o", out, src)
}

// rustProgramArgs compiles a program's lib.rs against the SDK rlib into a
// stripped, link-time-optimised module at out. The shadow stack is 64 KiB
// instead of rustc's 1 MiB: activation cost grows with the initial memory
// (about 0.6 ms against 5 ms per fresh instance), and the stack sits first in
// memory, so an overflow is an out-of-bounds access: a trap, not corruption.
func rustProgramArgs(src, rlib, out string) []string {
	return append(append([]string(nil), rustCommon...),
		"--crate-type=cdylib", "-C", "lto", "-C", "strip=symbols", "-C", "link-arg=-zstack-size=65536",
		"--extern", "host_sdk="+rlib, "-o", out, src)
}

func goTool() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); exists(p) {
		return p
	}
	return "go"
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
