package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/durable-host/host/host"
	hclient "github.com/durable-host/host/host/client"
	"github.com/durable-host/host/host/hosttest"
	"github.com/durable-host/host/vm/vmtest"
)

// chromiumPath is Debian's chromium, which CI installs.
const chromiumPath = "/usr/bin/chromium"

// demoMessage is one message as the demo page shows it.
type demoMessage struct {
	Author string `json:"author"`
	Text   string `json:"text"`
}

// TestDemoPageTwoBrowsers opens the demo chat page of `host dev` in two tabs
// of headless Chromium in one room; each posts through the page's form and
// both see both messages, in publish order, over the WebSocket API.
func TestDemoPageTwoBrowsers(t *testing.T) {
	hosttest.Heavy(t)
	t.Parallel()
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is missing: CI must install Debian's chromium package", chromiumPath)
		}
		t.Skipf("%s is missing (apt-get install chromium): skipping the browser test", chromiumPath)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	dataDir := t.TempDir()
	n := startDemoNode(t, dataDir, "127.0.0.1:0")
	if _, err := (&hclient.Client{Base: n.URL()}).Upload(ctx, "chat", vmtest.Wasm(t, "chat")); err != nil {
		t.Fatalf("upload chat: %v", err)
	}

	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(900, 640),
	}
	allocCtx, allocCancel := chromedp.NewExecAllocator(ctx, opts...)
	defer allocCancel()

	// Page A starts the browser; page B is a second tab (target) in it.
	pageA, cancelA := chromedp.NewContext(allocCtx)
	defer cancelA()
	if err := chromedp.Do(pageA); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	pageB, cancelB := chromedp.NewContext(pageA)
	defer cancelB()
	logA, logB := logConsole("A", pageA), logConsole("B", pageB)
	defer logA.report(t)
	defer logB.report(t)

	url := n.URL() + "/?room=r1"
	open := func(name string, page context.Context, author string) {
		t.Helper()
		if err := chromedp.Do(page,
			chromedp.Navigate(url),
			chromedp.WaitVisible(chromedp.ID("compose")),
			// The name input may hold the one another tab remembered.
			chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
				_, err := chromedp.Evaluate[bool](`(document.getElementById("name").value = "") === ""`)(ctx, t)
				return err
			}),
			chromedp.SendKeys(chromedp.ID("name"), author),
		); err != nil {
			t.Fatalf("page %s: open %s: %v", name, url, err)
		}
		waitFor(t, name, page, "the page is live", `document.getElementById("status").dataset.state === "live"`)
	}
	open("A", pageA, "alice")
	open("B", pageB, "bob")

	post := func(name string, page context.Context, text string) {
		t.Helper()
		if err := chromedp.Do(page,
			chromedp.SendKeys(chromedp.ID("text"), text),
			chromedp.Click(chromedp.ID("send")),
		); err != nil {
			t.Fatalf("page %s: post %q: %v", name, text, err)
		}
	}
	want := []demoMessage{{"alice", "hello from A <b>not bold</b>"}}
	post("A", pageA, want[0].Text)
	waitMessages(t, "A", pageA, want)
	waitMessages(t, "B", pageB, want)

	want = append(want, demoMessage{"bob", "hi from B & friends"})
	post("B", pageB, want[1].Text)
	waitMessages(t, "A", pageA, want)
	waitMessages(t, "B", pageB, want)

	// User text is shown as text, never parsed as markup.
	bold, err := chromedp.Run(pageA, chromedp.Evaluate[int](`document.querySelectorAll("#messages b").length`))
	if err != nil {
		t.Fatal(err)
	}
	if bold != 0 {
		t.Errorf("user text was rendered as HTML: %d <b> elements in the list", bold)
	}
	for name, page := range map[string]context.Context{"A": pageA, "B": pageB} {
		errText, err := chromedp.Run(page, chromedp.Evaluate[string](`document.getElementById("error").hidden ? "" : document.getElementById("error-text").textContent`))
		if err != nil {
			t.Fatal(err)
		}
		if errText != "" {
			t.Errorf("page %s shows an error: %s", name, errText)
		}
	}

	// A screenshot for people to look at (and for debugging a failure).
	png, err := chromedp.Run(pageA, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	shot := os.Getenv("DEMO_SCREENSHOT")
	if shot == "" {
		shot = "/tmp/demo.png"
	}
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Logf("write screenshot: %v", err)
	} else {
		t.Logf("screenshot of page A: %s", shot)
	}

	// A page opened later loads the room's history, once each.
	pageC, cancelC := chromedp.NewContext(pageA)
	defer cancelC()
	open("C", pageC, "carol")
	waitMessages(t, "C", pageC, want)

	// The node restarts on the same address: the pages say they are
	// offline, reconnect by themselves, follow again and carry on without
	// duplicating what they show.
	addr := n.Addr()
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	err = n.Shutdown(sctx)
	scancel()
	if err != nil {
		t.Fatalf("shut the node down: %v", err)
	}
	waitFor(t, "A", pageA, "the page shows it is offline", `document.getElementById("status").dataset.state !== "live"`)
	n = startDemoNode(t, dataDir, addr)
	waitFor(t, "A", pageA, "the page is live again", `document.getElementById("status").dataset.state === "live"`)
	waitFor(t, "B", pageB, "the page is live again", `document.getElementById("status").dataset.state === "live"`)
	want = append(want, demoMessage{"bob", "back again"})
	post("B", pageB, want[2].Text)
	for name, page := range map[string]context.Context{"A": pageA, "B": pageB, "C": pageC} {
		waitMessages(t, name, page, want)
	}

	// A room the API refuses shows the API's error.
	pageD, cancelD := chromedp.NewContext(pageA)
	defer cancelD()
	if err := chromedp.Do(pageD, chromedp.Navigate(n.URL()+"/?room=no%20spaces")); err != nil {
		t.Fatalf("page D: %v", err)
	}
	waitFor(t, "D", pageD, "the page shows the API's error",
		`!document.getElementById("error").hidden && document.getElementById("error-text").textContent.includes("object id")`)
}

