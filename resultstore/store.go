// Package resultstore keeps large model responses out of Temporal history.
//
// A response above a size threshold would make the activity's result
// payload large enough for Temporal to warn about, and past its hard limit
// fail the workflow task. The CallModel activity stores such a response
// here and returns only a reference; the client resolves the reference
// when it reads the action's result. The store is pluggable (Store); Dir,
// a directory of files, is the default; package resultstore/pgstore keeps
// them in PostgreSQL, for workers and clients on several machines. Both
// are Expirable: each result is stored for its action (PutFor) and a
// Sweeper deletes it a retention after the last such action closed.
//
// The same stores keep every large Temporal payload by reference (package
// claimcheck), each claimed for the workflows whose history holds it
// (PutForAll), up to the store's Limit.
package resultstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/durallm/durallm/codec"
)

// Store keeps blobs by reference. Implementations must be safe for
// concurrent use; Put must be idempotent for the same data.
type Store interface {
	// Put stores data and returns a reference to it.
	Put(ctx context.Context, data []byte) (ref string, err error)
	// Get returns the data a reference names, or an error wrapping
	// ErrNotFound.
	Get(ctx context.Context, ref string) ([]byte, error)
}

// ErrNotFound is returned (wrapped) for a reference the store does not
// hold.
var ErrNotFound = errors.New("resultstore: not found")

// ErrBadRef is returned (wrapped) for a reference the store cannot read.
var ErrBadRef = errors.New("resultstore: malformed reference")

// ErrDamaged is returned (wrapped) when the data a store holds for a
// reference does not match the reference's digest.
var ErrDamaged = errors.New("resultstore: the stored data does not match its reference's digest")

// DefaultThreshold is the response size, in bytes of JSON, above which the
// activity stores a response by reference: well under Temporal's default
// payload warning (512 KiB) and hard limit (2 MiB).
const DefaultThreshold = 256 << 10

// Dir stores each blob as a file named by its SHA-256 under Path. The
// reference is "file:<sha256>", so it holds no path and no content, and
// the same data always gets the same reference. Workers and the clients
// that resolve references must see the same directory (a shared volume
// for several hosts).
type Dir struct {
	// Path is the directory; it is created (0700) on first Put.
	Path string
	// Keys, when set, encrypts what is stored with the payload keyring
	// (Seal); a client reading the directory needs the same keyring.
	Keys *codec.Keyring
	// MaxBytes is the largest blob Put keeps (ErrTooLarge above it). Zero
	// means DefaultMaxBytes.
	MaxBytes int64
}

const fileScheme = "file"

// Ref is the reference a store with the given scheme ("file", "pg")
// gives data: "<scheme>:<sha256 of data, hex>". It names the data without
// holding any of it, and the same data always gets the same reference.
func Ref(scheme string, data []byte) string {
	sum := sha256.Sum256(data)
	return scheme + ":" + hex.EncodeToString(sum[:])
}

// Digest is the hex SHA-256 a reference of the given scheme names, or an
// error wrapping ErrBadRef.
func Digest(scheme, ref string) (string, error) {
	name, ok := strings.CutPrefix(ref, scheme+":")
	if !ok || len(name) != sha256.Size*2 {
		return "", fmt.Errorf("%w: %q", ErrBadRef, ref)
	}
	if _, err := hex.DecodeString(name); err != nil || strings.ToLower(name) != name {
		return "", fmt.Errorf("%w: %q", ErrBadRef, ref)
	}
	return name, nil
}

// Check returns an error unless data is what ref names, so a damaged blob
// is an error rather than a wrong answer.
func Check(ref string, data []byte) error {
	scheme, _, _ := strings.Cut(ref, ":")
	if Ref(scheme, data) != ref {
		return fmt.Errorf("%w: %s", ErrDamaged, ref)
	}
	return nil
}

// Put writes data atomically (a temporary file, then a rename).
func (d Dir) Put(_ context.Context, data []byte) (string, error) {
	if err := CheckSize(int64(len(data)), d.Limit()); err != nil {
		return "", err
	}
	ref := Ref(fileScheme, data)
	name := strings.TrimPrefix(ref, fileScheme+":")
	if err := os.MkdirAll(d.Path, 0o700); err != nil {
		return "", fmt.Errorf("resultstore: create %s: %w", d.Path, err)
	}
	final := filepath.Join(d.Path, name)
	if _, err := os.Stat(final); err == nil {
		return ref, nil
	}
	stored, err := Seal(d.Keys, ref, data)
	if err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(d.Path, name+".tmp-*")
	if err != nil {
		return "", fmt.Errorf("resultstore: write %s: %w", d.Path, err)
	}
	_, werr := tmp.Write(stored)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("resultstore: write %s: %w", d.Path, err)
	}
	if err := os.Rename(tmp.Name(), final); err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("resultstore: write %s: %w", d.Path, err)
	}
	return ref, nil
}

// Get reads the blob a "file:<sha256>" reference names and checks its
// digest.
func (d Dir) Get(_ context.Context, ref string) ([]byte, error) {
	name, err := Digest(fileScheme, ref)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(d.Path, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s in %s", ErrNotFound, ref, d.Path)
	}
	if err != nil {
		return nil, fmt.Errorf("resultstore: read %s: %w", ref, err)
	}
	if data, err = Unseal(d.Keys, ref, data); err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, d.Path)
	}
	return data, nil
}
