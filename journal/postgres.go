package journal

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/internal/pgdb"
)

// Postgres is a Journal in PostgreSQL: one row per attempt in the table
// journal of durallm's own database (internal/pgdb owns the database and
// its schema). Every worker that connects to the same database reads
// every other worker's entries. A Record is one statement, so a reader
// sees the whole of an entry or none of it. Open it with OpenPostgres.
type Postgres struct {
	// Keys, when set (before first use), encrypts each entry as Dir.Keys
	// does.
	Keys *codec.Keyring

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

// record writes an end over anything, and a Sent only where the attempt
// has no row, in one statement.
const record = `INSERT INTO journal (attempt_id, action_ref, state, entry) VALUES ($1, $2, $3, $4)
ON CONFLICT (attempt_id) DO UPDATE
SET action_ref = EXCLUDED.action_ref, state = EXCLUDED.state, written = now(), entry = EXCLUDED.entry
WHERE EXCLUDED.state <> 'sent'`

// Record writes e's row.
func (p *Postgres) Record(ctx context.Context, e Entry) error {
	if err := validID(e.AttemptID); err != nil {
		return err
	}
	b, err := encode(e, p.Keys)
	if err != nil {
		return err
	}
	if _, err := p.pool.Exec(ctx, record, e.AttemptID, e.ActionRef, string(e.State), b); err != nil {
		return fmt.Errorf("journal: record %s: %w", e.AttemptID, err)
	}
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
