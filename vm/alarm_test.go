package vm_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/durable-host/host/abi"
	"github.com/durable-host/host/vm"
)

// The alarm ABI through a real Go guest: the handler bit, alarm_set and
// alarm_get in milliseconds, alarm_delete, a negative time refused with a
// reason, and the alarm export run; a program without the handler has no
// bit and Alarm says so.
func TestAlarmABI(t *testing.T) {
	e := newEngine(t, 0, 0)
	inst := instance(t, e, "hostile")
	if !inst.Module().Has(abi.HandlerAlarm) {
		t.Fatalf("hostile registers OnAlarm; handlers %b", inst.Module().Handlers)
	}
	h := newMemHost()
	at := time.UnixMilli(1_900_000_000_123)
	if _, err := inst.Call(h, "alarm_at", []byte(strconv.FormatInt(at.UnixMilli(), 10))); err != nil {
		t.Fatal(err)
	}
	if h.alarm == nil || !h.alarm.Equal(at) {
		t.Fatalf("alarm set to %v, want %v", h.alarm, at)
	}
	if out, err := inst.Call(h, "alarm_get", nil); err != nil || string(out) != strconv.FormatInt(at.UnixMilli(), 10) {
		t.Fatalf("alarm_get = %s, %v", out, err)
	}
	_, err := inst.Call(h, "alarm_at", []byte("-1"))
	var ge *vm.GuestError
	if !errors.As(err, &ge) || ge.Message != "set alarm: alarm time must be Unix milliseconds, not negative" {
		t.Fatalf("negative time: %v", err)
	}
	if _, err := inst.Call(h, "alarm_delete", nil); err != nil || h.alarm != nil {
		t.Fatalf("delete: %v, alarm %v", err, h.alarm)
	}
	if out, _ := inst.Call(h, "alarm_get", nil); string(out) != "-1" {
		t.Fatalf("alarm_get after delete = %s", out)
	}
	if err := inst.Alarm(h); err != nil {
		t.Fatal(err)
	}
	if string(h.state["alarm_runs"]) != "1" || len(h.published) != 1 {
		t.Fatalf("the alarm handler did not run: %q %q", h.state["alarm_runs"], h.published)
	}
	if inst.Broken() {
		t.Fatal("an alarm run broke the instance")
	}

	counter := instance(t, e, "counter")
	if counter.Module().Has(abi.HandlerAlarm) {
		t.Fatal("counter registers no alarm handler")
	}
	if err := counter.Alarm(newMemHost()); !errors.Is(err, vm.ErrNoHandler) {
		t.Fatalf("alarm on counter: %v", err)
	}
}
