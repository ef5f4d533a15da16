// Package storetest is the behaviour every result store backend promises
// (resultstore.Store), as one test suite each backend runs against a real
// instance of itself.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

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
