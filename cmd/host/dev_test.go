package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	examples "github.com/durable-host/host/examples/wasm"
)

// TestDevExamplesDir: the binary's host dev builds the sources --examples
// names (here a copy of counter alone, with the packages it imports) into
// the user's cache, writes nothing beside them, and uploads what it built;
// without sources on disk it says to pass --examples.
func TestDevExamplesDir(t *testing.T) {
	// The same module and package paths as here, so the module is byte for
	// byte vmtest's counter and its compiled code is in the cache already.
	repo := filepath.Dir(filepath.Dir(examples.SourceDir()))
	mod := t.TempDir()
	src := filepath.Join(mod, "examples", "wasm")
	var files []string
	for _, pattern := range []string{"abi/*.go", "sdk/go/*.go", "examples/wasm/counter/*.go"} {
		m, _ := filepath.Glob(filepath.Join(repo, pattern))
		files = append(files, m...)
	}
	for _, from := range files {
		if strings.HasSuffix(from, "_test.go") {
			continue
		}
		rel, _ := filepath.Rel(repo, from)
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		os.MkdirAll(filepath.Dir(filepath.Join(mod, rel)), 0o755)
		if err := os.WriteFile(filepath.Join(mod, rel), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goVersion := regexp.MustCompile(`(?m)^go \S+$`).Find(mustRead(t, filepath.Join(repo, "go.mod")))
	gomod := "module github.com/durable-host/host\n\n" + string(goVersion) + "\n"
	if err := os.WriteFile(filepath.Join(mod, "go.mod"), []byte(gomod), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := hostBinary(t)
	home := t.TempDir()
	env := append(cleanEnv(), "HOME="+home, "XDG_CACHE_HOME="+filepath.Join(home, "cache"))
	for k, v := range goEnvVars(t) { // the real build cache, not one under XDG_CACHE_HOME
		env = append(env, k+"="+v)
	}
	data := t.TempDir()
	if err := os.Symlink(docsCompileCache(t), filepath.Join(data, "cache")); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second) // a node that serves instead never exits
	defer cancel()
	gone := exec.CommandContext(ctx, bin, "dev", "--examples", filepath.Join(home, "gone"), "--data", t.TempDir(), "--listen", "127.0.0.1:0")
	gone.Env = env
	if out, err := gone.CombinedOutput(); err == nil || !strings.Contains(string(out), "pass --examples DIR") {
		t.Fatalf("host dev without sources: %v\n%s", err, out)
	}

	addr := freePort(t)
	cmd := exec.Command(bin, "dev", "--examples", src, "--data", data, "--listen", addr)
	cmd.Dir = home
	cmd.Env = env
	s := spawn(t, cmd)
	waitHealthy(t, addr, s)
	if got := runBin(t, bin, "call", "counter/c1", "inc", "--server", "http://"+addr); got != "1\n" {
		t.Fatalf("call counter/c1 inc printed %q", got)
	}
	s.stop(t)
	built, _ := filepath.Glob(filepath.Join(home, "cache", "host", "examples", "*.wasm"))
	if len(built) != 1 || filepath.Base(built[0]) != "counter.wasm" {
		t.Fatalf("built %v, want only counter.wasm in the cache", built)
	}
	if entries, _ := os.ReadDir(src); len(entries) != 1 {
		t.Fatalf("the sources' directory now holds %d entries, want counter/ alone", len(entries))
	}
	if out := s.out.String(); !strings.Contains(out, "uploaded counter ") || strings.Contains(out, "uploaded chat") {
		t.Fatalf("host dev printed:\n%s", out)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
