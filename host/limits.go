package host

import (
	"fmt"
	"net/http"
)

// Per-call caps that hold for every tenant: one call cannot publish a
// storm, however its guest loops.
const (
	// MaxPublishesPerCall bounds the events one handler call may publish.
	MaxPublishesPerCall = 10_000
	// MaxPublishBytesPerCall bounds the payload bytes one handler call may
	// publish, all events together.
	MaxPublishBytesPerCall = 16 << 20
)

// LimitError is a request refused by a limit: which limit, its value, and
// how much the request wanted. Sizes are 413, counts and rates 429.
// Nothing already stored is touched: the call that went over rolls back.
type LimitError struct {
	What   string // "module size", "programs", "publish rate", ...
	Limit  int64
	Want   int64 // what the request would have made it (or needed)
	Unit   string
	Status int
}

func (e *LimitError) Error() string {
	unit := e.Unit
	if unit != "" {
		unit = " " + unit
	}
	return fmt.Sprintf("%s limit exceeded: the limit is %d%s, this needs %d%s", e.What, e.Limit, unit, e.Want, unit)
}

func sizeLimit(what string, limit, want int64) *LimitError {
	return &LimitError{What: what, Limit: limit, Want: want, Unit: "bytes", Status: http.StatusRequestEntityTooLarge}
}

func countLimit(what string, limit, want int64, unit string) *LimitError {
	return &LimitError{What: what, Limit: limit, Want: want, Unit: unit, Status: http.StatusTooManyRequests}
}
