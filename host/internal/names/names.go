// Package names is how the node names programs and objects: the rules a
// program name, a qualified (TENANT.PROGRAM) name and an object id follow,
// the Object type they make, and a principal's names resolved for its own
// use (plain names are its own, others' are unknown) or shown back to it.
//
// It owns no state and knows neither files nor HTTP: the node and its
// HTTP API both resolve names here, so the two cannot disagree. The Go
// client keeps its own copy of the three patterns (RATIONALE.md, "The
// client repeats the node's naming rules").
package names

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/host/internal/tenancy"
)

// Errors callers branch on. A bad name is abi.ErrBadRequest.
var (
	// ErrUnknownProgram: no program of that name (or another tenant's).
	ErrUnknownProgram = errors.New("unknown program")
	// ErrUnknownObject: no such object, or no such edge of it.
	ErrUnknownObject = errors.New("unknown object")
)

var (
	programName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	objectID    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
)

// Object names an object: a program and an id within it.
type Object struct {
	Program string
	ID      string
}

func (o Object) String() string { return o.Program + "/" + o.ID }

// Parse parses "program/id".
func Parse(s string) (Object, error) {
	p, id, ok := strings.Cut(s, "/")
	if !ok {
		return Object{}, fmt.Errorf("%w: object %q must be PROGRAM/ID", abi.ErrBadRequest, Clip(s))
	}
	o := Object{p, id}
	return o, o.Validate()
}

// Validate checks both parts.
func (o Object) Validate() error {
	if err := ValidateQualifiedProgram(o.Program); err != nil {
		return err
	}
	return ValidateID(o.ID)
}

// ValidateProgram reports whether name can name a program.
func ValidateProgram(name string) error {
	if !programName.MatchString(name) {
		return fmt.Errorf("%w: program name %q must be 1-63 of a-z 0-9 _ - and start with a letter or digit", abi.ErrBadRequest, Clip(name))
	}
	return nil
}

// ValidateQualifiedProgram reports whether name is a program name with an
// optional tenant prefix: PROGRAM or TENANT.PROGRAM.
func ValidateQualifiedProgram(name string) error {
	t, p, ok := strings.Cut(name, ".")
	if !ok {
		return ValidateProgram(name)
	}
	if tenancy.ValidateName(t) != nil || ValidateProgram(p) != nil {
		return fmt.Errorf("%w: program name %q must be PROGRAM or TENANT.PROGRAM", abi.ErrBadRequest, Clip(name))
	}
	return nil
}

// ValidateID reports whether id can name an object of a program.
func ValidateID(id string) error {
	if !objectID.MatchString(id) {
		return fmt.Errorf("%w: object id %q must be 1-128 of A-Z a-z 0-9 . _ - and start with a letter or digit", abi.ErrBadRequest, Clip(id))
	}
	return nil
}

// Clip shortens a name a client sent to what an error message quotes.
func Clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// UnknownProgram is ErrUnknownProgram for name, with what to do.
func UnknownProgram(name string) error {
	return fmt.Errorf("%w: %q (upload it with: host upload FILE.wasm --name %s)", ErrUnknownProgram, Clip(name), Clip(name))
}

// ResolveProgram resolves a program name p wrote, for p's own use.
// Another tenant's name is "unknown": it reveals nothing.
func ResolveProgram(p tenancy.Principal, name string) (string, error) {
	q, ok := p.Program(name)
	if !ok {
		return "", UnknownProgram(name)
	}
	if err := ValidateQualifiedProgram(name); err != nil {
		return "", err
	}
	return q, nil
}

// ResolveObject resolves PROGRAM/ID parts p wrote, for p's own use.
func ResolveObject(p tenancy.Principal, program, id string) (Object, error) {
	q, err := ResolveProgram(p, program)
	if err != nil {
		return Object{}, err
	}
	o := Object{q, id}
	return o, ValidateID(id)
}

// FollowTarget resolves the PROGRAM/ID p asks to follow: its own (a plain
// name) or any tenant's (TENANT.PROGRAM/ID), for the publisher's follow
// hook to decide.
func FollowTarget(p tenancy.Principal, s string) (Object, error) {
	o, err := Parse(s)
	if err != nil {
		return o, err
	}
	o.Program = p.FollowTarget(o.Program)
	return o, nil
}

// Show is how p sees an object's name: its own without the prefix.
func Show(p tenancy.Principal, o Object) string {
	return p.Show(o.Program) + "/" + o.ID
}
