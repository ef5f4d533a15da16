package resultstore

import (
	"errors"
	"fmt"

	"github.com/durallm/durallm/codec"
)

// ErrEncrypted is returned (wrapped) by Get for data stored encrypted when
// the store has no keyring to open it with.
var ErrEncrypted = errors.New("resultstore: the data is encrypted and the store has no keyring")

// Seal is what a store keeps for data under ref: data itself, or, with
// keys, data sealed with the keyring's active key and bound to ref
// (codec.Keyring.Seal). The reference is always the digest of data, so
// the same response gets the same reference whether or not it is
// encrypted. Every backend stores through Seal and reads through Unseal.
func Seal(keys *codec.Keyring, ref string, data []byte) ([]byte, error) {
	if keys == nil {
		return data, nil
	}
	b, err := keys.Seal(data, []byte(ref))
	if err != nil {
		return nil, fmt.Errorf("resultstore: encrypt %s: %w", ref, err)
	}
	return b, nil
}

// Unseal reads what Seal stored under ref and checks it against ref's
// digest (ErrDamaged otherwise). Data stored in the clear, before
// encryption was turned on, reads with or without keys.
func Unseal(keys *codec.Keyring, ref string, stored []byte) ([]byte, error) {
	data := stored
	if codec.Sealed(stored) {
		if keys == nil {
			return nil, fmt.Errorf("%w: %s", ErrEncrypted, ref)
		}
		var err error
		if data, err = keys.Open(stored, []byte(ref)); err != nil {
			return nil, fmt.Errorf("resultstore: decrypt %s: %w", ref, err)
		}
	}
	if err := Check(ref, data); err != nil {
		return nil, err
	}
	return data, nil
}
