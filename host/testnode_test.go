package host_test

import (
	"testing"

	"github.com/durable-host/host/host"
	"github.com/durable-host/host/host/hosttest"
)

func init() {
	host.StartTestNode = func(t testing.TB) *host.Node {
		n, _ := hosttest.Start(t, hosttest.Options{})
		return n
	}
}
