package journal

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/durallm/durallm/codec"
)

// ErrEncrypted is returned (wrapped) by Lookup for an encrypted entry
// when the journal has no keyring to open it with.
var ErrEncrypted = errors.New("journal: the entry is encrypted and the journal has no keyring")

// encode is an entry as every backend stores it: its JSON, sealed with
// keys' active key when keys is set (codec.Keyring.Seal, bound to the
// attempt id, so an entry copied to another attempt does not open).
func encode(e Entry, keys *codec.Keyring) ([]byte, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("journal: encode entry: %w", err)
	}
	if keys == nil {
		return b, nil
	}
	sealed, err := keys.Seal(b, place(e.AttemptID))
	if err != nil {
		return nil, fmt.Errorf("journal: encrypt entry %s: %w", e.AttemptID, err)
	}
	return sealed, nil
}

// decode reads what encode wrote for attemptID. An entry written in the
// clear (before encryption was turned on) reads without keys.
func decode(b []byte, attemptID string, keys *codec.Keyring) (Entry, error) {
	if codec.Sealed(b) {
		if keys == nil {
			return Entry{}, fmt.Errorf("%w: %s", ErrEncrypted, attemptID)
		}
		plain, err := keys.Open(b, place(attemptID))
		if err != nil {
			return Entry{}, fmt.Errorf("journal: decrypt entry %s: %w", attemptID, err)
		}
		b = plain
	}
	var e Entry
	if err := json.Unmarshal(b, &e); err != nil {
		return Entry{}, fmt.Errorf("journal: entry for %s is unreadable: %w", attemptID, err)
	}
	return e, nil
}

func place(attemptID string) []byte { return []byte("journal/" + attemptID) }
