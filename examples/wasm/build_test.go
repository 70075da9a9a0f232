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
	// A tiny SDK and program in the repository's layout: what is under test
	// is when Build runs rustc, not what rustc makes.
	root := t.TempDir()
	src := filepath.Join(root, "examples", "wasm")
	writeFile(t, filepath.Join(root, "sdk", "rust", "src", "lib.rs"), "pub fn one() -> i32 { 1 }\n")
	writeFile(t, filepath.Join(src, "counter-rust", "lib.rs"), "#[no_mangle]\npub extern \"C\" fn f() -> i32 { host_sdk::one() }\n")
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

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
