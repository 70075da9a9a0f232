package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/durable-host/host/host"
	"github.com/durable-host/host/host/client"
	"github.com/durable-host/host/vm/vmtest"
)

// startNode starts a node in this process, with its data in a temporary
// directory and HTTP on a free loopback port, and uploads the counter
// example. A client of a running node needs only its URL.
func startNode() (url string, stop func()) {
	dir, err := os.MkdirTemp("", "client-example-")
	if err != nil {
		log.Fatal(err)
	}
	cfg := host.DefaultConfig()
	cfg.DataDir = dir
	cfg.Listen = "127.0.0.1:0"
	cfg.VM.CacheDir = vmtest.CacheDir()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := host.New(context.Background(), cfg)
	if err != nil {
		log.Fatal(err)
	}
	if err := n.Start(); err != nil {
		log.Fatal(err)
	}
	return n.URL(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		n.Shutdown(ctx)
		os.RemoveAll(dir)
	}
}

// counter is the counter example's module, built from its source.
func counter() []byte {
	wasm, err := vmtest.Module("counter")
	if err != nil {
		log.Fatal(err)
	}
	return wasm
}

// Upload a program, then call one of its objects: counter/c1 exists once
// it is first called.
func Example() {
	ctx := context.Background()
	url, stop := startNode()
	defer stop()

	c := &client.Client{Base: url}
	p, err := c.Upload(ctx, "counter", counter())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("uploaded", p.Name, "version", p.Version)
	for _, call := range []struct{ method, payload string }{{"inc", ""}, {"inc", ""}, {"add", `{"amount": 5}`}} {
		out, err := c.Call(ctx, "counter/c1", call.method, []byte(call.payload))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s → %s\n", call.method, out)
	}
	// Output:
	// uploaded counter version 1
	// inc → 1
	// inc → 2
	// add → 7
}

// An error reply is an *APIError with the node's status and message.
func ExampleAPIError() {
	ctx := context.Background()
	url, stop := startNode()
	defer stop()

	c := &client.Client{Base: url}
	_, err := c.Call(ctx, "counter/c1", "inc", nil)
	var ae *client.APIError
	if errors.As(err, &ae) {
		fmt.Println(ae.Status, ae.Message)
	}
	// Output:
	// 404 unknown program: "counter" (upload it with: host upload FILE.wasm --name counter)
}

// Subscribe reads an object's log from a checkpoint, then what it publishes
// next: each event arrives as the forward envelope.
func ExampleClient_Subscribe() {
	ctx := context.Background()
	url, stop := startNode()
	defer stop()

	c := &client.Client{Base: url}
	if _, err := c.Upload(ctx, "counter", counter()); err != nil {
		log.Fatal(err)
	}
	for range 3 {
		if _, err := c.Call(ctx, "counter/c1", "inc", nil); err != nil {
			log.Fatal(err)
		}
	}
	after := uint64(0) // exclusive: every event from seq 1
	n := 0
	err := c.Subscribe(ctx, "counter/c1", client.SubscribeOptions{Topic: "changes", After: &after}, func(data []byte) bool {
		var ev struct {
			Publisher string          `json:"publisher"`
			Topic     string          `json:"topic"`
			Seq       uint64          `json:"seq"`
			Payload   json.RawMessage `json:"payload"`
		}
		if err := json.Unmarshal(data, &ev); err != nil {
			log.Fatal(err)
		}
		fmt.Println(ev.Publisher, ev.Topic, ev.Seq, string(ev.Payload))
		n++
		return n < 3
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// counter/c1 changes 1 {"value":1}
	// counter/c1 changes 2 {"value":2}
	// counter/c1 changes 3 {"value":3}
}

// Watch follows an object over a WebSocket connection. Frames come once the
// follow is approved, which Edges shows as the connection's edge; a new edge
// starts at the log's head, so only later events arrive.
func ExampleClient_Watch() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url, stop := startNode()
	defer stop()

	c := &client.Client{Base: url}
	if _, err := c.Upload(ctx, "counter", counter()); err != nil {
		log.Fatal(err)
	}
	if _, err := c.Call(ctx, "counter/c1", "inc", nil); err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		n := 0
		done <- c.Watch(ctx, "counter/c1", client.WatchOptions{Topic: "changes"}, func(frame []byte) bool {
			var ev struct {
				Seq     uint64          `json:"seq"`
				Payload json.RawMessage `json:"payload"`
			}
			if err := json.Unmarshal(frame, &ev); err != nil {
				log.Fatal(err)
			}
			fmt.Println(ev.Seq, string(ev.Payload))
			n++
			return n < 2
		})
	}()
	for {
		var edges struct {
			Edges []json.RawMessage `json:"edges"`
		}
		if err := c.Edges(ctx, "counter/c1", &edges); err != nil {
			log.Fatal(err)
		}
		if len(edges.Edges) == 1 {
			break
		}
		time.Sleep(10 * time.Millisecond) // poll; ctx bounds the wait
	}
	for range 2 {
		if _, err := c.Call(ctx, "counter/c1", "inc", nil); err != nil {
			log.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output:
	// 2 {"value":2}
	// 3 {"value":3}
}
