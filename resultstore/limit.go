package resultstore

import (
	"errors"
	"fmt"
)

// DefaultMaxBytes is the largest blob a store keeps when its MaxBytes is
// zero: 32 MiB, room for a 20 MB request with its JSON around it, far
// below what a file or a PostgreSQL bytea can hold, and small enough that
// a worker holds a few of them in memory at once.
const DefaultMaxBytes = 32 << 20

// ErrTooLarge is returned (wrapped) by Put and PutFor for data larger than
// the store keeps (its Limit); nothing is stored.
var ErrTooLarge = errors.New("resultstore: larger than the store keeps")

// Limited is a store that keeps blobs up to a size (Dir and pgstore.Store
// are).
type Limited interface {
	// Limit is the largest blob, in bytes, the store keeps.
	Limit() int64
}

// LimitOf is s's limit when it declares one, else DefaultMaxBytes.
func LimitOf(s Store) int64 {
	if l, ok := s.(Limited); ok {
		return l.Limit()
	}
	return DefaultMaxBytes
}

// limit is a MaxBytes field's value: zero or less means DefaultMaxBytes.
func limit(maxBytes int64) int64 {
	if maxBytes <= 0 {
		return DefaultMaxBytes
	}
	return maxBytes
}

// CheckSize returns an error wrapping ErrTooLarge when n bytes are more
// than limit: the one message every store and the payload codec give.
func CheckSize(n, limit int64) error {
	if n > limit {
		return fmt.Errorf("%w: %d bytes, over the limit of %d", ErrTooLarge, n, limit)
	}
	return nil
}

// Limit is the largest blob Dir keeps: MaxBytes, or DefaultMaxBytes.
func (d Dir) Limit() int64 { return limit(d.MaxBytes) }
