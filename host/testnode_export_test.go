package host

import "testing"

// StartTestNode starts a node for package host's own tests, with
// hosttest's defaults and cleanup: testnode_test.go (package host_test)
// sets it to hosttest.Start at init. This package's tests cannot import
// hosttest, which imports host, but they share one test binary with
// host_test, which can.
var StartTestNode func(t testing.TB) *Node
