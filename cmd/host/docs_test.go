package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	examples "github.com/durable-host/host/examples/wasm"
	"github.com/durable-host/host/vm/vmtest"
)

// The documentation's command lines, run. testdata/script/*.txtar hold
// every command line of the sh blocks in README.md and bench/README.md
// (TestDocsCovered fails on one they lack), and TestDocs runs them against
// nodes the scripts start, as a reader would, with three substitutions:
// free ports for the fixed ones (127.0.0.1:7070 through HOST_LISTEN and
// HOST_SERVER, which every node and client flag reads; 7071–7073 and
// 6221–6223 as $HTTP_1… and $ROUTE_1…), $WORK/tmp/ for /tmp/, and small
// sizes for benchmarks (--nodes, --watchers, --followers, --messages,
// -benchtime, -count). A script may run more commands than the docs show:
// waits, and checks of what the docs say comes out.
//
// The go test benchmark lines take minutes even at -benchtime 1x (each
// compiles Go modules with fresh engines: about 10 minutes for all of them
// here), so by default `gotest` only checks the line: known flags, a
// package that exists, and every alternative of the -bench (or -run)
// pattern naming a benchmark (a test) of it. HOST_DOC_BENCH=1 runs them as
// written, at -benchtime 1x -count 1.

func TestDocs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts node processes and builds the examples")
	}
	bin := hostBinary(t)
	repo := filepath.Dir(filepath.Dir(examples.SourceDir()))
	vmtest.Examples(t) // examples/wasm/out, which the cluster and tenant scripts upload
	goEnv := goEnvVars(t)
	compiled := docsCompileCache(t)
	// host bench copies a seed into each node's cache and fills it when
	// empty: one per version of the modules it uploads.
	benchSeed := filepath.Join(os.TempDir(), "host-test-docs-bench-cache-"+contentKey(t,
		filepath.Join(examples.SourceDir(), "out", "chat.wasm"), filepath.Join(examples.SourceDir(), "out", "tally.wasm")))
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/script",
		RequireExplicitExec: true,
		RequireUniqueNames:  true,
		Setup: func(e *testscript.Env) error {
			e.Values[valuesKey{}] = e.Values // for setValue
			w := e.WorkDir
			for _, d := range []string{"bin", "home", "cache", "tmp"} {
				if err := os.MkdirAll(filepath.Join(w, d), 0o755); err != nil {
					return err
				}
			}
			if err := os.Link(bin, filepath.Join(w, "bin", "host")); err != nil {
				if err := copyFile(bin, filepath.Join(w, "bin", "host")); err != nil {
					return err
				}
			}
			if err := os.Symlink(filepath.Join(repo, "examples"), filepath.Join(w, "examples")); err != nil {
				return err
			}
			for _, d := range []string{"data", "d", "d1", "d2", "d3"} {
				if err := os.MkdirAll(filepath.Join(w, d), 0o755); err != nil {
					return err
				}
				if err := os.Symlink(compiled, filepath.Join(w, d, "cache")); err != nil {
					return err
				}
			}
			e.Setenv("PATH", filepath.Join(w, "bin")+string(os.PathListSeparator)+os.Getenv("PATH"))
			e.Setenv("HOME", filepath.Join(w, "home"))
			e.Setenv("XDG_CACHE_HOME", filepath.Join(w, "cache"))
			e.Setenv("REPO", repo)
			e.Setenv("HOST_BENCH_CACHE", benchSeed)
			for k, v := range goEnv {
				e.Setenv(k, v)
			}
			addr := freePort(t)
			_, port, _ := strings.Cut(addr, ":")
			e.Setenv("HOST_ADDR", addr)
			e.Setenv("HOST_PORT", port)
			e.Setenv("HOST_LISTEN", addr)
			e.Setenv("HOST_SERVER", "http://"+addr)
			for i := 1; i <= 3; i++ {
				e.Setenv(fmt.Sprintf("HTTP_%d", i), freePort(t))
				e.Setenv(fmt.Sprintf("ROUTE_%d", i), freePort(t))
			}
			return nil
		},
		Condition: func(cond string) (bool, error) {
			if cond == "docbench" {
				return os.Getenv("HOST_DOC_BENCH") == "1", nil
			}
			return false, fmt.Errorf("unknown condition %q", cond)
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"bg":       cmdBg,
			"halt":     cmdHalt,
			"waitfile": cmdWaitFile,
			"retry":    cmdRetry,
			"capture":  cmdCapture,
			"export":   cmdExport,
			"gotest":   cmdGoTest,
		},
	})
}

