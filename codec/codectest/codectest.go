// Package codectest makes keyrings for tests of code that encrypts with
// package codec: fresh random keys, loaded through codec.LoadKeyring as a
// deployment would load them.
package codectest

import (
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/durallm/durallm/codec"
)

// Line is a fresh "id:base64key" key line.
func Line(t testing.TB, id string) string {
	t.Helper()
	b := make([]byte, codec.KeySize)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return id + ":" + base64.StdEncoding.EncodeToString(b)
}

// Ring loads a keyring from key lines, the first active.
func Ring(t testing.TB, lines ...string) *codec.Keyring {
	t.Helper()
	text := strings.Join(lines, "\n")
	k, err := codec.LoadKeyring("env:KEYS", func(string) string { return text })
	if err != nil {
		t.Fatal(err)
	}
	return k
}
