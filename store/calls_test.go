package store_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/durable-host/host/store"
)

// A file made by the last binary before recorded calls (schema version 3)
// opens, keeps what it held (its alarm among it), has no recorded calls,
// and records one.
func TestSchemaUpgradeFromVersion3(t *testing.T) {
	path := fixtureFile(t, "v3-017f875.sql", 3)
	f := openUpgraded(t, path)
	if _, ok := alarmOf(t, f); !ok {
		t.Fatal("the upgraded file lost its alarm")
	}
	at := time.Unix(1_800_000_000, 0)
	commit(t, f, func(tx *store.Tx) error {
		if v, ok, err := tx.Get([]byte("count")); err != nil || !ok || string(v) != "7" {
			t.Errorf("state %q %v %v", v, ok, err)
		}
		if _, ok, err := tx.RecordedCall("k"); ok || err != nil {
			t.Errorf("an upgraded file has a recorded call: %v %v", ok, err)
		}
		return tx.RecordCall("k", store.CallRecord{Request: []byte{1}, Reply: []byte("r"), At: at})
	})
	commit(t, f, func(tx *store.Tx) error {
		r, ok, err := tx.RecordedCall("k")
		if !ok || err != nil || string(r.Reply) != "r" || !r.SameRequest([]byte{1}) || !r.At.Equal(at) {
			t.Errorf("recorded call %+v %v %v", r, ok, err)
		}
		return nil
	})
}

// Pruning keeps records younger than the age bound, and no more than the
// count bound of the newest.
func TestPruneCallsByAgeAndCount(t *testing.T) {
	f := newFile(t)
	base := time.Unix(1_800_000_000, 0)
	commit(t, f, func(tx *store.Tx) error {
		for i := range 10 {
			if err := tx.RecordCall(fmt.Sprint("k", i), store.CallRecord{Request: []byte{1}, At: base.Add(time.Duration(i) * time.Second)}); err != nil {
				return err
			}
		}
		return nil
	})
	has := func(tx *store.Tx, i int) bool {
		_, ok, err := tx.RecordedCall(fmt.Sprint("k", i))
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	commit(t, f, func(tx *store.Tx) error {
		n, err := tx.PruneCalls(base.Add(3*time.Second), 100)
		if err != nil || n != 3 || has(tx, 2) || !has(tx, 3) {
			t.Errorf("by age: %d pruned, %v; k2 %v k3 %v", n, err, has(tx, 2), has(tx, 3))
		}
		n, err = tx.PruneCalls(base, 4)
		if err != nil || n != 3 || has(tx, 5) || !has(tx, 6) || !has(tx, 9) {
			t.Errorf("by count: %d pruned, %v; k5 %v k6 %v", n, err, has(tx, 5), has(tx, 6))
		}
		return nil
	})
}