// docsCompileCache is the compilation cache every node these tests start
// shares (through DATA/cache), kept across runs like vmtest's: compiling
// the Go examples is most of a cold node's start.
func docsCompileCache(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(os.TempDir(), "host-test-docs-wazero-cache")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// goEnvVars is what the go command needs with HOME elsewhere: the real
// build and module caches (a cold build cache would rebuild the world),
// and no network.
func goEnvVars(t *testing.T) map[string]string {
	t.Helper()
	names := []string{"GOCACHE", "GOMODCACHE", "GOPATH", "GOFLAGS", "GOROOT", "GOTOOLCHAIN"}
	out, err := exec.Command("go", append([]string{"env"}, names...)...).Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	vals := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(vals) != len(names) {
		t.Fatalf("go env printed %q", out)
	}
	env := map[string]string{"GOPROXY": "off", "GOWORK": "off"}
	for i, n := range names {
		env[n] = vals[i]
	}
	if env["GOTOOLCHAIN"] == "" || env["GOTOOLCHAIN"] == "auto" {
		env["GOTOOLCHAIN"] = "local"
	}
	return env
}

func contentKey(t *testing.T, paths ...string) string {
	t.Helper()
	h := sha256.New()
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o755)
}

// scriptEnv is the script's environment, which testscript hands only to
// the programs it runs: one of them writes it to a file (on stdout it
// would fill the log).
func scriptEnv(ts *testscript.TestScript) []string {
	f := filepath.Join(ts.Getenv("WORK"), ".tmp", "env")
	ts.Check(ts.Exec("sh", "-c", `env -0 >"$1"`, "sh", f))
	b, err := os.ReadFile(f)
	ts.Check(err)
	env := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	return append(env, "PWD="+ts.MkAbs("."))
}

// background is a program started by bg: its output goes to NAME.out in
// $WORK, where waitfile reads it while it runs.
type background struct {
	cmd  *exec.Cmd
	out  string
	done chan struct{}
	err  error
}

// bg NAME PROGRAM [ARGS...] starts a program in its own process group (so
// halt signals it like Ctrl-C in a terminal signals "go run" and its
// child), with stdout and stderr in $WORK/NAME.out. Whatever still runs at the
// end of the script is killed; each output's tail goes to the log.
func cmdBg(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: bg NAME PROGRAM [ARGS...]")
	}
	name := args[0]
	if ts.Value(bgKey(name)) != nil {
		ts.Fatalf("bg %s: already started", name)
	}
	env := scriptEnv(ts)
	prog := args[1]
	if !strings.Contains(prog, "/") {
		p, err := lookPath(prog, env)
		ts.Check(err)
		prog = p
	}
	outPath := filepath.Join(ts.Getenv("WORK"), name+".out")
	f, err := os.Create(outPath)
	ts.Check(err)
	b := &background{cmd: exec.Command(prog, args[2:]...), out: outPath, done: make(chan struct{})}
	b.cmd.Dir = ts.MkAbs(".")
	b.cmd.Env = env
	b.cmd.Stdout, b.cmd.Stderr = f, f
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	ts.Check(b.cmd.Start())
	f.Close()
	go func() {
		b.err = b.cmd.Wait()
		close(b.done)
	}()
	setValue(ts, bgKey(name), b)
	ts.Defer(func() {
		select {
		case <-b.done:
		default:
			syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
			<-b.done
		}
		ts.Logf("[%s.out, last lines]\n%s", name, tailFile(outPath, 20))
	})
}

// halt [-KILL] [-anystatus] NAME... signals each bg program's process
// group (SIGINT, as Ctrl-C does, unless -KILL) and waits for it: after
// SIGINT it must exit 0 (with !, fail), unless -anystatus: "go run" exits
// 1 when interrupted, whatever its child does.
func cmdHalt(ts *testscript.TestScript, neg bool, args []string) {
	sig, anyStatus := syscall.SIGINT, false
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		switch args[0] {
		case "-KILL":
			sig, anyStatus = syscall.SIGKILL, true
		case "-anystatus":
			anyStatus = true
		default:
			ts.Fatalf("halt: unknown flag %s", args[0])
		}
		args = args[1:]
	}
	if len(args) == 0 {
		ts.Fatalf("usage: halt [-KILL] [-anystatus] NAME...")
	}
	for _, name := range args {
		b, _ := ts.Value(bgKey(name)).(*background)
		if b == nil {
			ts.Fatalf("halt %s: no such bg program", name)
		}
		syscall.Kill(-b.cmd.Process.Pid, sig)
		select {
		case <-b.done:
		case <-time.After(60 * time.Second):
			ts.Fatalf("halt %s: still running 60s after %v\n%s", name, sig, tailFile(b.out, 20))
		}
		switch {
		case anyStatus:
		case b.err != nil && !neg:
			ts.Fatalf("halt %s: %v\n%s", name, b.err, tailFile(b.out, 20))
		case b.err == nil && neg:
			ts.Fatalf("halt %s: exited 0", name)
		}
	}
}

