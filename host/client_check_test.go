package host_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/durable-host/host/host"
	hclient "github.com/durable-host/host/host/client"
)

// FuzzClientChecksObjectsLikeTheNode: the client repeats the node's naming
// rules (it imports no server code). Whatever name the node refuses, the
// client refuses with the same text before sending anything; whatever name
// the node accepts, the client sends, each part escaped.
func FuzzClientChecksObjectsLikeTheNode(f *testing.F) {
	for _, s := range []string{
		"counter/c1", "acme.chat/room1", "counter", "counter/", "/c1", "counter/../x",
		"Counter/c1", "counter/C1.x-y_z", "a.b.c/x", ".chat/x", "acme./x", "acme.Chat/x",
		"counter/c1/extra", "counter/.x", "-a/x", strings.Repeat("p", 63) + "/x",
		strings.Repeat("p", 64) + "/x", "counter/" + strings.Repeat("i", 128), "counter/" + strings.Repeat("i", 129),
		strings.Repeat("t", 32) + ".p/x", strings.Repeat("t", 33) + ".p/x", "counter/c 1", "counter/é",
		strings.Repeat("x", 100), "counter/%2e",
	} {
		f.Add(s)
	}
	var mu sync.Mutex
	var got string // the escaped path of the last request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = r.URL.EscapedPath()
		mu.Unlock()
	}))
	f.Cleanup(srv.Close)
	c := &hclient.Client{Base: srv.URL}
	f.Fuzz(func(t *testing.T, s string) {
		mu.Lock()
		got = ""
		mu.Unlock()
		id, nodeErr := host.ParseObjectID(s)
		_, err := c.Call(context.Background(), s, "m", nil)
		if nodeErr != nil {
			if err == nil || err.Error() != nodeErr.Error() {
				t.Fatalf("%q: client says %v, the node says %v", s, err, nodeErr)
			}
			return
		}
		if err != nil {
			t.Fatalf("%q: the node accepts it, the client says %v", s, err)
		}
		want := "/v1/objects/" + url.PathEscape(id.Program) + "/" + url.PathEscape(id.ID) + "/m"
		mu.Lock()
		defer mu.Unlock()
		if got != want {
			t.Fatalf("%q: sent to %s, want %s", s, got, want)
		}
	})
}
