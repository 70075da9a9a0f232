package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/durable-host/host/bench"
	"github.com/durable-host/host/host/client"
)

// tallyName is the tally object that follows counter i.
func tallyName(i int) string { return fmt.Sprintf("tally/t%03d", i) }

// followed says whether counter i has a durable follower: every
// (Objects / Followers)th counter, from the first.
func (c Config) followed(i int) bool {
	if c.Followers <= 0 {
		return false
	}
	step := max(1, c.Objects/c.Followers)
	return i%step == 0 && i/step < c.Followers
}

// setupFollowers makes each followed counter (its first call, a get, makes
// node i%Nodes its home) and a tally that follows its "changes" topic, homed
// on the next node, before any write: the tally's seen/ keys must end equal
// to the counter's whole log.
func setupFollowers(ctx context.Context, cfg Config, cluster *bench.Cluster) error {
	n := len(cluster.Nodes)
	for i := range cfg.Objects {
		if !cfg.followed(i) {
			continue
		}
		if _, err := cluster.Nodes[i%n].Client.Call(ctx, objectName(i), string(Read), nil); err != nil {
			return fmt.Errorf("make %s: %w", objectName(i), err)
		}
		req := fmt.Appendf(nil, `{"publisher":%q,"topic":"changes"}`, objectName(i))
		if _, err := cluster.Nodes[(i+1)%n].Client.Call(ctx, tallyName(i), "follow", req); err != nil {
			return fmt.Errorf("%s follows %s: %w", tallyName(i), objectName(i), err)
		}
	}
	return nil
}

// tallyCounts is a tally's counts reply.
type tallyCounts struct {
	Total      int64 `json:"total"`
	Duplicates int64 `json:"duplicates"`
}

// readTally waits (up to wait) until the tally has counted want events, then
// reads its counts and the seqs of its seen/ keys for publisher, through
// node i and the next ones on failure.
func readTally(ctx context.Context, cluster *bench.Cluster, i int, tally, publisher string, want int, wait time.Duration) (tallyCounts, []uint64, error) {
	n := len(cluster.Nodes)
	deadline := time.Now().Add(wait)
	var counts tallyCounts
	var err error
	for k := 0; ; k++ {
		c := cluster.Nodes[(i+k)%n].Client
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var out []byte
		out, err = c.Call(cctx, tally, "counts", nil)
		cancel()
		if err == nil {
			err = json.Unmarshal(out, &counts)
		}
		if err == nil && counts.Total+counts.Duplicates >= int64(want) {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			// Check what it has: the missing seqs are the finding.
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	var seqs []uint64
	for k := range n {
		seqs, err = tallySeen(ctx, cluster.Nodes[(i+k)%n].Client, tally, publisher)
		if err == nil {
			return counts, seqs, nil
		}
	}
	return counts, nil, fmt.Errorf("read %s's seen/ keys: %w", tally, err)
}

// tallySeen reads the seqs of tally's seen/<publisher>/<seq> keys, one per
// event its receive handler committed, through the state API.
func tallySeen(ctx context.Context, c *client.Client, tally, publisher string) ([]uint64, error) {
	prefix := "seen/" + publisher + "/"
	var seqs []uint64
	after := ""
	for {
		var page struct {
			Pairs []struct {
				Key string `json:"key"`
			} `json:"pairs"`
			Next string `json:"next"`
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := c.State(cctx, tally, prefix, client.Page{After: after, Limit: 1000}, &page)
		cancel()
		if err != nil {
			return nil, err
		}
		for _, p := range page.Pairs {
			s, err := strconv.ParseUint(strings.TrimPrefix(p.Key, prefix), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("key %q: %w", p.Key, err)
			}
			seqs = append(seqs, s)
		}
		if page.Next == "" || len(page.Pairs) == 0 {
			return seqs, nil
		}
		after = page.Next
	}
}
