package tenancy

import (
	"errors"
	"testing"
)

func TestPrincipalNames(t *testing.T) {
	acme := Principal{Tenant: "acme"}
	for _, c := range []struct {
		p        Principal
		name     string
		program  string
		ok       bool
		follow   string
		owns     bool
		shown    string
		tenantOf string
	}{
		{acme, "chat", "acme.chat", true, "acme.chat", false, "chat", ""},
		{acme, "acme.chat", "acme.chat", false, "acme.chat", true, "chat", "acme"},
		{acme, "other.chat", "other.chat", false, "other.chat", false, "other.chat", "other"},
		{Local, "chat", "chat", true, "chat", true, "chat", ""},
		{Local, "other.chat", "other.chat", true, "other.chat", true, "other.chat", "other"},
		{Principal{Operator: true}, "acme.chat", "acme.chat", true, "acme.chat", true, "acme.chat", "acme"},
	} {
		if q, ok := c.p.Program(c.name); q != c.program || ok != c.ok {
			t.Errorf("%+v.Program(%q) = %q, %v; want %q, %v", c.p, c.name, q, ok, c.program, c.ok)
		}
		if got := c.p.FollowTarget(c.name); got != c.follow {
			t.Errorf("%+v.FollowTarget(%q) = %q, want %q", c.p, c.name, got, c.follow)
		}
		if got := c.p.Owns(c.name); got != c.owns {
			t.Errorf("%+v.Owns(%q) = %v, want %v", c.p, c.name, got, c.owns)
		}
		if got := c.p.Show(c.name); got != c.shown {
			t.Errorf("%+v.Show(%q) = %q, want %q", c.p, c.name, got, c.shown)
		}
		if got := TenantOf(c.name); got != c.tenantOf {
			t.Errorf("TenantOf(%q) = %q, want %q", c.name, got, c.tenantOf)
		}
	}
}

func TestStrip(t *testing.T) {
	acme := Principal{Tenant: "acme"}
	msg := `unknown program: "acme.chat" (upload it with: host upload FILE.wasm --name acme.chat); not "other.chat" nor bigacme.chat`
	want := `unknown program: "chat" (upload it with: host upload FILE.wasm --name chat); not "other.chat" nor bigacme.chat`
	if got := acme.Strip(msg); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if got := Local.Strip(msg); got != msg {
		t.Fatalf("the operator's message changed: %s", got)
	}
}

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"a", "acme", "a-b_c", "0", "abcdefghijklmnopqrstuvwxyz012345"} {
		if err := ValidateName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "Acme", "a.b", "-a", "_a", "abcdefghijklmnopqrstuvwxyz0123456", "a/b"} {
		if err := ValidateName(bad); !errors.Is(err, ErrBadRequest) {
			t.Errorf("%q: %v, want ErrBadRequest", bad, err)
		}
	}
	if Qualify("", "chat") != "chat" || Qualify("acme", "chat") != "acme.chat" {
		t.Fatal("Qualify")
	}
}
