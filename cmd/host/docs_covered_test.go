package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/txtar"

	examples "github.com/durable-host/host/examples/wasm"
)

// TestDocsCovered fails when a command line of an sh block in README.md or
// bench/README.md is not run by a script in testdata/script (after the
// substitutions TestDocs describes), so the docs cannot drift from what
// the tests run. Two lines are CI's own: `make test` must be .ci/run's
// last command, and the apt-get line must name exactly the packages
// .ci/run installs. The README's Go SDK program must be the one the tour
// builds.
func TestDocsCovered(t *testing.T) {
	repo := filepath.Dir(filepath.Dir(examples.SourceDir()))
	scripts, err := filepath.Glob("testdata/script/*.txtar")
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	covered := map[string]bool{}
	for _, s := range scripts {
		a, err := txtar.ParseFile(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(a.Comment), "\n") {
			if words := scriptCommand(line); len(words) > 0 {
				covered[strings.Join(sizesElided(words), " ")] = true
			}
		}
	}
	ci, err := os.ReadFile(filepath.Join(repo, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, doc := range []string{"README.md", "bench/README.md"} {
		b, err := os.ReadFile(filepath.Join(repo, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range shCommands(string(b)) {
			n++
			where := fmt.Sprintf("%s:%d: %s", doc, c.line, c.text)
			switch {
			case slices.Equal(c.words, []string{"make", "test"}):
				if last := lastCommand(string(ci)); last != "make test" {
					t.Errorf("%s: .ci/run's last command is %q, not the README's", where, last)
				}
			case len(c.words) > 2 && c.words[0] == "apt-get" && c.words[1] == "install":
				var pkgs []string
				for _, w := range c.words[2:] {
					if !strings.HasPrefix(w, "-") {
						pkgs = append(pkgs, w)
					}
				}
				if want := ciPackages(string(ci)); !sameSet(pkgs, want) {
					t.Errorf("%s: the README names %v, .ci/run installs %v", where, pkgs, want)
				}
			default:
				key := strings.Join(sizesElided(docSubstituted(c.words)), " ")
				if !covered[key] {
					t.Errorf("%s\n\tnot run by any testdata/script/*.txtar; a script line for it would read, after its prefix (exec, bg NAME, retry, gotest):\n\t%s", where, key)
				}
			}
		}
	}
	if n < 40 {
		t.Fatalf("found only %d command lines in the docs: is the sh block parser broken?", n)
	}

	readme, _ := os.ReadFile(filepath.Join(repo, "README.md"))
	tour, err := txtar.ParseFile("testdata/script/tour.txtar")
	if err != nil {
		t.Fatal(err)
	}
	var hello string
	for _, f := range tour.Files {
		if f.Name == "hello/main.go" {
			hello = string(f.Data)
		}
	}
	if hello == "" || !strings.Contains(string(readme), "```go\n"+hello+"```\n") {
		t.Errorf("tour.txtar's hello/main.go is not the README's Go SDK program:\n%s", hello)
	}
}

type docCommand struct {
	line  int
	text  string
	words []string
}

// shCommands are the command lines of a markdown document's sh blocks,
// with backslash-continued lines joined and comments dropped.
func shCommands(md string) []docCommand {
	var out []docCommand
	in := false
	var cont string
	start := 0
	for i, l := range strings.Split(md, "\n") {
		switch {
		case !in && strings.HasPrefix(l, "```sh"):
			in = true
			continue
		case in && strings.HasPrefix(l, "```"):
			in = false
			continue
		case !in:
			continue
		}
		if cont == "" {
			start = i + 1
		}
		if s, ok := strings.CutSuffix(l, "\\"); ok {
			cont += s + " "
			continue
		}
		text := strings.TrimSpace(cont + l)
		cont = ""
		words := shellWords(text)
		if len(words) > 0 && words[len(words)-1] == "&" {
			words = words[:len(words)-1]
		}
		if len(words) > 0 {
			out = append(out, docCommand{start, text, words})
		}
	}
	return out
}

// shellWords splits a line as sh would, without expanding anything: quotes
// group and are removed, backslash escapes, # starts a comment.
func shellWords(s string) []string {
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				j = len(s) - i - 1
			}
			w.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte("\"\\$`", s[i+1]) >= 0 {
					i++
				}
				w.WriteByte(s[i])
			}
			inWord = true
		case c == '\\' && i+1 < len(s):
			i++
			w.WriteByte(s[i])
			inWord = true
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case c == '#' && !inWord:
			return words
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// scriptWords splits a testscript line as testscript does (single quotes
// only, a doubled one inside them for a quote), leaving $VARS as written.
func scriptWords(s string) []string {
	var words []string
	var w strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quoted && c == '\'' && i+1 < len(s) && s[i+1] == '\'':
			w.WriteByte('\'')
			i++
		case c == '\'':
			quoted = !quoted
			inWord = true
		case quoted:
			w.WriteByte(c)
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case c == '#' && !inWord:
			return words
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

var bgName = regexp.MustCompile(`^&\w*&?$`)

// scriptCommand is the command a script line runs, as the docs would write
// it: without its [condition], !, exec, "bg NAME", "retry [-match RE]",
// trailing &, and "env" before assignments; gotest is "go test".
func scriptCommand(line string) []string {
	w := scriptWords(line)
	for len(w) > 0 && (strings.HasPrefix(w[0], "[") || w[0] == "!") {
		w = w[1:]
	}
	if len(w) == 0 {
		return nil
	}
	switch w[0] {
	case "exec":
		w = w[1:]
	case "bg":
		if len(w) < 3 {
			return nil
		}
		w = w[2:]
	case "retry":
		w = w[1:]
		if len(w) > 1 && w[0] == "-match" {
			w = w[2:]
		}
	case "gotest":
		w = w[1:]
		i := 0
		for i < len(w) && isAssignment(w[i]) {
			i++
		}
		w = slices.Concat(w[:i], []string{"go", "test"}, w[i:])
	}
	if len(w) > 0 && bgName.MatchString(w[len(w)-1]) {
		w = w[:len(w)-1]
	}
	if len(w) > 1 && w[0] == "env" && isAssignment(w[1]) {
		w = w[1:]
	}
	return w
}

var (
	docPorts = strings.NewReplacer(
		"127.0.0.1:7070", "$HOST_ADDR", "localhost:7070", "localhost:$HOST_PORT",
		"127.0.0.1:7071", "$HTTP_1", "127.0.0.1:7072", "$HTTP_2", "127.0.0.1:7073", "$HTTP_3",
		"127.0.0.1:6221", "$ROUTE_1", "127.0.0.1:6222", "$ROUTE_2", "127.0.0.1:6223", "$ROUTE_3",
	)
	docTmp    = regexp.MustCompile(`(^|=)/tmp/`)
	docTokens = regexp.MustCompile(`ht_(\w+?)_…`)
)

// docSubstituted is a doc command with TestDocs's substitutions: free
// ports, $WORK/tmp/ for /tmp/, and the tokens the script captured.
func docSubstituted(words []string) []string {
	out := make([]string, len(words))
	for i, w := range words {
		w = docPorts.Replace(w)
		w = docTmp.ReplaceAllString(w, "${1}$$WORK/tmp/")
		out[i] = docTokens.ReplaceAllString(w, "$$TOKEN_$1")
	}
	return out
}

var sizeFlags = map[string]bool{"--nodes": true, "--duration": true, "--watchers": true, "--followers": true, "--messages": true, "--sockets": true, "--blocks": true, "--objects": true, "-benchtime": true, "-count": true}

// sizesElided replaces the value of every size flag with N.
func sizesElided(words []string) []string {
	out := slices.Clone(words)
	for i := 0; i+1 < len(out); i++ {
		if sizeFlags[out[i]] {
			out[i+1] = "N"
		}
	}
	return out
}

// lastCommand is a shell script's last line that is not blank or a comment.
func lastCommand(sh string) string {
	lines := strings.Split(sh, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" && !strings.HasPrefix(l, "#") {
			return l
		}
	}
	return ""
}

var ciWant = regexp.MustCompile(`(?m)^want (\S+) `)

// ciPackages are the packages .ci/run's want lines install.
func ciPackages(sh string) []string {
	var pkgs []string
	for _, m := range ciWant.FindAllStringSubmatch(sh, -1) {
		pkgs = append(pkgs, m[1])
	}
	return pkgs
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// TestDocWords pins the two word splitters on the docs' shapes.
func TestDocWords(t *testing.T) {
	for _, c := range []struct {
		line string
		want []string
	}{
		{`bin/host call counter/c1 add '{"amount": 5}' # 7`, []string{"bin/host", "call", "counter/c1", "add", `{"amount": 5}`}},
		{`export HOST_TOKEN="$(cat d/admin.token)"`, []string{"export", "HOST_TOKEN=$(cat d/admin.token)"}},
		{`HOST_TOKEN=ht_bob_…  bin/host watch x`, []string{"HOST_TOKEN=ht_bob_…", "bin/host", "watch", "x"}},
		{`go test ./vm/ -run '^$' -bench Counter`, []string{"go", "test", "./vm/", "-run", "^$", "-bench", "Counter"}},
	} {
		if got := shellWords(c.line); !slices.Equal(got, c.want) {
			t.Errorf("shellWords(%s) = %q, want %q", c.line, got, c.want)
		}
	}
	for _, c := range []struct {
		line string
		want []string
	}{
		{`exec bin/host call counter/c1 add '{"amount": 5}' # 7`, []string{"bin/host", "call", "counter/c1", "add", `{"amount": 5}`}},
		{`export 'HOST_TOKEN="$(cat d/admin.token)"'`, []string{"export", `HOST_TOKEN="$(cat d/admin.token)"`}},
		{`bg wb env HOST_TOKEN=$TOKEN_bob bin/host watch x`, []string{"HOST_TOKEN=$TOKEN_bob", "bin/host", "watch", "x"}},
		{`gotest FB=1 ./host/ -run '^$'`, []string{"FB=1", "go", "test", "./host/", "-run", "^$"}},
		{`[docbench] exec go tool pprof -top`, []string{"go", "tool", "pprof", "-top"}},
		{`retry -match 'a b' curl -sf URL`, []string{"curl", "-sf", "URL"}},
		{`exec bin/host serve &srv&`, []string{"bin/host", "serve"}},
		{`stdout 'x'`, []string{"stdout", "x"}},
		{`'it''s' # c`, []string{"it's"}},
	} {
		if got := scriptCommand(c.line); !slices.Equal(got, c.want) {
			t.Errorf("scriptCommand(%s) = %q, want %q", c.line, got, c.want)
		}
	}
}
