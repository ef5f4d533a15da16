package resultstore

import (
	"context"
	"path/filepath"
	"testing"
)

// The interleaving that would lose a result: a sweep finds no claim on
// it, then a PutFor of the same data claims it, finds it stored and
// returns, and only then is it set aside. The sweep looks again and keeps
// it.
func TestAPutForBetweenTheSweepsLookAndItsDeleteKeepsTheResult(t *testing.T) {
	ctx := context.Background()
	d := Dir{Path: filepath.Join(t.TempDir(), "results")}
	data := []byte("contended answer")
	ref, err := d.PutFor(ctx, "expired", data)
	if err != nil {
		t.Fatal(err)
	}
	beforeSetAside = func() {
		if _, err := d.PutFor(ctx, "live", data); err != nil {
			t.Error(err)
		}
	}
	defer func() { beforeSetAside = nil }()
	if n, err := d.Release(ctx, []Claim{{Ref: ref, ActionRef: "expired"}}); err != nil || n != 0 {
		t.Fatalf("released %d, %v", n, err)
	}
	if _, err := d.Get(ctx, ref); err != nil {
		t.Fatalf("the result a PutFor returned is gone: %v", err)
	}
}
