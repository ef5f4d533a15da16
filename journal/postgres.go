package journal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/internal/pgdb"
)

// Postgres is a Journal in PostgreSQL: one row per attempt in the table
// journal of durallm's own database (internal/pgdb owns the database and
// its schema). Every worker that connects to the same database reads
// every other worker's entries. A Record is one statement, so a reader
// sees the whole of an entry or none of it, and a Sent that lands after
// the end (its condition is checked on the row as it is written) changes
// nothing. Open it with OpenPostgres.
type Postgres struct {
	// Keys, when set (before first use), encrypts each entry as Dir.Keys
	// does.
	Keys *codec.Keyring
	// Bound, when set (before first use), bounds the journal's size
	// (ErrFull), as Dir.Bound does; its bytes are the entries' stored
	// bytes.
	Bound *Bound

	pool *pgxpool.Pool
}

// OpenPostgres connects to the database dsn names (a postgres:// URL;
// database "durallm" when it names none), creating the database when it
// is missing and migrating its schema, as a worker does at start. An
// unreachable database is an error wrapping pgdb's ErrUnreachable and the
// cause, naming the address (never the password). Close it when done.
func OpenPostgres(ctx context.Context, dsn string) (*Postgres, error) {
	pool, err := pgdb.Open(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	return &Postgres{pool: pool}, nil
}

// Close closes the connections.
func (p *Postgres) Close() { p.pool.Close() }

// record writes an end over anything, and a Sent only over a Sent or
// where the attempt has no row, in one statement. It returns whether the
// row is new (xmax is zero for a row the statement inserted), and no row
// when it wrote nothing (a Sent over an end).
const record = `INSERT INTO journal (attempt_id, action_ref, state, entry) VALUES ($1, $2, $3, $4)
ON CONFLICT (attempt_id) DO UPDATE
SET action_ref = EXCLUDED.action_ref, state = EXCLUDED.state, written = now(), entry = EXCLUDED.entry
WHERE EXCLUDED.state <> 'sent' OR journal.state = 'sent'
RETURNING xmax = 0`

// recordExisting is record for a journal at its bound: it writes over an
// existing entry as record does and adds none. It returns whether the
// attempt had an entry (written over, or an end a Sent leaves as it is).
const recordExisting = `WITH u AS (
	UPDATE journal SET action_ref = $2, state = $3, written = now(), entry = $4
	WHERE attempt_id = $1 AND ($3 <> 'sent' OR state = 'sent')
	RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM u) OR EXISTS (SELECT 1 FROM journal WHERE attempt_id = $1)`

// Record writes e's row.
func (p *Postgres) Record(ctx context.Context, e Entry) error {
	if err := validID(e.AttemptID); err != nil {
		return err
	}
	b, err := encode(e, p.Keys)
	if err != nil {
		return err
	}
	if full, unmeasured := p.Bound.full(ctx, p.usage); full {
		var had bool
		if err := p.pool.QueryRow(ctx, recordExisting, e.AttemptID, e.ActionRef, string(e.State), b).Scan(&had); err != nil {
			return fmt.Errorf("journal: record %s: %w", e.AttemptID, err)
		}
		switch {
		case !had && unmeasured != nil:
			return unmeasured
		case !had:
			return fmt.Errorf("%w: %s", ErrFull, e.AttemptID)
		}
		return nil
	}
	var inserted bool
	err = p.pool.QueryRow(ctx, record, e.AttemptID, e.ActionRef, string(e.State), b).Scan(&inserted)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // a Sent over an end: nothing to write
	}
	if err != nil {
		return fmt.Errorf("journal: record %s: %w", e.AttemptID, err)
	}
	p.Bound.wrote(inserted, e.Ended(), len(b))
	return nil
}

// Lookup reads the attempt's row.
func (p *Postgres) Lookup(ctx context.Context, attemptID string) (Entry, bool, error) {
	if err := validID(attemptID); err != nil {
		return Entry{}, false, err
	}
	var b []byte
	err := p.pool.QueryRow(ctx, `SELECT entry FROM journal WHERE attempt_id = $1`, attemptID).Scan(&b)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Entry{}, false, nil
	case err != nil:
		return Entry{}, false, fmt.Errorf("journal: look up %s: %w", attemptID, err)
	}
	e, err := decode(b, attemptID, p.Keys)
	if err != nil {
		return Entry{}, false, err
	}
	return e, true, nil
}

// Older calls each for every entry written before t, oldest first.
func (p *Postgres) Older(ctx context.Context, t time.Time, each func(Written) error) error {
	rows, err := p.pool.Query(ctx, `SELECT attempt_id, action_ref, written FROM journal WHERE written < $1 ORDER BY written`, t)
	if err != nil {
		return fmt.Errorf("journal: list entries: %w", err)
	}
	var ws []Written
	for rows.Next() {
		var w Written
		if err := rows.Scan(&w.AttemptID, &w.ActionRef, &w.At); err != nil {
			rows.Close()
			return fmt.Errorf("journal: list entries: %w", err)
		}
		ws = append(ws, w)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("journal: list entries: %w", err)
	}
	// each runs after the rows are read: it may ask Temporal and delete,
	// and holds no connection meanwhile.
	for _, w := range ws {
		if err := each(w); err != nil {
			return err
		}
	}
	return nil
}

// Delete removes the attempts' rows.
func (p *Postgres) Delete(ctx context.Context, attemptIDs []string) error {
	var gone Usage
	defer func() { p.Bound.deleted(gone) }()
	err := p.pool.QueryRow(ctx, `WITH d AS (DELETE FROM journal WHERE attempt_id = ANY($1) RETURNING octet_length(entry) AS n)
SELECT count(*), coalesce(sum(n), 0) FROM d`, attemptIDs).Scan(&gone.Entries, &gone.Bytes)
	if err != nil {
		return fmt.Errorf("journal: delete entries: %w", err)
	}
	return nil
}

// usage counts the rows and their stored bytes (octet_length reads a
// large entry's size from its TOAST pointer, not the entry).
func (p *Postgres) usage(ctx context.Context) (Usage, error) {
	var u Usage
	err := p.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(octet_length(entry)), 0) FROM journal`).Scan(&u.Entries, &u.Bytes)
	return u, err
}
