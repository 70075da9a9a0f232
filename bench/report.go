package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"text/tabwriter"
)

// Machine describes where a run happened.
type Machine struct {
	OS     string `json:"os"`
	Arch   string `json:"arch"`
	CPUs   int    `json:"cpus"`
	CPU    string `json:"cpu,omitempty"`
	Go     string `json:"go"`
	Load   string `json:"load_avg,omitempty"`
	NoFile string `json:"nofile,omitempty"`
}

// ThisMachine reads what it can about the machine.
func ThisMachine() Machine {
	m := Machine{OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		if len(f) >= 3 {
			m.Load = strings.Join(f[:3], " ")
		}
	}
	return m
}

// Ratio is a baseline's figure divided by the product's, same run.
type Ratio struct {
	Baseline string  `json:"baseline"`
	Sends    float64 `json:"sends"`
	Bytes    float64 `json:"bytes"`
	CPU      float64 `json:"cpu"`
	P99      float64 `json:"p99"`
}

// FanoutReport is a whole `host bench fanout` invocation.
type FanoutReport struct {
	Machine Machine         `json:"machine"`
	Runs    []*FanoutResult `json:"runs"`
	Raw     *RawResult      `json:"raw,omitempty"`
	Ratios  []Ratio         `json:"ratios,omitempty"`
	// P99VsRaw is the product's p99 publish→socket over the raw ceiling's
	// p99 (aim: ≤ 1.5).
	P99VsRaw float64 `json:"p99_vs_raw,omitempty"`
}

// FanoutAllConfig runs several modes, then the raw ceiling.
type FanoutAllConfig struct {
	FanoutConfig
	Modes []string
	// SkipRaw skips the raw ceiling.
	SkipRaw bool
}

// RunFanoutAll runs each mode on its own fresh cluster (the mode is a node
// flag) with the same workload, then the raw single-process ceiling for
// the same number of sockets, and computes the ratios.
func RunFanoutAll(ctx context.Context, cfg FanoutAllConfig) (*FanoutReport, error) {
	rep := &FanoutReport{Machine: ThisMachine()}
	seed := cfg.CacheSeed
	if seed == "" {
		d, err := os.MkdirTemp("", "host-bench-cache-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		seed = d
	}
	var sample []byte
	for _, mode := range cfg.Modes {
		c := cfg.FanoutConfig
		c.Mode, c.CacheSeed = mode, seed
		r, err := RunFanout(ctx, c)
		if err != nil {
			return rep, fmt.Errorf("%s: %w", mode, err)
		}
		if sample == nil {
			sample = r.sample
		}
		rep.Runs = append(rep.Runs, r)
	}
	if !cfg.SkipRaw {
		raw, err := RunRaw(ctx, cfg.Watchers, cfg.Messages, sample, cfg.Progress)
		if err != nil {
			return rep, err
		}
		rep.Raw = raw
	}
	rep.compute()
	return rep, nil
}

func (rep *FanoutReport) compute() {
	var product *FanoutResult
	for _, r := range rep.Runs {
		if r.Mode == ModeNode {
			product = r
		}
	}
	if product == nil {
		return
	}
	div := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	for _, r := range rep.Runs {
		if r == product {
			continue
		}
		rep.Ratios = append(rep.Ratios, Ratio{
			Baseline: r.Mode,
			Sends:    div(r.SendsPerMsg, product.SendsPerMsg),
			Bytes:    div(r.BytesPerMsg, product.BytesPerMsg),
			CPU:      div(r.CPUPerMsg, product.CPUPerMsg),
			P99:      div(r.P99Ms, product.P99Ms),
		})
	}
	if rep.Raw != nil {
		rep.P99VsRaw = div(product.P99Ms, rep.Raw.P99Ms)
	}
}

func ms(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case v >= 10:
		return fmt.Sprintf("%.0f ms", v)
	default:
		return fmt.Sprintf("%.2f ms", v)
	}
}

