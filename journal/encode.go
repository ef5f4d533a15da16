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

// ErrUnsealed is returned (wrapped) by Lookup for an entry stored in the
// clear when the journal has a keyring: every worker with the keys seals
// what it writes, so the entry was not written by one (or was written
// before encryption was turned on).
var ErrUnsealed = errors.New("journal: the entry is not sealed and the journal encrypts its entries; it is not read")

// ErrOtherAttempt is returned (wrapped) by Lookup for an entry whose
// attempt id is not the one looked up: it was copied from, or written
// for, another attempt.
var ErrOtherAttempt = errors.New("journal: the entry stored for this attempt is another attempt's")

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

// decode reads what encode wrote for attemptID. With keys, only a sealed
// entry reads (ErrUnsealed otherwise); without, a sealed one is
// ErrEncrypted. Either way the entry must be attemptID's own
// (ErrOtherAttempt): the reconciler settles an action with what it finds.
func decode(b []byte, attemptID string, keys *codec.Keyring) (Entry, error) {
	switch sealed := codec.Sealed(b); {
	case sealed && keys == nil:
		return Entry{}, fmt.Errorf("%w: %s", ErrEncrypted, attemptID)
	case !sealed && keys != nil:
		return Entry{}, fmt.Errorf("%w: %s", ErrUnsealed, attemptID)
	case sealed:
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
	if e.AttemptID != attemptID {
		return Entry{}, fmt.Errorf("%w: %s", ErrOtherAttempt, attemptID)
	}
	return e, nil
}

func place(attemptID string) []byte { return []byte("journal/" + attemptID) }

// clearActionRef is the action an entry stored in the clear names, ""
// for a sealed or unreadable one. It is never evidence: a sweep reads it
// to expire an entry a journal with a keyring refuses (ErrUnsealed) with
// the action it belongs to.
func clearActionRef(b []byte) string {
	if codec.Sealed(b) {
		return ""
	}
	var e struct {
		ActionRef string `json:"action_ref"`
	}
	if json.Unmarshal(b, &e) != nil {
		return ""
	}
	return e.ActionRef
}
