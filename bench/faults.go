package bench

import (
	"context"
	"fmt"
	"syscall"
	"time"
)

// The faults a chaos run injects into one node process. None of them waits
// for the cluster to list the node again: call WaitMembers for that (not
// while a node is paused: it would wait out the paused node's timeouts).

// Kill9 kills node i with SIGKILL (no shutdown path runs) and waits for
// the process to be gone.
func (c *Cluster) Kill9(i int) error {
	n := c.Nodes[i]
	if err := n.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill node %d: %w", i, err)
	}
	<-n.done
	return nil
}

// Start starts node i again on its data directory after Kill9; it joins
// under a new id.
func (c *Cluster) Start(i int) error {
	if err := c.Nodes[i].start(c.cfg.Exe); err != nil {
		return fmt.Errorf("start node %d: %w", i, err)
	}
	return nil
}

// Pause stops node i with SIGSTOP: its process, connections and leases
// stay, but it answers nothing until Resume.
func (c *Cluster) Pause(i int) error {
	if err := c.Nodes[i].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pause node %d: %w", i, err)
	}
	return nil
}

// Resume continues node i after Pause (SIGCONT).
func (c *Cluster) Resume(i int) error {
	if err := c.Nodes[i].cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("resume node %d: %w", i, err)
	}
	return nil
}

// Running reports whether node i's process has not exited.
func (c *Cluster) Running(i int) bool {
	select {
	case <-c.Nodes[i].done:
		return false
	default:
		return true
	}
}

// WaitMembers waits until every node lists all the cluster's nodes as
// live, and no more: a killed node's old id lingers until its lease lapses.
func (c *Cluster) WaitMembers(ctx context.Context, timeout time.Duration) error {
	return c.waitMembers(ctx, timeout)
}

// NodeID asks node i for its current id (GET /healthz).
func (c *Cluster) NodeID(ctx context.Context, i int) (string, error) {
	var h struct {
		Node string `json:"node"`
	}
	if err := c.Nodes[i].Client.Get(ctx, "/healthz", &h); err != nil {
		return "", err
	}
	return h.Node, nil
}

// Dir is the directory holding the nodes' data and logs.
func (c *Cluster) Dir() string { return c.dir }
