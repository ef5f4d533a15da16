// Package storetest is the behaviour every result store backend promises
// (resultstore.Store), as one test suite each backend runs against a real
// instance of itself.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/codec/codectest"
	"github.com/durallm/durallm/resultstore"
)

// Backend is one empty store under test.
type Backend struct {
	Store resultstore.Store
	// Scheme is its references' prefix ("file", "pg").
	Scheme string
	// Damage overwrites what the store holds for ref with other bytes.
	Damage func(t *testing.T, ref string)
}

// Run runs the suite. open returns an empty store for one subtest.
func Run(t *testing.T, open func(t *testing.T) Backend) {
	t.Run("RoundTripAndIdempotence", func(t *testing.T) { roundTrip(t, open(t)) })
	t.Run("Errors", func(t *testing.T) { refErrors(t, open(t)) })
	t.Run("DamageIsAnError", func(t *testing.T) { damage(t, open(t)) })
	t.Run("ConcurrentPutsOfTheSameData", func(t *testing.T) { concurrentPuts(t, open(t)) })
	t.Run("OverTheLimitIsErrTooLargeAndStoresNothing", func(t *testing.T) { overTheLimit(t, open(t)) })
}

// Data over the store's limit is refused by every way of storing it, and
// nothing is stored; data at the limit is kept.
func overTheLimit(t *testing.T, b Backend) {
	ctx := context.Background()
	limit := resultstore.LimitOf(b.Store)
	data := bytes.Repeat([]byte("x"), int(limit)+1)
	puts := map[string]func() (string, error){"Put": func() (string, error) { return b.Store.Put(ctx, data) }}
	if e, ok := b.Store.(resultstore.Expirable); ok {
		puts["PutFor"] = func() (string, error) { return e.PutFor(ctx, "an-action", data) }
	}
	if e, ok := b.Store.(resultstore.ClaimsAll); ok {
		puts["PutForAll"] = func() (string, error) { return e.PutForAll(ctx, []string{"a", "b"}, data) }
	}
	for name, put := range puts {
		if ref, err := put(); !errors.Is(err, resultstore.ErrTooLarge) || ref != "" {
			t.Errorf("%s of %d bytes: %q %v, want ErrTooLarge", name, len(data), ref, err)
		}
	}
	if _, err := b.Store.Get(ctx, resultstore.Ref(b.Scheme, data)); !errors.Is(err, resultstore.ErrNotFound) {
		t.Errorf("data over the limit was stored: %v", err)
	}
	if _, err := b.Store.Put(ctx, data[:limit]); err != nil {
		t.Errorf("data at the limit: %v", err)
	}
}

func roundTrip(t *testing.T, b Backend) {
	ctx := context.Background()
	data := bytes.Repeat([]byte("answer "), 100000)
	ref, err := b.Store.Put(ctx, data)
	if err != nil {
		t.Fatal(err)
	}
	if ref != resultstore.Ref(b.Scheme, data) || strings.Contains(ref, "answer") {
		t.Fatalf("ref %q", ref)
	}
	again, err := b.Store.Put(ctx, data)
	if err != nil || again != ref {
		t.Fatalf("second put: %q %v", again, err)
	}
	got, err := b.Store.Get(ctx, ref)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("get: %d bytes, %v", len(got), err)
	}
	if empty, err := b.Store.Put(ctx, nil); err != nil {
		t.Fatal(err)
	} else if got, err := b.Store.Get(ctx, empty); err != nil || len(got) != 0 {
		t.Fatalf("empty blob: %q %v", got, err)
	}
}

func refErrors(t *testing.T, b Backend) {
	ctx := context.Background()
	other := "s3"
	for _, ref := range []string{"", b.Scheme + ":", other + ":" + strings.Repeat("a", 64), b.Scheme + ":../../etc/passwd",
		b.Scheme + ":" + strings.Repeat("z", 64), b.Scheme + ":" + strings.Repeat("A", 64)} {
		if _, err := b.Store.Get(ctx, ref); !errors.Is(err, resultstore.ErrBadRef) {
			t.Errorf("Get(%q) = %v, want ErrBadRef", ref, err)
		}
	}
	if _, err := b.Store.Get(ctx, b.Scheme+":"+strings.Repeat("a", 64)); !errors.Is(err, resultstore.ErrNotFound) {
		t.Errorf("missing ref: %v", err)
	}
}

