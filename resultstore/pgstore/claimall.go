package pgstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

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
// already holds it (then it is not sent again).
func (s *Store) PutForAll(ctx context.Context, actionRefs []string, data []byte) (string, error) {
	if len(actionRefs) == 0 {
		return s.Put(ctx, data)
	}
	if err := resultstore.CheckSize(int64(len(data)), s.Limit()); err != nil {
		return "", err
	}
	ref := resultstore.Ref(Scheme, data)
	name := strings.TrimPrefix(ref, Scheme+":")
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, int32(claimLock), name); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO result_claims (sha256, action_ref) SELECT $1, unnest($2::text[])
			ON CONFLICT (sha256, action_ref) DO UPDATE SET written = now()`, name, actionRefs); err != nil {
			return err
		}
		var held bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM results WHERE sha256 = $1)`, name).Scan(&held); err != nil || held {
			return err
		}
		stored, err := resultstore.Seal(s.Keys, ref, data)
		if err != nil {
			return err
		}
		if stored == nil {
			stored = []byte{}
		}
		_, err = tx.Exec(ctx, `INSERT INTO results (sha256, data) VALUES ($1, $2) ON CONFLICT (sha256) DO NOTHING`, name, stored)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("resultstore: store %s: %w", ref, err)
	}
	return ref, nil
}
