package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/durable-host/host/host/hosttest"
	"github.com/durable-host/host/vm/vmtest"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

// hostBinary builds the CLI once per test process.
func hostBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "host-cli-test-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "host")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = err
			binPath = string(out)
		}
	})
	if binErr != nil {
		t.Fatalf("go build: %v\n%s", binErr, binPath)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// freePort returns a loopback address nobody listens on right now.
var freePort = hosttest.FreeAddr

// cleanEnv is the environment without HOST_ variables that would change
// the flags under test.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOST_") {
			env = append(env, kv)
		}
	}
	return env
}

type server struct {
	cmd    *exec.Cmd
	out    *bytes.Buffer
	done   chan error
	waited bool
}

// startServer runs `host serve` as its own process and waits for /healthz.
func startServer(t *testing.T, bin, data, addr string) *server {
	t.Helper()
	s := spawnServer(t, bin, data, addr)
	waitHealthy(t, addr, s)
	return s
}

// spawnServer starts `host serve` (with extra flags) as its own process and
// kills it at the end of the test unless the test waited for it.
func spawnServer(t *testing.T, bin, data, addr string, extra ...string) *server {
	t.Helper()
	args := append([]string{"serve", "--data", data, "--listen", addr, "--log-level", "warn"}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Env = cleanEnv()
	return spawn(t, cmd)
}

// spawn starts cmd, a node's process, with its output collected, and kills
// it at the end of the test unless the test waited for it.
func spawn(t *testing.T, cmd *exec.Cmd) *server {
	t.Helper()
	s := &server{cmd: cmd, out: &bytes.Buffer{}, done: make(chan error, 1)}
	lw := &lockedWriter{w: s.out}
	s.cmd.Stdout, s.cmd.Stderr = lw, lw
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.done <- s.cmd.Wait() }()
	t.Cleanup(func() {
		if !s.waited {
			s.cmd.Process.Kill()
			<-s.done
		}
	})
	return s
}