func damage(t *testing.T, b Backend) {
	ctx := context.Background()
	ref, err := b.Store.Put(ctx, []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	b.Damage(t, ref)
	if _, err := b.Store.Get(ctx, ref); !errors.Is(err, resultstore.ErrDamaged) {
		t.Errorf("damaged blob: %v", err)
	}
}

// Many workers storing the same response at once all get its reference.
func concurrentPuts(t *testing.T, b Backend) {
	ctx := context.Background()
	data := []byte("the same answer")
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ref, err := b.Store.Put(ctx, data); err != nil || ref != resultstore.Ref(b.Scheme, data) {
				t.Errorf("put: %q %v", ref, err)
			}
		}()
	}
	wg.Wait()
	if got, err := b.Store.Get(ctx, resultstore.Ref(b.Scheme, data)); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("get: %q %v", got, err)
	}
}

// Storage is one empty store's storage, for the encryption suite.
type Storage struct {
	// Open returns a store on this storage that encrypts with keys (nil:
	// in the clear).
	Open   func(t *testing.T, keys *codec.Keyring) resultstore.Store
	Scheme string
	// Raw returns the bytes the storage holds for ref (the file, the row).
	Raw func(t *testing.T, ref string) []byte
}

// RunSealed runs the encryption suite: with a keyring, what the storage
// holds is not the text; after a rotation, data sealed by the old key
// still reads; data stored before encryption was on still reads.
func RunSealed(t *testing.T, storage func(t *testing.T) Storage) {
	t.Run("StoredBytesHoldNoText", func(t *testing.T) { storedBytesHoldNoText(t, storage(t)) })
	t.Run("ReadsAfterKeyRotation", func(t *testing.T) { readsAfterRotation(t, storage(t)) })
	t.Run("ReadsDataStoredInTheClear", func(t *testing.T) { readsClearData(t, storage(t)) })
}

var secret = []byte(`{"text":"the provider's secret answer"}`)

func storedBytesHoldNoText(t *testing.T, s Storage) {
	ctx := context.Background()
	st := s.Open(t, codectest.Ring(t, codectest.Line(t, "k1")))
	ref, err := st.Put(ctx, secret)
	if err != nil {
		t.Fatal(err)
	}
	if ref != resultstore.Ref(s.Scheme, secret) {
		t.Fatalf("ref %q is not the data's digest", ref)
	}
	raw := s.Raw(t, ref)
	if len(raw) == 0 || bytes.Contains(raw, []byte("secret")) || !codec.Sealed(raw) {
		t.Fatalf("stored: %q", raw)
	}
	if got, err := st.Get(ctx, ref); err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("get: %q %v", got, err)
	}
	if _, err := s.Open(t, nil).Get(ctx, ref); !errors.Is(err, resultstore.ErrEncrypted) {
		t.Fatalf("get without keys: %v", err)
	}
}

func readsAfterRotation(t *testing.T, s Storage) {
	ctx := context.Background()
	k1, k2 := codectest.Line(t, "k1"), codectest.Line(t, "k2")
	ref, err := s.Open(t, codectest.Ring(t, k1)).Put(ctx, secret)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Open(t, codectest.Ring(t, k2, k1)).Get(ctx, ref); err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("after rotation: %q %v", got, err)
	}
	if _, err := s.Open(t, codectest.Ring(t, k2)).Get(ctx, ref); !errors.Is(err, codec.ErrUnknownKey) {
		t.Fatalf("with the old key dropped: %v", err)
	}
}

func readsClearData(t *testing.T, s Storage) {
	ctx := context.Background()
	ref, err := s.Open(t, nil).Put(ctx, secret)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Open(t, codectest.Ring(t, codectest.Line(t, "k1"))).Get(ctx, ref); err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("clear data with encryption on: %q %v", got, err)
	}
}

// actions is resultstore.Actions over a map of when each action closed;
// an action it does not hold is running.
type actions map[string]time.Time

func (a actions) Closed(_ context.Context, ref string) (time.Time, bool, error) {
	at, ok := a[ref]
	return at, ok, nil
}

