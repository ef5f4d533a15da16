// Package pgstore is a result store (resultstore.Store) in PostgreSQL: the
// table results of durallm's own database, the one the attempt journal
// uses (journal.Postgres), so responses too large for history are read on
// any machine. References are "pg:<sha256>".
//
// It is a package of its own so that a client opts into the PostgreSQL
// driver only when it resolves such references: a worker opens the store
// with Open (which creates and migrates the database), a client with
// Connect (which creates nothing), and gives it to
// durallm.Client.WithResults.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/internal/pgdb"
	"github.com/durallm/durallm/resultstore"
)

// Scheme is the prefix of this store's references.
const Scheme = "pg"

// Store keeps each blob as a row keyed by its SHA-256, and the actions it
// was stored for (PutFor) as its claims (resultstore.Expirable).
type Store struct {
	// Keys, when set (before first use), encrypts what is stored with the
	// payload keyring (resultstore.Seal); clients need the same keyring.
	Keys *codec.Keyring
	// MaxBytes is the largest blob Put keeps (resultstore.ErrTooLarge
	// above it). Zero means resultstore.DefaultMaxBytes.
	MaxBytes int64

	pool *pgxpool.Pool
}

// Open connects to the database dsn names (a postgres:// URL; database
// "durallm" when it names none), creating it when missing and migrating
// its schema, as a worker does at start. An unreachable database is an
// error naming the address, wrapping the cause.
func Open(ctx context.Context, dsn string) (*Store, error) {
	pool, err := pgdb.Open(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("resultstore: %w", err)
	}
	return &Store{pool: pool}, nil
}

// Connect connects to a database a worker has already created, for a
// client that only reads. It creates nothing.
func Connect(ctx context.Context, dsn string) (*Store, error) {
	pool, err := pgdb.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("resultstore: %w", err)
	}
	return &Store{pool: pool}, nil
}

// Close closes the connections.
func (s *Store) Close() { s.pool.Close() }

// Put stores data once: a second Put of the same data, from any worker,
// writes nothing and returns the same reference.
func (s *Store) Put(ctx context.Context, data []byte) (string, error) {
	if err := resultstore.CheckSize(int64(len(data)), s.Limit()); err != nil {
		return "", err
	}
	ref := resultstore.Ref(Scheme, data)
	stored, err := resultstore.Seal(s.Keys, ref, data)
	if err != nil {
		return "", err
	}
	if stored == nil {
		stored = []byte{} // the column is NOT NULL; an empty response is still a response
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO results (sha256, data) VALUES ($1, $2) ON CONFLICT (sha256) DO NOTHING`,
		strings.TrimPrefix(ref, Scheme+":"), stored)
	if err != nil {
		return "", fmt.Errorf("resultstore: store %s: %w", ref, err)
	}
	return ref, nil
}

// Get reads the blob a "pg:<sha256>" reference names and checks its
// digest.
func (s *Store) Get(ctx context.Context, ref string) ([]byte, error) {
	name, err := resultstore.Digest(Scheme, ref)
	if err != nil {
		return nil, err
	}
	var data []byte
	err = s.pool.QueryRow(ctx, `SELECT data FROM results WHERE sha256 = $1`, name).Scan(&data)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %s", resultstore.ErrNotFound, ref)
	}
	if err != nil {
		return nil, fmt.Errorf("resultstore: read %s: %w", ref, err)
	}
	return resultstore.Unseal(s.Keys, ref, data)
}

// claimLock is the first key of the transaction-scoped advisory lock a
// PutFor and a Release take on one result (its digest's hash the
// second): the two-key space, which never meets the migration's lock.
const claimLock = 0x64726c72 // "drlr"

// PutFor stores data for the action actionRef: in one transaction, under
// the result's lock, its claim and the data, so that a Release never
// deletes data a PutFor has returned.
func (s *Store) PutFor(ctx context.Context, actionRef string, data []byte) (string, error) {
	if err := resultstore.CheckSize(int64(len(data)), s.Limit()); err != nil {
		return "", err
	}
	ref := resultstore.Ref(Scheme, data)
	stored, err := resultstore.Seal(s.Keys, ref, data)
	if err != nil {
		return "", err
	}
	if stored == nil {
		stored = []byte{}
	}
	name := strings.TrimPrefix(ref, Scheme+":")
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, int32(claimLock), name); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO result_claims (sha256, action_ref) VALUES ($1, $2)
			ON CONFLICT (sha256, action_ref) DO UPDATE SET written = now()`, name, actionRef); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO results (sha256, data) VALUES ($1, $2) ON CONFLICT (sha256) DO NOTHING`, name, stored)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("resultstore: store %s: %w", ref, err)
	}
	return ref, nil
}

// Older lists the claims last written before t.
func (s *Store) Older(ctx context.Context, t time.Time, each func(resultstore.Claim) error) error {
	rows, err := s.pool.Query(ctx, `SELECT sha256, action_ref, written FROM result_claims WHERE written < $1`, t)
	if err != nil {
		return fmt.Errorf("resultstore: list claims: %w", err)
	}
	var claims []resultstore.Claim
	for rows.Next() {
		var c resultstore.Claim
		var name string
		if err := rows.Scan(&name, &c.ActionRef, &c.At); err != nil {
			rows.Close()
			return fmt.Errorf("resultstore: list claims: %w", err)
		}
		c.Ref = Scheme + ":" + name
		claims = append(claims, c)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("resultstore: list claims: %w", err)
	}
	// Called after the rows are read, so each may use the store.
	for _, c := range claims {
		if err := each(c); err != nil {
			return err
		}
	}
	return nil
}

// Release removes the claims and deletes the results no claim is left
// on, each result in a transaction of its own under its lock.
func (s *Store) Release(ctx context.Context, claims []resultstore.Claim) (int, error) {
	byResult := map[string][]string{}
	for _, c := range claims {
		name, err := resultstore.Digest(Scheme, c.Ref)
		if err != nil {
			return 0, err
		}
		byResult[name] = append(byResult[name], c.ActionRef)
	}
	deleted := 0
	for name, actions := range byResult {
		var gone int64
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, int32(claimLock), name); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `DELETE FROM result_claims WHERE sha256 = $1 AND action_ref = ANY($2)`, name, actions); err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, `DELETE FROM results WHERE sha256 = $1 AND NOT EXISTS (SELECT 1 FROM result_claims WHERE sha256 = $1)`, name)
			gone = tag.RowsAffected()
			return err
		})
		if err != nil {
			return deleted, fmt.Errorf("resultstore: release %s:%s: %w", Scheme, name, err)
		}
		deleted += int(gone)
	}
	return deleted, nil
}
