package chaos

import (
	"math"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// Minimal is the smallest failing history MinimizeHistory found: the
// operations whose timing the violation needs (Ops), and how many of the
// object's other writes it kept only as values (Relaxed): each may take
// effect at any time, at the value it produced, so the counter's values
// still chain.
type Minimal struct {
	Ops     []Op
	Relaxed int
	// Illegal says the history it started from was illegal (else Ops is
	// that history, and nothing was searched). Checks is how many
	// porcupine checks the search ran; Done is false when the budget ran
	// out first (Ops is then smaller than the start, not minimal).
	Illegal bool
	Checks  int
	Done    bool
}

// MinimizeHistory shrinks a history porcupine finds illegal to a smaller
// one it still finds illegal (delta debugging: drop chunks of operations,
// half the history first, down to one at a time, keeping every drop that
// leaves it illegal, until no single operation can go), within budget.
//
// A counter's add replies with the sum of every add before it, so dropping
// a write outright would make every later reply wrong: a new violation,
// not the one found. Dropping a write relaxes it instead: it keeps its
// value, with no time bounds. Reads are dropped outright. The result is
// 1-minimal: relaxing or dropping any one of its operations makes it
// legal (when Done).
func MinimizeHistory(ops []Op, applied Applied, budget time.Duration) Minimal {
	deadline := time.Now().Add(budget)
	var m Minimal
	// Only what the check reads: refused calls and unanswered reads
	// change nothing, and an ambiguous write the log lacks never applied.
	var strict []Op
	for _, o := range ops {
		_, inLog := applied[o.Amount]
		if o.Outcome == OK || (o.Kind == Write && o.Outcome == Ambiguous && inLog) {
			strict = append(strict, o)
		}
	}
	var relaxed []Op
	illegal := func(keep, relax []Op) bool {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		m.Checks++
		h := slices.Clone(keep)
		a := Applied{}
		for k, v := range applied {
			a[k] = v
		}
		for _, w := range relax {
			if w.Outcome == OK {
				a[w.Amount] = w.Value
			}
			w.Outcome, w.Call, w.Return = Ambiguous, 0, math.MaxInt64
			h = append(h, w)
		}
		return CheckLinearizable(h, a, min(left, 10*time.Second)).Result == porcupine.Illegal
	}
	if !illegal(strict, nil) {
		return Minimal{Ops: strict, Checks: m.Checks}
	}
	m.Illegal = true
	for chunk := max(1, len(strict)/2); ; {
		removed := false
		for i := 0; i < len(strict); {
			j := min(i+chunk, len(strict))
			keep := slices.Concat(strict[:i], strict[j:])
			relax := relaxed
			for _, o := range strict[i:j] {
				if o.Kind == Write {
					relax = append(slices.Clip(relax), o)
				}
			}
			if len(keep) > 0 && illegal(keep, relax) {
				strict, relaxed, removed = keep, relax, true
				continue
			}
			if time.Now().After(deadline) {
				m.Ops, m.Relaxed = strict, len(relaxed)
				return m
			}
			i = j
		}
		if chunk == 1 && !removed {
			break
		}
		chunk = max(1, chunk/2)
	}
	m.Ops, m.Relaxed, m.Done = strict, len(relaxed), true
	return m
}