// RunExpiry runs the expiry suite on a store that is
// resultstore.Expirable: results go a retention after the last action
// that claims them closed, never while one runs; a result stored without
// a claim is never swept; and no sweep loses a result a PutFor returned.
func RunExpiry(t *testing.T, open func(t *testing.T) Backend) {
	t.Run("ExpiredResultsAreSweptAndOpenActionsKept", func(t *testing.T) { expiredSwept(t, open(t)) })
	t.Run("ASharedResultStaysWhileAnyActionNeedsIt", func(t *testing.T) { sharedResult(t, open(t)) })
	t.Run("NoSweepLosesAResultAPutForReturned", func(t *testing.T) { sweepRacesPutFor(t, open(t)) })
	t.Run("PutForAllKeepsTheDataWhileAnyOfItsActionsNeedsIt", func(t *testing.T) { putForAll(t, open(t)) })
}

// PutForAll claims the data for each action, as that many PutFor would:
// one action closing leaves it, the last one closing expires it.
func putForAll(t *testing.T, b Backend) {
	ctx := context.Background()
	s, ok := b.Store.(resultstore.ClaimsAll)
	if !ok {
		t.Fatalf("%T is not resultstore.ClaimsAll", b.Store)
	}
	data := []byte("a child's input, written by its parent")
	for range 2 { // the second time the data is already held
		if ref, err := s.PutForAll(ctx, []string{"parent", "child"}, data); err != nil || ref != resultstore.Ref(b.Scheme, data) {
			t.Fatalf("put for all: %q %v", ref, err)
		}
	}
	if ref, err := s.PutForAll(ctx, nil, []byte("no action")); err != nil || ref != resultstore.Ref(b.Scheme, []byte("no action")) {
		t.Fatalf("put for none: %q %v", ref, err)
	}
	ref := resultstore.Ref(b.Scheme, data)
	later := time.Now().Add(8 * 24 * time.Hour)
	acts := actions{"child": time.Now()}
	sw := &resultstore.Sweeper{Store: s, Actions: acts}
	if r, err := sw.Sweep(ctx, later); err != nil || r.Deleted != 0 || r.Kept != 1 {
		t.Fatalf("the child closed, the parent runs: %+v %v", r, err)
	}
	if got, err := s.Get(ctx, ref); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the running parent's data: %q %v", got, err)
	}
	acts["parent"] = time.Now()
	if r, err := sw.Sweep(ctx, later); err != nil || r.Deleted != 1 {
		t.Fatalf("both closed: %+v %v", r, err)
	}
	if _, err := s.Get(ctx, ref); !errors.Is(err, resultstore.ErrNotFound) {
		t.Fatalf("after both closed: %v", err)
	}
}

func expirable(t *testing.T, b Backend) resultstore.Expirable {
	t.Helper()
	e, ok := b.Store.(resultstore.Expirable)
	if !ok {
		t.Fatalf("%T is not resultstore.Expirable", b.Store)
	}
	return e
}