// waitfile [-count=N] FILE REGEXP waits (3 minutes at most) until FILE
// matches REGEXP at least N times (default 1), failing early if the bg
// program writing FILE exits first.
func cmdWaitFile(ts *testscript.TestScript, neg bool, args []string) {
	n := 1
	if len(args) > 0 && strings.HasPrefix(args[0], "-count=") {
		var err error
		n, err = strconv.Atoi(strings.TrimPrefix(args[0], "-count="))
		ts.Check(err)
		args = args[1:]
	}
	if neg || len(args) != 2 {
		ts.Fatalf("usage: waitfile [-count=N] FILE REGEXP")
	}
	re, err := regexp.Compile(args[1])
	ts.Check(err)
	path := ts.MkAbs(args[0])
	b, _ := ts.Value(bgKey(strings.TrimSuffix(filepath.Base(path), ".out"))).(*background)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		got, _ := os.ReadFile(path)
		if len(re.FindAllIndex(got, -1)) >= n {
			return
		}
		exited := false
		if b != nil {
			select {
			case <-b.done:
				exited = true
			default:
			}
		}
		if exited || time.Now().After(deadline) {
			// One more read: the last write may have come with the exit.
			if got, _ = os.ReadFile(path); len(re.FindAllIndex(got, -1)) >= n {
				return
			}
			ts.Fatalf("%s: no %d match(es) of %q (exited: %v)\n%s", args[0], n, args[1], exited, tailFile(path, 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// retry [-match REGEXP] PROGRAM [ARGS...] runs the program until it
// succeeds (and its stdout matches), for 3 minutes at most; stdout and
// stderr are then the last run's. For what the docs run once a node is up
// or a delivery has happened, which a reader does by waiting.
func cmdRetry(ts *testscript.TestScript, neg bool, args []string) {
	var re *regexp.Regexp
	if len(args) > 1 && args[0] == "-match" {
		var err error
		re, err = regexp.Compile(args[1])
		ts.Check(err)
		args = args[2:]
	}
	if neg || len(args) == 0 {
		ts.Fatalf("usage: retry [-match REGEXP] PROGRAM [ARGS...]")
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		err := ts.Exec(args[0], args[1:]...)
		if err == nil && (re == nil || re.MatchString(ts.ReadFile("stdout"))) {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("retry %s: not done within 3 minutes (last: %v)", strings.Join(args, " "), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// capture NAME REGEXP sets NAME to the regexp's first group in the last
// stdout: a token the previous command printed.
func cmdCapture(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: capture NAME REGEXP")
	}
	m := regexp.MustCompile(args[1]).FindStringSubmatch(ts.ReadFile("stdout"))
	if len(m) < 2 {
		ts.Fatalf("capture %s: no match of %q in stdout", args[0], args[1])
	}
	ts.Setenv(args[0], m[1])
}

var catSubst = regexp.MustCompile(`^"?\$\(cat ([^)]+)\)"?$`)

// export NAME=VALUE... is the shell's, for the docs' export lines: VALUE
// may be "$(cat FILE)", the file's content without its final newlines.
func cmdExport(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) == 0 {
		ts.Fatalf("usage: export NAME=VALUE...")
	}
	for _, a := range args {
		name, val, ok := strings.Cut(a, "=")
		if !ok {
			ts.Fatalf("export %s: want NAME=VALUE", a)
		}
		if m := catSubst.FindStringSubmatch(val); m != nil {
			val = strings.TrimRight(ts.ReadFile(m[1]), "\n")
		}
		ts.Setenv(name, val)
	}
}

// gotest [NAME=VALUE...] ARGS... is a documented "go test ARGS" line (with
// the environment the docs put before it): checked with -list, or with
// HOST_DOC_BENCH=1 run at -benchtime 1x -count 1. See the top of this file.
func cmdGoTest(ts *testscript.TestScript, neg bool, args []string) {
	if neg {
		ts.Fatalf("unsupported: ! gotest")
	}
	var env []string
	for len(args) > 0 && isAssignment(args[0]) {
		env, args = append(env, args[0]), args[1:]
	}
	flag := func(name string) (string, int) {
		for i := 0; i+1 < len(args); i++ {
			if args[i] == name {
				return args[i+1], i
			}
		}
		return "", -1
	}
	bench, _ := flag("-bench")
	run, _ := flag("-run")
	if os.Getenv("HOST_DOC_BENCH") == "1" {
		full := append([]string(nil), args...)
		for _, f := range []struct{ name, small string }{{"-benchtime", "1x"}, {"-count", "1"}} {
			if _, i := flag(f.name); i >= 0 {
				full[i+1] = f.small
			} else if bench != "" {
				full = append(full, f.name, f.small)
			}
		}
		ts.Check(ts.Exec("env", append(append(env, "go", "test"), full...)...))
		return
	}
	pattern, kind := bench, "Benchmark"
	if pattern == "" {
		pattern, kind = run, "Test"
	}
	if pattern == "" {
		ts.Fatalf("gotest: neither -bench nor -run")
	}
	var pkgs []string
	for i := 0; i < len(args); i++ {
		switch {
		case valuedTestFlags[args[i]]:
			i++
		case boolTestFlags[args[i]]:
		case strings.HasPrefix(args[i], "-"):
			ts.Fatalf("gotest: %s is not a go test flag this check knows", args[i])
		default:
			pkgs = append(pkgs, args[i])
		}
	}
	if len(pkgs) != 1 {
		ts.Fatalf("gotest: want one package, have %q", pkgs)
	}
	names := listTests(ts, pkgs[0])
	top, _, _ := strings.Cut(pattern, "/") // sub-benchmarks are named at run time
	for _, alt := range strings.Split(top, "|") {
		re, err := regexp.Compile(alt)
		ts.Check(err)
		found := false
		for _, n := range names {
			found = found || (strings.HasPrefix(n, kind) && re.MatchString(n))
		}
		if !found {
			ts.Fatalf("gotest: %q in %s names no %s", alt, pkgs[0], strings.ToLower(kind))
		}
	}
}

var valuedTestFlags = map[string]bool{"-run": true, "-bench": true, "-benchtime": true, "-count": true,
	"-timeout": true, "-o": true, "-cpu": true, "-list": true, "-fuzz": true, "-fuzztime": true}

var boolTestFlags = map[string]bool{"-benchmem": true, "-v": true, "-short": true, "-race": true}

// listTests is every top-level Test, Benchmark, Fuzz and Example function
// of the package (a path from the script's directory), read from its test
// files: linking a test binary to ask it (go test -list) costs seconds per
// package, and the suite builds every package anyway.
func listTests(ts *testscript.TestScript, pkg string) []string {
	ts.Check(ts.Exec("go", "list", "-f", "{{.Dir}}", pkg))
	dir := strings.TrimSpace(ts.ReadFile("stdout"))
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	ts.Check(err)
	var names []string
	fset := token.NewFileSet()
	for _, f := range files {
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		ts.Check(err)
		for _, d := range af.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil {
				names = append(names, fn.Name.Name)
			}
		}
	}
	return names
}

var assignment = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

func isAssignment(s string) bool { return assignment.MatchString(s) }

type bgKey string

// setValue stores v for later commands of the same script, in the map
// that ts.Value reads (Setup's Env.Values).
func setValue(ts *testscript.TestScript, k, v any) {
	m, _ := ts.Value(valuesKey{}).(map[any]any)
	if m == nil {
		ts.Fatalf("no value map (Setup stores it)")
	}
	m[k] = v
}

type valuesKey struct{}

func lookPath(prog string, env []string) (string, error) {
	for _, kv := range env {
		if path, ok := strings.CutPrefix(kv, "PATH="); ok {
			for _, dir := range filepath.SplitList(path) {
				p := filepath.Join(dir, prog)
				if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
					return p, nil
				}
			}
		}
	}
	return "", fmt.Errorf("%s: not found in PATH", prog)
}

func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(bytes.ToValidUTF8(b, []byte("?"))), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
