package host

import (
	"errors"
	"fmt"
	"testing"

	"github.com/durable-host/host/vm"
)

// An error crosses nodes as a code and comes back as the same sentinel,
// whatever its text says; a refusal keeps the hook's reason as given.
func TestRemoteErrorsCrossByCode(t *testing.T) {
	for _, want := range []error{ErrBadRequest, ErrTooLarge, ErrUnavailable, ErrObjectUnavailable,
		ErrUnknownProgram, ErrUnknownObject, ErrNotFound, ErrConflict, ErrShuttingDown} {
		// A message that names another error must not matter.
		err := fmt.Errorf("%w: mentions %v and not home", want, ErrConflict)
		re := &remoteError{status: statusOf(err), code: codeOf(err), msg: err.Error()}
		if !errors.Is(re, want) {
			t.Errorf("%v crossed as code %q, which is not %v again", err, re.code, want)
		}
		if want != ErrConflict && errors.Is(re, ErrConflict) {
			t.Errorf("%v crossed as code %q and became a conflict by its text", err, re.code)
		}
	}
	if c := codeOf(fmt.Errorf("wrapped: %w", errNotHome)); c != codeNotHome {
		t.Errorf("not-home crossed as %q", c)
	}
	if c := codeOf(&vm.RefusedError{Reason: "follow refused: members only"}); c != codeRefused {
		t.Errorf("a refusal crossed as %q", c)
	}
	if c := codeOf(errors.New("disk on fire")); c != codeOther {
		t.Errorf("an unknown error crossed as %q", c)
	}
}
