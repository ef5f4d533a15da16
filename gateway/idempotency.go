package gateway

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

// IdempotencyHeader is the request header that names a retry of the same
// request (Stripe's model; the IETF httpapi draft's name).
const IdempotencyHeader = "Idempotency-Key"

// MaxIdempotencyKey is the longest key accepted, in bytes.
const MaxIdempotencyKey = 255

// errBadKey is why a key is refused; the message never quotes the key.
var errBadKey = errors.New("Idempotency-Key must be 1 to 255 printable ASCII characters")

// validKey checks an Idempotency-Key: 1 to 255 printable ASCII
// characters (space to tilde).
func validKey(k string) error {
	if len(k) == 0 || len(k) > MaxIdempotencyKey {
		return errBadKey
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return errBadKey
		}
	}
	return nil
}

// actionIDPrefix starts every action id the gateway makes, so an operator
// tells them from actions started otherwise.
const actionIDPrefix = "gw-"

// keyedActionID is the action id of a caller's key: "gw-" and the first
// 128 bits of SHA-256(caller id, 0, key) in hex. The caller id is part of
// it, so two callers' equal keys are two actions; the key itself is never
// stored, logged or sent upstream, and cannot be read back from the id.
func keyedActionID(caller, key string) string {
	h := sha256.New()
	h.Write([]byte(caller))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return actionIDPrefix + hex.EncodeToString(h.Sum(nil)[:16])
}

// randomActionID is the action id of a request without a key: "gw-" and
// 128 random bits in hex.
func randomActionID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand does not fail on supported platforms (Go 1.24+
		// panics itself); a fixed id here would merge unrelated requests.
		panic(fmt.Sprintf("gateway: crypto/rand: %v", err))
	}
	return actionIDPrefix + hex.EncodeToString(b[:])
}

// fingerprint is HMAC-SHA256, under the gateway's secret, of the body's
// canonical JSON, in hex. Under a secret it says nothing of the body to
// whoever reads the memo.
func fingerprint(secret, body []byte) (string, error) {
	c, err := canonicalBody(body)
	if err != nil {
		return "", err
	}
	m := hmac.New(sha256.New, secret)
	m.Write(c)
	return hex.EncodeToString(m.Sum(nil)), nil
}