func expiredSwept(t *testing.T, b Backend) {
	ctx := context.Background()
	s := expirable(t, b)
	now := time.Now()
	// "closed-recently" closes two days on: at the sweep eight days on, it
	// has been closed for six.
	acts := actions{"closed-long-ago": now.Add(-30 * 24 * time.Hour), "closed-recently": now.Add(2 * 24 * time.Hour), "forgotten": {}}
	refs := map[string]string{}
	for _, action := range []string{"closed-long-ago", "closed-recently", "running", "forgotten"} {
		ref, err := s.PutFor(ctx, action, []byte("the answer of "+action))
		if err != nil || ref != resultstore.Ref(b.Scheme, []byte("the answer of "+action)) {
			t.Fatalf("put for %s: %q %v", action, ref, err)
		}
		refs[action] = ref
	}
	unclaimed, err := s.Put(ctx, []byte("stored without a claim"))
	if err != nil {
		t.Fatal(err)
	}
	var listed []resultstore.Claim
	if err := s.Older(ctx, now.Add(time.Minute), func(c resultstore.Claim) error { listed = append(listed, c); return nil }); err != nil || len(listed) != 4 {
		t.Fatalf("older: %+v %v", listed, err)
	}
	for _, c := range listed {
		if refs[c.ActionRef] != c.Ref || c.At.IsZero() {
			t.Fatalf("claim %+v", c)
		}
	}
	sw := &resultstore.Sweeper{Store: s, Actions: acts}
	// Now: every claim is younger than the retention.
	if r, err := sw.Sweep(ctx, now); err != nil || r.Deleted != 0 {
		t.Fatalf("sweep now: %+v %v", r, err)
	}
	// Eight days on: the action closed a month ago and the one its
	// server forgot are past the seven days' retention; the one closed six
	// days before is not, nor the running one.
	r, err := sw.Sweep(ctx, now.Add(8*24*time.Hour))
	if err != nil || r.Deleted != 2 || r.Kept != 2 {
		t.Fatalf("sweep in eight days: %+v %v", r, err)
	}
	for action, kept := range map[string]bool{"closed-long-ago": false, "forgotten": false, "closed-recently": true, "running": true} {
		_, err := s.Get(ctx, refs[action])
		if kept != (err == nil) || (!kept && !errors.Is(err, resultstore.ErrNotFound)) {
			t.Errorf("%s: kept %v, want %v (%v)", action, err == nil, kept, err)
		}
	}
	if _, err := s.Get(ctx, unclaimed); err != nil {
		t.Errorf("a result stored without a claim was swept: %v", err)
	}
	// Sweeping again finds nothing more, and storing again works.
	if r, err := sw.Sweep(ctx, now.Add(8*24*time.Hour)); err != nil || r.Deleted != 0 {
		t.Fatalf("second sweep: %+v %v", r, err)
	}
	if ref, err := s.PutFor(ctx, "closed-long-ago", []byte("the answer of closed-long-ago")); err != nil {
		t.Fatal(err)
	} else if got, err := s.Get(ctx, ref); err != nil || string(got) != "the answer of closed-long-ago" {
		t.Fatalf("stored again: %q %v", got, err)
	}
}

func sharedResult(t *testing.T, b Backend) {
	ctx := context.Background()
	s := expirable(t, b)
	data := []byte("the same answer for two actions")
	for _, action := range []string{"a", "b"} {
		if _, err := s.PutFor(ctx, action, data); err != nil {
			t.Fatal(err)
		}
	}
	ref := resultstore.Ref(b.Scheme, data)
	later := time.Now().Add(8 * 24 * time.Hour)
	acts := actions{"a": time.Now()}
	sw := &resultstore.Sweeper{Store: s, Actions: acts}
	if r, err := sw.Sweep(ctx, later); err != nil || r.Deleted != 0 || r.Kept != 1 {
		t.Fatalf("one of two actions closed: %+v %v", r, err)
	}
	if _, err := s.Get(ctx, ref); err != nil {
		t.Fatalf("the running action's result was swept: %v", err)
	}
	acts["b"] = time.Now()
	if r, err := sw.Sweep(ctx, later); err != nil || r.Deleted != 1 {
		t.Fatalf("both closed: %+v %v", r, err)
	}
	if _, err := s.Get(ctx, ref); !errors.Is(err, resultstore.ErrNotFound) {
		t.Fatalf("after both closed: %v", err)
	}
}

// A PutFor of data an expired action also claimed, while its claim is
// released: whatever the interleaving, the data is there once PutFor has
// returned and the release is over.
func sweepRacesPutFor(t *testing.T, b Backend) {
	ctx := context.Background()
	s := expirable(t, b)
	data := []byte("contended answer")
	ref := resultstore.Ref(b.Scheme, data)
	for i := range 50 {
		if _, err := s.PutFor(ctx, "expired", data); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			if _, err := s.Release(ctx, []resultstore.Claim{{Ref: ref, ActionRef: "expired"}}); err != nil {
				t.Error(err)
			}
		}()
		live := "live-" + strconv.Itoa(i)
		go func() {
			defer wg.Done()
			if _, err := s.PutFor(ctx, live, data); err != nil {
				t.Error(err)
			}
		}()
		wg.Wait()
		if got, err := s.Get(ctx, ref); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("round %d: the result a PutFor returned is gone: %v", i, err)
		}
		if _, err := s.Release(ctx, []resultstore.Claim{{Ref: ref, ActionRef: live}}); err != nil {
			t.Fatal(err)
		}
	}
}
