// Package pgdb is the one owner of durallm's PostgreSQL database: where it
// is (a DSN, database "durallm" by default), its creation, and its schema.
// The attempt journal (journal.Postgres), the result store
// (resultstore/pgstore) and the routes' fleet-wide limits
// (fleetlimit.Postgres) keep their tables in it.
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
	// 3: the fleet-wide limits of the routes (package fleetlimit): one
	// row of buckets per route, the slots each worker holds under a
	// lease, and the functions that change them, each in one statement.
	// The arithmetic is fleetlimit's state (bucket.go), which its tests
	// hold both to.
	`CREATE TABLE fleet_limits (
		key           text PRIMARY KEY,
		requests      double precision NOT NULL,
		tokens        double precision NOT NULL,
		refilled      timestamptz NOT NULL,
		held          integer NOT NULL DEFAULT 0,
		blocked_until timestamptz,
		-- room given back since the row was made (fleetlimit.Mark)
		given_requests double precision NOT NULL DEFAULT 0,
		given_tokens   double precision NOT NULL DEFAULT 0
	);
	CREATE TABLE fleet_leases (
		key     text NOT NULL,
		holder  text NOT NULL,
		slots   integer NOT NULL,
		expires timestamptz NOT NULL,
		PRIMARY KEY (key, holder)
	);
	-- fleet_row locks key's row (made full on first use), refills it to t,
	-- and frees the slots of holders whose lease ran out.
	CREATE FUNCTION fleet_row(p_key text, p_rpm float8, p_tpm float8, t timestamptz) RETURNS fleet_limits
	LANGUAGE plpgsql AS $$
	DECLARE
		r fleet_limits;
		e float8;
		gone integer;
	BEGIN
		SELECT * INTO r FROM fleet_limits WHERE key = p_key FOR UPDATE;
		IF NOT FOUND THEN
			INSERT INTO fleet_limits (key, requests, tokens, refilled) VALUES (p_key, p_rpm, p_tpm, t) ON CONFLICT (key) DO NOTHING;
			SELECT * INTO r FROM fleet_limits WHERE key = p_key FOR UPDATE;
		END IF;
		e := extract(epoch FROM t - r.refilled);
		IF e > 0 THEN
			r.requests := least(p_rpm, r.requests + p_rpm / 60 * e);
			r.tokens := least(p_tpm, r.tokens + p_tpm / 60 * e);
			r.refilled := t;
		END IF;
		WITH d AS (DELETE FROM fleet_leases WHERE key = p_key AND expires < t RETURNING slots)
		SELECT coalesce(sum(slots), 0) INTO gone FROM d;
		r.held := greatest(0, r.held - gone);
		RETURN r;
	END $$;
	CREATE FUNCTION fleet_save(r fleet_limits) RETURNS void LANGUAGE sql AS $$
		UPDATE fleet_limits SET requests = r.requests, tokens = r.tokens, refilled = r.refilled, held = r.held, blocked_until = r.blocked_until,
			given_requests = r.given_requests, given_tokens = r.given_tokens
		WHERE key = r.key;
	$$;
	-- fleet_debit takes p_need from a bucket of p_per_minute (none when
	-- zero) at p_level, and, when the take need not wait, p_extra out of
	-- what is left, whole; a bucket it leaves full refills p_lag later.
	CREATE FUNCTION fleet_debit(p_level float8, p_per_minute float8, p_need float8, p_extra float8, p_no_wait boolean, p_lag float8,
		OUT level float8, OUT got float8)
	LANGUAGE plpgsql IMMUTABLE AS $$
	BEGIN
		level := p_level;
		got := 0;
		IF p_per_minute <= 0 THEN RETURN; END IF;
		level := level - p_need;
		IF p_no_wait THEN
			got := greatest(0, least(p_extra, floor(level)));
			level := level - got;
		END IF;
		IF p_level >= p_per_minute AND p_need + got > 0 THEN
			level := level - p_per_minute / 60 * p_lag;
		END IF;
	END $$;
	CREATE FUNCTION fleet_take(p_key text, p_holder text, p_rpm float8, p_tpm float8, p_max integer,
		p_requests float8, p_tokens float8, p_extra_requests float8, p_extra_tokens float8, p_slot boolean,
		p_max_wait float8, p_lease float8, p_lag float8,
		OUT wait float8, OUT lim text, OUT refused boolean, OUT extra_requests float8, OUT extra_tokens float8, OUT slot boolean,
		OUT requests_wait float8, OUT tokens_wait float8, OUT given_requests float8, OUT given_tokens float8, OUT blocked_until timestamptz)
	LANGUAGE plpgsql AS $$
	DECLARE
		t timestamptz := clock_timestamp();
		r fleet_limits;
		w float8;
	BEGIN
		r := fleet_row(p_key, p_rpm, p_tpm, t);
		wait := 0; lim := ''; refused := false; extra_requests := 0; extra_tokens := 0; slot := false;
		requests_wait := 0; tokens_wait := 0;
		given_requests := r.given_requests; given_tokens := r.given_tokens; blocked_until := r.blocked_until;
		IF p_slot AND p_max > 0 AND r.held >= p_max THEN
			lim := 'concurrency';
			refused := true;
		ELSE
			IF p_rpm > 0 THEN
				requests_wait := greatest(0, least(p_requests, p_rpm) - r.requests) / (p_rpm / 60);
				IF requests_wait > wait THEN wait := requests_wait; lim := 'requests'; END IF;
			END IF;
			IF p_tpm > 0 THEN
				tokens_wait := greatest(0, least(p_tokens, p_tpm) - r.tokens) / (p_tpm / 60);
				IF tokens_wait > wait THEN wait := tokens_wait; lim := 'tokens'; END IF;
			END IF;
			IF r.blocked_until IS NOT NULL THEN
				w := extract(epoch FROM r.blocked_until - t);
				IF w > wait THEN wait := w; lim := 'pushback'; END IF;
			END IF;
			IF wait > p_max_wait THEN
				refused := true;
			ELSE
				SELECT d.level, d.got INTO r.requests, extra_requests FROM fleet_debit(r.requests, p_rpm, p_requests, p_extra_requests, wait = 0, p_lag) d;
				SELECT d.level, d.got INTO r.tokens, extra_tokens FROM fleet_debit(r.tokens, p_tpm, p_tokens, p_extra_tokens, wait = 0, p_lag) d;
				IF p_slot AND p_max > 0 THEN
					r.held := r.held + 1;
					slot := true;
					INSERT INTO fleet_leases (key, holder, slots, expires) VALUES (p_key, p_holder, 1, t + make_interval(secs => p_lease))
					ON CONFLICT (key, holder) DO UPDATE SET slots = fleet_leases.slots + 1, expires = EXCLUDED.expires;
				END IF;
			END IF;
		END IF;
		PERFORM fleet_save(r);
	END $$;
	-- fleet_give frees only slots the holder's lease still counts: those of
	-- a lease that ran out were freed with it.
	CREATE FUNCTION fleet_give(p_key text, p_holder text, p_rpm float8, p_tpm float8,
		p_requests float8, p_tokens float8, p_slots integer) RETURNS void
	LANGUAGE plpgsql AS $$
	DECLARE
		r fleet_limits;
		had integer;
		was float8;
	BEGIN
		r := fleet_row(p_key, p_rpm, p_tpm, clock_timestamp());
		IF p_rpm > 0 THEN
			was := r.requests;
			r.requests := least(p_rpm, r.requests + p_requests);
			r.given_requests := r.given_requests + r.requests - was;
		END IF;
		IF p_tpm > 0 THEN
			was := r.tokens;
			r.tokens := least(p_tpm, r.tokens + p_tokens);
			r.given_tokens := r.given_tokens + r.tokens - was;
		END IF;
		IF p_slots > 0 THEN
			SELECT slots INTO had FROM fleet_leases WHERE key = p_key AND holder = p_holder FOR UPDATE;
			IF FOUND THEN
				r.held := greatest(0, r.held - least(had, p_slots));
				IF had <= p_slots THEN
					DELETE FROM fleet_leases WHERE key = p_key AND holder = p_holder;
				ELSE
					UPDATE fleet_leases SET slots = had - p_slots WHERE key = p_key AND holder = p_holder;
				END IF;
			END IF;
		END IF;
		PERFORM fleet_save(r);
	END $$;
	-- fleet_renew extends the holder's lease; a lease that ran out (its
	-- slots freed) is made again and its slots counted again. It never
	-- changes a live lease's count, which only takes and gives change:
	-- a renewal races the holder's own takes.
	CREATE FUNCTION fleet_renew(p_key text, p_holder text, p_rpm float8, p_tpm float8, p_slots integer, p_lease float8) RETURNS void
	LANGUAGE plpgsql AS $$
	DECLARE
		t timestamptz := clock_timestamp();
		r fleet_limits;
	BEGIN
		r := fleet_row(p_key, p_rpm, p_tpm, t);
		UPDATE fleet_leases SET expires = t + make_interval(secs => p_lease) WHERE key = p_key AND holder = p_holder;
		IF NOT FOUND AND p_slots > 0 THEN
			INSERT INTO fleet_leases (key, holder, slots, expires) VALUES (p_key, p_holder, p_slots, t + make_interval(secs => p_lease));
			r.held := r.held + p_slots;
		END IF;
		PERFORM fleet_save(r);
	END $$;
	CREATE FUNCTION fleet_tighten(p_key text, p_rpm float8, p_tpm float8,
		p_retry_after float8, p_remaining_requests float8, p_remaining_tokens float8) RETURNS void
	LANGUAGE plpgsql AS $$
	DECLARE
		t timestamptz := clock_timestamp();
		r fleet_limits;
		was float8;
	BEGIN
		r := fleet_row(p_key, p_rpm, p_tpm, t);
		IF p_retry_after IS NOT NULL AND (r.blocked_until IS NULL OR t + make_interval(secs => p_retry_after) > r.blocked_until) THEN
			r.blocked_until := t + make_interval(secs => p_retry_after);
		END IF;
		-- What the pushback takes away delays every waiter as a charge does.
		IF p_remaining_requests IS NOT NULL AND p_rpm > 0 THEN
			was := r.requests;
			r.requests := least(r.requests, p_remaining_requests);
			r.given_requests := r.given_requests + r.requests - was;
		END IF;
		IF p_remaining_tokens IS NOT NULL AND p_tpm > 0 THEN
			was := r.tokens;
			r.tokens := least(r.tokens, p_remaining_tokens);
			r.given_tokens := r.given_tokens + r.tokens - was;
		END IF;
		PERFORM fleet_save(r);
	END $$;`,
	// 4: the gateway's caller budgets (package gateway/callerbudget): per
	// caller and period what ended actions were charged and what running
	// ones hold, and one row per hold, by the action it is for.
	`CREATE TABLE caller_spend (
		caller         text NOT NULL,
		period         text NOT NULL,
		settled_tokens bigint NOT NULL DEFAULT 0,
		settled_cost   float8 NOT NULL DEFAULT 0,
		held_tokens    bigint NOT NULL DEFAULT 0,
		held_cost      float8 NOT NULL DEFAULT 0,
		PRIMARY KEY (caller, period)
	);
	CREATE TABLE caller_holds (
		action_id text PRIMARY KEY,
		caller    text NOT NULL,
		period    text NOT NULL,
		tokens    bigint NOT NULL,
		cost      float8 NOT NULL,
		made      timestamptz NOT NULL DEFAULT now()
	);
	CREATE INDEX caller_holds_made ON caller_holds (made);`,
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
