package tenancy

import (
	"errors"
	"strings"
	"testing"
)

func TestLimitsOver(t *testing.T) {
	d := DefaultLimits()
	if got := (Limits{}).Over(d); got != d {
		t.Fatalf("no overrides: %+v, want the defaults %+v", got, d)
	}
	own := Limits{ModuleBytes: 1, Programs: 2, MemoryPages: 3, ObjectBytes: 4, TenantBytes: 5, Objects: 6,
		Connections: 7, PublishRate: 8.5, PublishBurst: 9, Concurrency: 10}
	if got := own.Over(d); got != own {
		t.Fatalf("every field set: %+v, want %+v", got, own)
	}
	got := Limits{Connections: 3}.Over(d)
	want := d
	want.Connections = 3
	if got != want {
		t.Fatalf("one field set: %+v, want %+v", got, want)
	}
}

func TestLimitsValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		l    Limits
		want string // "" for valid
	}{
		{"zero", Limits{}, ""},
		{"defaults", DefaultLimits(), ""},
		{"negative", Limits{Connections: -1}, "cannot be negative"},
		{"negative rate", Limits{PublishRate: -0.5}, "cannot be negative"},
		{"pages", Limits{MemoryPages: 65537}, "at most 65536"},
		{"tiny object", Limits{ObjectBytes: 4096}, "at least 65536"},
		{"both", Limits{Objects: -1, MemoryPages: 70000}, "at most 65536"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.l.Validate()
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want a bad request saying %q", err, c.want)
			}
		})
	}
}

func TestLimitErrorMessage(t *testing.T) {
	got := CountLimit("connections", 2, 3, "open connections and streams on this node").Error()
	want := "connections limit exceeded: the limit is 2 open connections and streams on this node, this needs 3 open connections and streams on this node"
	if got != want {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	if got := (&LimitError{What: "x", Limit: 1, Want: 2}).Error(); got != "x limit exceeded: the limit is 1, this needs 2" {
		t.Fatalf("without a unit: %q", got)
	}
}