func num(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// WriteTable prints the report for people.
func (rep *FanoutReport) WriteTable(w io.Writer) {
	m := rep.Machine
	fmt.Fprintf(w, "machine: %d CPUs %s, %s/%s, %s, load %s\n", m.CPUs, m.CPU, m.OS, m.Arch, m.Go, m.Load)
	if len(rep.Runs) > 0 {
		r := rep.Runs[0]
		fmt.Fprintf(w, "workload: %d node processes, %d watchers (round-robin), %d messages closed loop\n\n", r.Nodes, r.Watchers, r.Messages)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tnodes w/ sockets\tsends/msg\tinter-node/msg\tbytes/msg\tevent B/msg\tedge B/msg\tnode CPU s/msg\tclient CPU s/msg\tp50\tp99\tp999\tall p99\tdeliveries/s\tdelivered\tout of order\t")
	for _, r := range rep.Runs {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%.4f\t%.4f\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%d\t\n",
			r.Mode, r.NodesWithSockets, num(r.SendsPerMsg), num(r.InterNodePerMsg), num(r.BytesPerMsg), num(r.EventBytesPerMsg), num(r.EdgeBytesPerMsg),
			r.CPUPerMsg, r.ClientCPUPerMsg, ms(r.P50Ms), ms(r.P99Ms), ms(r.P999Ms), ms(r.AllP99Ms),
			num(r.DeliveriesPerSec), r.Delivered, r.Expected, r.OutOfOrder)
	}
	if r := rep.Raw; r != nil {
		fmt.Fprintf(tw, "raw ceiling (1 process)\t\t\t\t\t\t\t\t%.4f\t%s\t%s\t%s\t%s\t%s\t%d/%d\t\t\n",
			r.CPUPerRound, ms(r.P50Ms), ms(r.P99Ms), ms(r.P999Ms), ms(r.AllP99Ms), num(r.FramesPerSec), r.Rounds*r.Sockets, r.Rounds*r.Sockets)
	}
	tw.Flush()
	for _, r := range rep.Runs {
		if r.Churn > 0 {
			fmt.Fprintf(w, "%s churn: %.3g of the watchers per second asked; %d joined, %d left in %.1f s (%.1f/s); %.2f whole edge sets per message\n",
				r.Mode, r.Churn, r.Joined, r.Left, r.ChurnS, float64(r.Joined)/max(r.ChurnS, 1e-9), r.WholeSetsPerMsg)
		}
	}
	if len(rep.Ratios) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "baseline / product\tsends\tbytes\tCPU\tp99\t")
		for _, r := range rep.Ratios {
			fmt.Fprintf(tw, "%s\t%.2f×\t%.2f×\t%.2f×\t%.2f×\t\n", r.Baseline, r.Sends, r.Bytes, r.CPU, r.P99)
		}
		tw.Flush()
	}
	if rep.P99VsRaw > 0 {
		fmt.Fprintf(w, "\nproduct p99 publish→socket / raw ceiling p99: %.2f× (aim ≤ 1.5×)\n", rep.P99VsRaw)
	}
}

// WriteTable prints the followers result for people.
func (r *FollowersResult) WriteTable(w io.Writer, m Machine) {
	fmt.Fprintf(w, "machine: %d CPUs %s, %s/%s, %s, load %s\n", m.CPUs, m.CPU, m.OS, m.Arch, m.Go, m.Load)
	fmt.Fprintf(w, "workload: %d node processes, %d tally followers off the publisher's node, %d messages closed loop\n\n", r.Nodes, r.Followers, r.Messages)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "followers\tdeliveries/msg\tlocal/msg\tbytes/msg\tnode CPU s/msg\tretries/msg\tp50\tp99\tp999\tevents/s\treceives/s\texact counts\tduplicates\t")
	fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%.4f\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%d\t\n",
		r.Followers, num(r.DeliveriesPerMsg), num(r.LocalDeliveriesPerMsg), num(r.BytesPerMsg), r.CPUPerMsg, num(r.RetriesPerMsg),
		ms(r.P50Ms), ms(r.P99Ms), ms(r.P999Ms), num(r.EventsPerSec), num(r.ReceivesPerSec), r.CountsOK, r.Followers, r.Duplicates)
	tw.Flush()
}
