package host_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/hosttest"
	"github.com/durable-host/host/vm/vmtest"
)

// Every node copies every program's newest module to its own disk as soon
// as it learns of the version, before anything runs the program there: a
// node taking an object over activates it from disk, not through the
// module store, whose leader may be the node that stopped answering.
func TestEveryNodeHoldsEveryNewestModule(t *testing.T) {
	t.Parallel()
	nodes, cfgs := hosttest.Cluster(t, 2, hosttest.Options{})
	pr, err := (&hclient.Client{Base: nodes[0].URL()}).Upload(context.Background(), "counter", vmtest.Wasm(t, "counter"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(cfgs[1].DataDir, "programs", pr.Digest+".wasm")
	waitUntil(t, "the module on the other node's disk, unused there", 20*time.Second, func() bool {
		_, err := os.Stat(path)
		return err == nil
	})
}
