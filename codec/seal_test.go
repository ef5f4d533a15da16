package codec_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/codec/codectest"
)

func TestSealOpensAfterRotation(t *testing.T) {
	old, next := codectest.Line(t, "k1"), codectest.Line(t, "k2")
	before := codectest.Ring(t, old)
	blob, err := before.Seal([]byte("generated text"), []byte("attempt-1"))
	if err != nil {
		t.Fatal(err)
	}
	if !codec.Sealed(blob) || bytes.Contains(blob, []byte("generated text")) {
		t.Fatalf("blob %q", blob)
	}
	// Rotated: k2 active, k1 kept to read what it sealed.
	after := codectest.Ring(t, next, old)
	if got, err := after.Open(blob, []byte("attempt-1")); err != nil || string(got) != "generated text" {
		t.Fatalf("open after rotation: %q %v", got, err)
	}
	// New blobs use the new key: a ring without k2 cannot open them.
	blob2, _ := after.Seal([]byte("x"), nil)
	if _, err := before.Open(blob2, nil); !errors.Is(err, codec.ErrUnknownKey) {
		t.Fatalf("open with a ring that lacks the key: %v", err)
	}
}

func TestSealedBlobsStayWhereTheyWereSealed(t *testing.T) {
	k := codectest.Ring(t, codectest.Line(t, "k1"))
	blob, _ := k.Seal([]byte("answer"), []byte("attempt-1"))
	if _, err := k.Open(blob, []byte("attempt-2")); !errors.Is(err, codec.ErrAuthentication) {
		t.Fatalf("moved to another place: %v", err)
	}
	changed := bytes.Clone(blob)
	changed[len(changed)-1] ^= 1
	if _, err := k.Open(changed, []byte("attempt-1")); !errors.Is(err, codec.ErrAuthentication) {
		t.Fatalf("changed: %v", err)
	}
	for _, bad := range [][]byte{nil, []byte(`{"json":1}`), blob[:9], blob[:12]} {
		if _, err := k.Open(bad, []byte("attempt-1")); err == nil {
			t.Fatalf("opened %q", bad)
		}
	}
	// Another key of the same id is a wrong key, not a silent success.
	other := codectest.Ring(t, codectest.Line(t, "k1"))
	if _, err := other.Open(blob, []byte("attempt-1")); !errors.Is(err, codec.ErrAuthentication) {
		t.Fatalf("wrong key: %v", err)
	}
}

// BenchmarkSeal is what encryption adds to a journal entry or a stored
// result: sealing and opening a typical 2 KiB entry.
//
//	go test -run '^$' -bench BenchmarkSeal ./codec/
func BenchmarkSeal(b *testing.B) {
	k := codectest.Ring(b, codectest.Line(b, "k1"))
	plain := bytes.Repeat([]byte("x"), 2048)
	place := []byte("journal/run-1")
	b.SetBytes(int64(len(plain)))
	for b.Loop() {
		blob, err := k.Seal(plain, place)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := k.Open(blob, place); err != nil {
			b.Fatal(err)
		}
	}
}
