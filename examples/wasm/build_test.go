package examples

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestRustBuildKeptWhileCurrent: a Rust module built from sources outside
// this directory (Options.Source) is rebuilt only when its key changes.
func TestRustBuildKeptWhileCurrent(t *testing.T) {
	if _, err := Rustc(); err != nil {
		t.Skip(err)
	}
	root := t.TempDir()
	src := filepath.Join(root, "examples", "wasm")
	copyFile(t, filepath.Join(SourceDir(), "counter-rust", "lib.rs"), filepath.Join(src, "counter-rust", "lib.rs"))
	copyFile(t, rustSDKSource(SourceDir()), filepath.Join(root, "sdk", "rust", "src", "lib.rs"))
	out := t.TempDir()
	ctx := context.Background()
	build := func() os.FileInfo {
		t.Helper()
		built, err := Build(ctx, out, Options{Source: src})
		if err != nil {
			t.Fatal(err)
		}
		if len(built) != 1 || built[0].Name != "counter-rust" {
			t.Fatalf("built %+v, want counter-rust only", built)
		}
		fi, err := os.Stat(built[0].Path)
		if err != nil {
			t.Fatal(err)
		}
		return fi
	}
	first := build()
	if again := build(); !again.ModTime().Equal(first.ModTime()) {
		t.Fatalf("unchanged sources rebuilt the module (%v, then %v)", first.ModTime(), again.ModTime())
	}
	f, err := os.OpenFile(filepath.Join(src, "counter-rust", "lib.rs"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("\n// changed\n")
	f.Close()
	if changed := build(); changed.ModTime().Equal(first.ModTime()) {
		t.Fatal("a changed source kept the old module")
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