// waitHealthy waits for the server's /healthz, failing if it exits first.
func waitHealthy(t *testing.T, addr string, s *server) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case err := <-s.done:
			s.waited = true
			t.Fatalf("host serve exited early: %v\n%s", err, s.out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("host serve not healthy within 90s\n%s", s.out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (s *server) stop(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-s.done:
		s.waited = true
		if err != nil {
			t.Fatalf("host serve after SIGTERM: %v\n%s", err, s.out)
		}
	case <-time.After(40 * time.Second):
		t.Fatalf("host serve did not exit within 40s of SIGTERM\n%s", s.out)
	}
	if !strings.Contains(s.out.String(), "shutting down") {
		t.Fatalf("no graceful shutdown message:\n%s", s.out)
	}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// runBin runs the binary as a client and returns stdout; it fails the test on
// a non-zero exit.
func runBin(t *testing.T, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = cleanEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("host %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// TestCLIEndToEnd is the user flow through the binary: serve, upload, call,
// SIGTERM, serve again, the value is still there.
func TestCLIEndToEnd(t *testing.T) {
	bin := hostBinary(t)
	data := t.TempDir()
	addr := freePort(t)
	base := "http://" + addr
	wasm := filepath.Join(t.TempDir(), "counter.wasm")
	if err := os.WriteFile(wasm, vmtest.Wasm(t, "counter"), 0o644); err != nil {
		t.Fatal(err)
	}

	s := startServer(t, bin, data, addr)
	out := runBin(t, bin, "upload", wasm, "--name", "counter", "--server", base)
	for _, want := range []string{"counter", "version  1", "sha256:", "call"} {
		if !strings.Contains(out, want) {
			t.Fatalf("upload output lacks %q:\n%s", want, out)
		}
	}
	if got := runBin(t, bin, "call", "counter/c1", "inc", "--server", base); got != "1\n" {
		t.Fatalf("first inc printed %q", got)
	}
	if got := runBin(t, bin, "call", "--server", base, "counter/c1", "inc"); got != "2\n" {
		t.Fatalf("second inc printed %q", got)
	}
	if got := runBin(t, bin, "programs", "--server", base); !strings.Contains(got, `"counter"`) {
		t.Fatalf("programs printed %q", got)
	}
	s.stop(t)

	s = startServer(t, bin, data, addr)
	if got := runBin(t, bin, "call", "counter/c1", "get", "--server", base); got != "2\n" {
		t.Fatalf("get after restart printed %q", got)
	}
	// HOST_SERVER is the environment form of --server.
	cmd := exec.Command(bin, "call", "counter/c1", "inc")
	cmd.Env = append(cleanEnv(), "HOST_SERVER="+base)
	if got, err := cmd.Output(); err != nil || string(got) != "3\n" {
		t.Fatalf("call with HOST_SERVER: %q %v", got, err)
	}
	s.stop(t)
}

// runCLI runs the CLI in process.
func runCLI(stdin string, args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(append([]string{"host"}, args...), strings.NewReader(stdin), &o, &e)
	return code, o.String(), e.String()
}

func TestHelp(t *testing.T) {
	code, out, errOut := runCLI("", "--help")
	if code != 0 {
		t.Fatalf("--help exited %d: %s", code, errOut)
	}
	for _, cmd := range []string{"serve", "dev", "upload", "call", "programs"} {
		if !strings.Contains(out, cmd) {
			t.Errorf("--help does not mention %q:\n%s", cmd, out)
		}
	}
	for _, c := range []struct {
		cmd   string
		wants []string
	}{
		{"serve", []string{"--data", "--listen", "--budget", "--memory-pages", "--max-active-objects", "--idle-timeout", "--sync", "SIGTERM"}},
		{"dev", []string{"--data", "--listen", "examples"}},
		{"upload", []string{"--name", "--server", "FILE.wasm"}},
		{"call", []string{"--server", "PROGRAM/ID METHOD", "http://127.0.0.1:7070"}},
		{"programs", []string{"--server"}},
	} {
		code, out, errOut := runCLI("", c.cmd, "--help")
		if code != 0 {
			t.Errorf("%s --help exited %d: %s", c.cmd, code, errOut)
			continue
		}
		for _, w := range c.wants {
			if !strings.Contains(out, w) {
				t.Errorf("%s --help does not mention %q:\n%s", c.cmd, w, out)
			}
		}
	}
}

func TestUsageErrors(t *testing.T) {
	unreachable := "http://" + freePort(t)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"call"}, "usage: host call"},
		{[]string{"call", "counter/c1"}, "usage: host call"},
		{[]string{"call", "counter/c1", "inc", "{}", "extra"}, "usage: host call"},
		{[]string{"call", "counter", "inc", "--server", unreachable}, "PROGRAM/ID"},
		{[]string{"call", "counter/../x", "inc", "--server", unreachable}, "object id"},
		{[]string{"call", "counter/c1", "inc", "--server", unreachable}, "cannot reach"},
		{[]string{"upload"}, "usage: host upload"},
		{[]string{"upload", filepath.Join(t.TempDir(), "missing.wasm")}, "no such file"},
		{[]string{"serve", "--sync", "sometimes", "--data", t.TempDir()}, "sync"},
		{[]string{"serve", "--idle-timeout", "0s", "--data", t.TempDir()}, "idle timeout"},
		{[]string{"serve", "--log-level", "loud", "--data", t.TempDir()}, "log-level"},
		{[]string{"serve", "--no-such-flag"}, "no-such-flag"},
	}
	for _, c := range cases {
		code, out, errOut := runCLI("", c.args...)
		if code == 0 {
			t.Errorf("host %s exited 0; stdout %q", strings.Join(c.args, " "), out)
			continue
		}
		if !strings.Contains(errOut+out, c.want) {
			t.Errorf("host %s: output does not mention %q:\nstdout: %s\nstderr: %s", strings.Join(c.args, " "), c.want, out, errOut)
		}
	}
}

// TestRunReturnsOnUnknownCommand: run must return an exit code for every
// input, so the CLI is testable and errors go to its stderr. For an unknown
// command urfave/cli returns cli.Exit("No help topic for ...", 3); without
// an ExitErrHandler, cli.HandleExitCoder calls os.Exit(3) inside run. It
// runs in a child process so a regression cannot kill the test binary.
func TestRunReturnsOnUnknownCommand(t *testing.T) {
	if os.Getenv("CLI_TEST_CHILD_UNKNOWN") == "1" {
		code, _, errOut := runCLI("", "no-such-command")
		fmt.Printf("run returned %d; stderr %q\n", code, errOut)
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRunReturnsOnUnknownCommand$")
	cmd.Env = append(os.Environ(), "CLI_TEST_CHILD_UNKNOWN=1")
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "run returned") {
		t.Fatalf("run(host no-such-command) exited the process (exit code %d) instead of returning a code; output:\n%s", cmd.ProcessState.ExitCode(), out)
	}
	if strings.Contains(string(out), "run returned 0") || !strings.Contains(string(out), "no-such-command") {
		t.Fatalf("unknown command: %s", out)
	}
}

// TestClientCommandsInProcess runs upload and call in process against a node
// in process: payloads from arguments and stdin, and API errors on stderr.
func TestClientCommandsInProcess(t *testing.T) {
	n, _ := hosttest.Start(t, hosttest.Options{})
	wasm := filepath.Join(t.TempDir(), "counter.wasm")
	if err := os.WriteFile(wasm, vmtest.Wasm(t, "counter"), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := n.URL()

	// The name defaults to the file name.
	if code, out, e := runCLI("", "upload", "--server", srv, wasm); code != 0 || !strings.Contains(out, "program  counter") {
		t.Fatalf("upload: %d %q %q", code, out, e)
	}
	if code, out, e := runCLI("", "call", "counter/c1", "add", `{"amount": 5}`, "--server", srv); code != 0 || out != "5\n" {
		t.Fatalf("add: %d %q %q", code, out, e)
	}
	if code, out, e := runCLI(`{"amount": 2}`, "call", "counter/c1", "add", "-", "--server", srv); code != 0 || out != "7\n" {
		t.Fatalf("add from stdin: %d %q %q", code, out, e)
	}
	if code, out, e := runCLI("", "call", "counter/c1", "nope", "--server", srv); code != 1 || out != "" || !strings.Contains(e, "no such method") || !strings.Contains(e, "404") {
		t.Fatalf("unknown method: %d %q %q", code, out, e)
	}
	if code, out, e := runCLI("", "call", "missing/c1", "get", "--server", srv); code != 1 || !strings.Contains(e, "unknown program") {
		t.Fatalf("unknown program: %d %q %q", code, out, e)
	}
	notWasm := filepath.Join(t.TempDir(), "bad.wasm")
	os.WriteFile(notWasm, []byte("not wasm at all"), 0o644)
	if code, _, e := runCLI("", "upload", notWasm, "--server", srv); code != 1 || !strings.Contains(e, "400") {
		t.Fatalf("upload of garbage: %d %q", code, e)
	}
	if code, out, e := runCLI("", "programs", "counter", "--server", srv); code != 0 || !strings.Contains(out, `"versions"`) {
		t.Fatalf("programs counter: %d %q %q", code, out, e)
	}
	// subscribe reads the stream from storage: after 0 is every event, in
	// order; without --after the latest one first.
	if code, out, e := runCLI("", "subscribe", "counter/c1", "--after", "0", "--count", "2", "--server", srv); code != 0 ||
		strings.Count(out, `"type":"event"`) != 2 || !strings.Contains(out, `"seq":1`) || !strings.Contains(out, `"seq":2`) {
		t.Fatalf("subscribe --after 0: %d %q %q", code, out, e)
	}
	if code, out, e := runCLI("", "subscribe", "counter/c1", "--count", "1", "--server", srv); code != 0 || !strings.Contains(out, `"seq":2`) {
		t.Fatalf("subscribe: %d %q %q", code, out, e)
	}
	if code, _, e := runCLI("", "subscribe", "counter/c1", "--after", "-3", "--server", srv); code != 1 || !strings.Contains(e, "--after") {
		t.Fatalf("subscribe --after -3: %d %q", code, e)
	}
}
