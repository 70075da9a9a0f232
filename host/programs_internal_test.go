package host

import (
	"context"
	"reflect"
	"testing"

	"github.com/durable-host/host/vm/vmtest"
)

// The registry's leader read, which a name found missing by a KV read
// (any replica may answer one) falls back to, sees what the KV holds: every
// version of an uploaded name, its revision, and nothing for a name never
// uploaded or deleted.
func TestLeaderVersionsReadsTheRegistry(t *testing.T) {
	t.Parallel()
	n := StartTestNode(t)
	ctx := context.Background()
	for _, ex := range []string{"counter", "counter-rust"} {
		if _, _, err := n.programs.upload(ctx, "p", vmtest.Wasm(t, ex)); err != nil {
			t.Fatal(err)
		}
	}
	want, rev, err := n.programs.versions(ctx, "p")
	if err != nil || len(want) != 2 {
		t.Fatalf("versions: %v %v", want, err)
	}
	got, grev, err := n.programs.leaderVersions(ctx, "p")
	if err != nil || !reflect.DeepEqual(got, want) || grev != rev {
		t.Fatalf("leader read %v rev %d (%v), want %v rev %d", got, grev, err, want, rev)
	}
	if got, _, err := n.programs.leaderVersions(ctx, "never"); err != nil || got != nil {
		t.Fatalf("leader read of an unknown name: %v %v", got, err)
	}
	if err := n.programs.kv.Delete(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	if got, _, err := n.programs.leaderVersions(ctx, "p"); err != nil || got != nil {
		t.Fatalf("leader read of a deleted name: %v %v", got, err)
	}
}
