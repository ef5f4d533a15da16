package pgstore

import (
	"context"

	"github.com/durallm/durallm/resultstore"
)

// Limit is the largest blob the store keeps: MaxBytes, or
// resultstore.DefaultMaxBytes.
func (s *Store) Limit() int64 {
	if s.MaxBytes <= 0 {
		return resultstore.DefaultMaxBytes
	}
	return s.MaxBytes
}

// PutForAll stores data for each of actionRefs: in one transaction,
// under the result's lock, every claim, and the data unless the store
// already holds it (then it is not sent again); with no actionRefs it is
// Put.
func (s *Store) PutForAll(ctx context.Context, actionRefs []string, data []byte) (string, error) {
	return s.store(ctx, actionRefs, data)
}
