package client

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// errBadRequest prefixes the client's own checks of its arguments with the
// node's text for the same mistake ("bad request: ..."), so the CLI says
// the same whichever side finds it.
var errBadRequest = errors.New("bad request")

// The node's naming rules (host.ValidateProgramName, ValidateTenantName,
// ValidateObjectID), repeated here because the client imports no server
// code; host's TestClientChecksObjectsLikeTheNode keeps the two in step.
var (
	programName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	tenantName  = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)
	objectName  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
)

// object is a parsed object name: PROGRAM/ID, or TENANT.PROGRAM/ID for
// another tenant's object.
type object struct {
	program, id string
}

func (o object) String() string { return o.program + "/" + o.id }

// path is the object's route, each part escaped: /v1/objects/PROGRAM/ID.
func (o object) path() string {
	return "/v1/objects/" + url.PathEscape(o.program) + "/" + url.PathEscape(o.id)
}

// parseObject splits s at its first slash and checks both parts as the
// node does, with the node's messages.
func parseObject(s string) (object, error) {
	p, id, ok := strings.Cut(s, "/")
	if !ok {
		return object{}, fmt.Errorf("%w: object %q must be PROGRAM/ID", errBadRequest, clip(s))
	}
	if t, name, qualified := strings.Cut(p, "."); !qualified {
		if !programName.MatchString(p) {
			return object{}, fmt.Errorf("%w: program name %q must be 1-63 of a-z 0-9 _ - and start with a letter or digit", errBadRequest, clip(p))
		}
	} else if !tenantName.MatchString(t) || !programName.MatchString(name) {
		return object{}, fmt.Errorf("%w: program name %q must be PROGRAM or TENANT.PROGRAM", errBadRequest, clip(p))
	}
	if !objectName.MatchString(id) {
		return object{}, fmt.Errorf("%w: object id %q must be 1-128 of A-Z a-z 0-9 . _ - and start with a letter or digit", errBadRequest, clip(id))
	}
	return object{p, id}, nil
}

// clip shortens a name quoted in an error, as the node does.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