// pageLog collects a page's console output and uncaught exceptions; the
// listener runs on chromedp's goroutines, so the test reads it under a lock.
type pageLog struct {
	mu         sync.Mutex
	lines      []string
	exceptions []string
}

// startDemoNode starts a node that serves the demo page, as `host dev` does.
func startDemoNode(t *testing.T, dataDir, listen string) *host.Node {
	t.Helper()
	n, _ := hosttest.Start(t, hosttest.Options{DataDir: dataDir, Configure: func(c *host.Config) {
		c.Listen = listen
		c.Demo = true
	}})
	return n
}

// logConsole starts collecting a page's console output and exceptions.
func logConsole(name string, page context.Context) *pageLog {
	l := &pageLog{}
	msgs := chromedp.Console(page)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			l.mu.Lock()
			if m.IsException() {
				l.exceptions = append(l.exceptions, fmt.Sprintf("page %s: uncaught exception: %s", name, m))
			} else {
				l.lines = append(l.lines, fmt.Sprintf("page %s console: %s", name, m))
			}
			l.mu.Unlock()
		}
	}()
	return l
}

// report logs what was collected and fails on uncaught exceptions.
func (l *pageLog) report(t *testing.T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.lines {
		t.Log(s)
	}
	for _, s := range l.exceptions {
		t.Error(s)
	}
}

// waitFor polls a JavaScript condition on a page until it holds, failing the
// test after a deadline.
func waitFor(t *testing.T, name string, page context.Context, what, cond string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, err := chromedp.Run(page, chromedp.Evaluate[bool](cond))
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("page %s: %s: not after 20s (last error: %v); page says: %s", name, what, err, pageState(page))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// shownMessages reads the messages a page shows, top to bottom.
const shownMessages = `JSON.stringify(Array.from(document.querySelectorAll("#messages li.msg")).map(li => ({
	author: li.querySelector(".author").textContent,
	text: li.querySelector(".text").textContent,
})))`

// waitMessages polls until a page shows exactly want, in order.
func waitMessages(t *testing.T, name string, page context.Context, want []demoMessage) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var last string
	for {
		got, err := chromedp.Run(page, chromedp.Evaluate[string](shownMessages))
		if err == nil {
			last = got
			var msgs []demoMessage
			if err = json.Unmarshal([]byte(got), &msgs); err == nil && slices.Equal(msgs, want) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("page %s: messages shown:\n  %s\nwant:\n  %+v\n(last error: %v); page says: %s", name, last, want, err, pageState(page))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pageState is the page's status line and error banner, for failure messages.
func pageState(page context.Context) string {
	s, err := chromedp.Run(page, chromedp.Evaluate[string](`"status: " + document.getElementById("status-text").textContent +
		(document.getElementById("error").hidden ? "" : "; error: " + document.getElementById("error-text").textContent)`))
	if err != nil {
		return fmt.Sprintf("(cannot read the page: %v)", err)
	}
	return s
}
