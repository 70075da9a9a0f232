package delivery

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Filter selects events of a topic by their payload. Its syntax is
//
//	""                     every event
//	field=value            payload is a JSON object whose top-level field
//	                       equals value (a string, or a number or bool
//	                       written as JSON)
//	a=1&b=x                every condition holds
//
// Filters are evaluated where events are read: by the pump for object
// edges, by the receiving node for connection edges, and by the stream
// reader. A filter that does not parse matches nothing (and is refused at
// follow time by ParseFilter).
type Filter struct {
	conds []cond
	bad   bool
}

type cond struct {
	field string
	str   string          // the value as a JSON string
	raw   json.RawMessage // the value as written, for numbers and bools
}

// MaxFilterLen bounds a filter's text.
const MaxFilterLen = 1024

// ParseFilter parses a filter.
func ParseFilter(s string) (Filter, error) {
	var f Filter
	if s == "" {
		return f, nil
	}
	if len(s) > MaxFilterLen {
		return Filter{bad: true}, fmt.Errorf("filter is longer than %d bytes", MaxFilterLen)
	}
	for _, part := range strings.Split(s, "&") {
		k, v, ok := strings.Cut(part, "=")
		if !ok || k == "" {
			return Filter{bad: true}, fmt.Errorf("filter %q: each condition is field=value", s)
		}
		f.conds = append(f.conds, cond{field: k, str: v, raw: json.RawMessage(v)})
	}
	return f, nil
}

// MustFilter parses s, yielding a filter that matches nothing when s is
// malformed (edges hold filters that were validated when they were made).
func MustFilter(s string) Filter {
	f, err := ParseFilter(s)
	if err != nil {
		return Filter{bad: true}
	}
	return f
}

// MatchFunc returns Match, or nil when the filter matches every event: the
// form a store.Query takes, where nil lets the log read stop at its limit
// in SQL.
func (f Filter) MatchFunc() func(payload []byte) bool {
	if f.All() {
		return nil
	}
	return f.Match
}

// All reports whether the filter matches every event.
func (f Filter) All() bool { return !f.bad && len(f.conds) == 0 }

// Match reports whether payload passes the filter.
func (f Filter) Match(payload []byte) bool {
	if f.bad {
		return false
	}
	if len(f.conds) == 0 {
		return true
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(payload, &obj) != nil {
		return false
	}
	for _, c := range f.conds {
		v, ok := obj[c.field]
		if !ok {
			return false
		}
		if len(v) > 0 && v[0] == '"' {
			var s string
			if json.Unmarshal(v, &s) != nil || s != c.str {
				return false
			}
			continue
		}
		if !bytes.Equal(bytes.TrimSpace(v), c.raw) {
			return false
		}
	}
	return true
}
