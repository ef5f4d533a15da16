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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/internal/pgdb"
	"github.com/durallm/durallm/resultstore"
)

// Scheme is the prefix of this store's references.
const Scheme = "pg"

// Store keeps each blob as a row keyed by its SHA-256.
type Store struct {
	// Keys, when set (before first use), encrypts what is stored with the
	// payload keyring (resultstore.Seal); clients need the same keyring.
	Keys *codec.Keyring

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
