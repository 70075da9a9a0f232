package host

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/delivery"
)

// FuzzParseClientRequest: whatever a WebSocket client sends, parsing never
// panics; an accepted frame is a ping, or a follow or unfollow whose
// object, topic, filter and params are within their limits, and it
// survives a round trip; a refusal's message stays small whatever the
// frame's size, so an error frame cannot amplify a request.
func FuzzParseClientRequest(f *testing.F) {
	for _, s := range []string{
		`{"type":"ping"}`,
		`{"type":"follow","topic":"messages"}`,
		`{"type":"follow","object":"chat/room1","topic":"messages","filter":"author=ann&n=1","params":"key"}`,
		`{"type":"unfollow","object":"chat/room1","topic":"messages"}`,
		`{"type":"follow","object":"../../etc/passwd","topic":"t"}`,
		`{"type":"follow","topic":"` + strings.Repeat("t", abi.MaxTopicLen+1) + `"}`,
		`{"type":"follow","topic":"t","filter":"=x"}`,
		`{"type":"follow","topic":"t\ud800"}`,
		`{"type":5}`,
		`{"type":"dance"}`,
		`null`,
		`[]`,
		"{\"type\":\"follow\",\"topic\":\"\xff\xfe\"}",
		`{"type":"follow","object":"a/b/c"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := parseClientRequest(data)
		if err != nil {
			if msg := err.Error(); len(msg) > 8<<10 {
				t.Fatalf("a %d-byte frame got a %d-byte error", len(data), len(msg))
			}
			return
		}
		switch req.Type {
		case "ping":
			return
		case "follow", "unfollow":
		default:
			t.Fatalf("accepted request type %q", req.Type)
		}
		if req.Object != "" {
			if _, err := ParseObjectID(req.Object); err != nil {
				t.Fatalf("accepted object %q: %v", req.Object, err)
			}
		}
		if len(req.Topic) > abi.MaxTopicLen || !utf8.ValidString(req.Topic) {
			t.Fatalf("accepted topic %q (%d bytes)", req.Topic, len(req.Topic))
		}
		if _, err := delivery.ParseFilter(req.Filter); err != nil || len(req.Filter) > delivery.MaxFilterLen {
			t.Fatalf("accepted filter %q: %v", req.Filter, err)
		}
		if len(req.Params) > maxParams {
			t.Fatalf("accepted %d bytes of params", len(req.Params))
		}
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		again, err := parseClientRequest(b)
		if err != nil || !reflect.DeepEqual(again, req) {
			t.Fatalf("%+v does not survive a round trip: %+v %v", req, again, err)
		}
	})
}

// FuzzNames: tenant and program names (plain or TENANT.PROGRAM) and object
// ids become file names under the data directory, so whatever a client
// sends, validating it never panics, and an accepted name is valid UTF-8
// within its length limit, holds no NUL, slash or backslash, is one local
// path element (not "." or "..", not hidden, not a flag), and its file
// stays under the data directory. ParseObjectID accepts exactly one slash,
// between two valid parts, and round-trips.
//
// An object id may contain ".." inside it ("a..b"): harmless in a file
// name, and every NATS key or subject hex-encodes ids.
func FuzzNames(f *testing.F) {
	for _, s := range []string{
		"counter", "chat/room1", "a", "a/b", "..", ".", "../x", "a/../b", "a/..",
		"x/..%2Fetc", "a\x00b", "a/b\x00", "\xff\xfe", "a/\xff", "ünïcode",
		"Counter", "-x", "_x", ".hidden", "a..b", "a.", "a/b/c", "/a", "a/",
		"a\\b", "c:x", strings.Repeat("p", 63), strings.Repeat("p", 64),
		"p/" + strings.Repeat("o", 128), "p/" + strings.Repeat("o", 129),
		"acme.chat/room1", "acme.chat.x/room1", ".chat/x", "acme./x", "a.b.c",
		strings.Repeat("t", 32) + "." + strings.Repeat("p", 63) + "/x",
	} {
		f.Add(s)
	}
	const dataDir = "/data"
	objects := filepath.Join(dataDir, "objects")
	safe := func(t *testing.T, what, s string, maxLen int) {
		t.Helper()
		switch {
		case s == "" || len(s) > maxLen:
			t.Fatalf("%s %q accepted: %d bytes, limit %d", what, s, len(s), maxLen)
		case !utf8.ValidString(s):
			t.Fatalf("%s %q accepted: not UTF-8", what, s)
		case strings.ContainsAny(s, "/\\\x00"):
			t.Fatalf("%s %q accepted: holds a slash, backslash or NUL", what, s)
		case s == "." || s == ".." || strings.HasPrefix(s, ".") || strings.HasPrefix(s, "-"):
			t.Fatalf("%s %q accepted: a dot name, hidden or a flag", what, s)
		case filepath.Base(s) != s || filepath.Clean(s) != s || !filepath.IsLocal(s):
			t.Fatalf("%s %q accepted: not a single local path element", what, s)
		}
	}
	f.Fuzz(func(t *testing.T, s string) {
		if err := ValidateProgramName(s); err == nil {
			safe(t, "program name", s, 63)
			if strings.Contains(s, ".") || strings.ToLower(s) != s {
				t.Fatalf("program name %q accepted", s)
			}
		} else if !errors.Is(err, ErrBadRequest) {
			t.Fatalf("program name %q: %v is not ErrBadRequest", s, err)
		}
		if err := ValidateTenantName(s); err == nil {
			safe(t, "tenant name", s, 32)
			if strings.Contains(s, ".") || strings.ToLower(s) != s {
				t.Fatalf("tenant name %q accepted", s)
			}
		} else if !errors.Is(err, ErrBadRequest) {
			t.Fatalf("tenant name %q: %v is not ErrBadRequest", s, err)
		}
		if err := ValidateQualifiedProgram(s); err == nil {
			safe(t, "qualified program name", s, 32+1+63)
			tenant, program, qualified := strings.Cut(s, ".")
			if qualified && (ValidateTenantName(tenant) != nil || ValidateProgramName(program) != nil) ||
				!qualified && ValidateProgramName(s) != nil {
				t.Fatalf("qualified program name %q accepted", s)
			}
		} else if !errors.Is(err, ErrBadRequest) {
			t.Fatalf("qualified program name %q: %v is not ErrBadRequest", s, err)
		}
		if err := ValidateObjectID(s); err == nil {
			safe(t, "object id", s, 128)
		} else if !errors.Is(err, ErrBadRequest) {
			t.Fatalf("object id %q: %v is not ErrBadRequest", s, err)
		}
		o, err := ParseObjectID(s)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("ParseObjectID(%q): %v is not ErrBadRequest", s, err)
			}
			return
		}
		if o.String() != s || strings.Count(s, "/") != 1 {
			t.Fatalf("ParseObjectID(%q) = %+v", s, o)
		}
		if ValidateQualifiedProgram(o.Program) != nil || ValidateObjectID(o.ID) != nil || o.Validate() != nil {
			t.Fatalf("ParseObjectID(%q) accepted invalid parts %+v", s, o)
		}
		path := filepath.Join(objects, o.Program, o.ID+".db")
		if rel, err := filepath.Rel(objects, path); err != nil || !filepath.IsLocal(rel) || filepath.Dir(filepath.Dir(path)) != objects {
			t.Fatalf("object %q has its file at %s, outside %s", s, path, objects)
		}
	})
}
