// Package pgdb is the one owner of durallm's PostgreSQL database: where it
// is (a DSN, database "durallm" by default), its creation, and its schema.
// The attempt journal (journal.Postgres) and the result store
// (resultstore/pgstore) keep their tables in it.
//
// Open is the worker's: it creates the database when it is missing (by
// connecting to the server's maintenance database, "postgres"), then
// brings the schema to the newest version under an advisory lock, so two
// workers starting at once migrate it once. Connect is a reader's: it
// only connects, and creates nothing.
package pgdb

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultDatabase is the database a DSN that names none uses: one of its
// own, on the same server the Temporal cluster uses.
const DefaultDatabase = "durallm"

// maintenanceDB is where Open connects to create the database.
const maintenanceDB = "postgres"

// migrationLock is the advisory lock key Open holds while it migrates
// (the bytes of "durallm\x00" read as an integer): one worker migrates,
// the others wait and find the work done.
const migrationLock = 0x647572616c6c6d00

// ErrUnreachable is returned (wrapped, with the address and the cause)
// when the server cannot be reached or refuses the connection.
var ErrUnreachable = errors.New("pgdb: cannot reach the PostgreSQL database")

// ErrNoSchema is returned (wrapped) by Connect for a database no worker
// has migrated yet.
var ErrNoSchema = errors.New("pgdb: no durallm schema")

// ErrSchemaNewer is returned (wrapped) by Open for a database a newer
// worker has migrated past what this one knows.
var ErrSchemaNewer = errors.New("pgdb: the database's schema is newer than this worker")

// migrations are the schema's versions, in order: migration i brings the
// schema from version i to i+1. A migration, once released, never
// changes; a change is a new one.
var migrations = []string{
	// 1: the attempt journal and the result store.
	`CREATE TABLE journal (
		attempt_id text PRIMARY KEY,
		action_ref text NOT NULL,
		state      text NOT NULL,
		written    timestamptz NOT NULL DEFAULT now(),
		entry      bytea NOT NULL
	);
	CREATE INDEX journal_written ON journal (written);
	CREATE TABLE results (
		sha256 text PRIMARY KEY,
		data   bytea NOT NULL,
		stored timestamptz NOT NULL DEFAULT now()
	);`,
	// 2: which actions each stored result was stored for, so that results
	// expire a retention after their action closed (resultstore.Expirable).
	`CREATE TABLE result_claims (
		sha256     text NOT NULL,
		action_ref text NOT NULL,
		written    timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (sha256, action_ref)
	);
	CREATE INDEX result_claims_written ON result_claims (written);`,
}

// Version is the schema version Open migrates to.
func Version() int { return len(migrations) }

// Config parses dsn (a postgres:// URL or a libpq key=value string); a
// DSN that names no database gets DefaultDatabase.
func Config(dsn string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's message quotes the DSN with its password redacted.
		return nil, fmt.Errorf("pgdb: the PostgreSQL DSN does not parse (want postgres://user@host:port/db): %w", err)
	}
	if cfg.ConnConfig.Database == "" {
		cfg.ConnConfig.Database = DefaultDatabase
	}
	return cfg, nil
}

// Addr is where cfg points, for error messages: host:port/database, with
// no user or password.
func Addr(cfg *pgxpool.Config) string {
	return net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))) + "/" + cfg.ConnConfig.Database
}

// Open connects to the database dsn names, creating it when missing, and
// migrates its schema. The caller closes the pool.
func Open(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := Config(dsn)
	if err != nil {
		return nil, err
	}
	if err := createDatabase(ctx, cfg); err != nil {
		return nil, err
	}
	pool, err := connect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, fmt.Errorf("pgdb: migrate %s: %w", Addr(cfg), err)
	}
	return pool, nil
}

// Connect connects to the database dsn names and checks that its schema
// is one this code reads. It creates and migrates nothing.
func Connect(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := Config(dsn)
	if err != nil {
		return nil, err
	}
	pool, err := connect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var v int
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_version`).Scan(&v); err != nil || v < 1 {
		pool.Close()
		var pgErr *pgconn.PgError
		if err == nil || (errors.As(err, &pgErr) && pgErr.Code == "42P01") { // 42P01 undefined_table
			err = ErrNoSchema
		}
		return nil, fmt.Errorf("pgdb: %s has no durallm schema (start a worker with this DSN first): %w", Addr(cfg), err)
	}
	return pool, nil
}

func connect(ctx context.Context, cfg *pgxpool.Config) (*pgxpool.Pool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w at %s: %w", ErrUnreachable, Addr(cfg), err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("%w at %s: %w", ErrUnreachable, Addr(cfg), err)
	}
	return pool, nil
}

// createDatabase creates cfg's database unless it exists. Two workers
// creating it at once is fine: the loser's duplicate_database error
// means the work is done.
func createDatabase(ctx context.Context, cfg *pgxpool.Config) error {
	mc := cfg.ConnConfig.Copy()
	mc.Database = maintenanceDB
	conn, err := pgx.ConnectConfig(ctx, mc)
	if err != nil {
		// The maintenance database may be missing or closed to this user
		// while the database itself exists and is open: let connecting
		// to it decide. Any other refusal (the server starting up, say)
		// is the server's.
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			switch pgErr.Code {
			case "3D000", "42501", "28000", "28P01": // invalid_catalog_name, insufficient_privilege, invalid_authorization_specification, invalid_password
				return nil
			}
		}
		return fmt.Errorf("%w at %s: %w", ErrUnreachable, Addr(cfg), err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, cfg.ConnConfig.Database).Scan(&exists); err != nil {
		return fmt.Errorf("pgdb: look for database %s: %w", Addr(cfg), err)
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{cfg.ConnConfig.Database}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505") {
		// 42P04 duplicate_database; 23505 when two CREATE DATABASE race
		// on pg_database's unique index.
		return nil
	}
	if err != nil {
		return fmt.Errorf("pgdb: create database %s: %w", Addr(cfg), err)
	}
	return nil
}

// migrate applies the migrations the schema lacks, each in a transaction
// with its version row, under the advisory lock.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(migrationLock)); err != nil {
		return err
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, int64(migrationLock))
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
		version int PRIMARY KEY,
		applied timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return err
	}
	var have int
	if err := conn.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_version`).Scan(&have); err != nil {
		return err
	}
	if have > len(migrations) {
		return fmt.Errorf("%w: the schema is at version %d, this worker's is %d: upgrade the worker", ErrSchemaNewer, have, len(migrations))
	}
	for v := have; v < len(migrations); v++ {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, migrations[v]); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO schema_version (version) VALUES ($1)`, v+1)
			return err
		})
		if err != nil {
			return fmt.Errorf("migration %d: %w", v+1, err)
		}
	}
	return nil
}
