package callerbudget

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/durallm/durallm/internal/pgdb"
	"github.com/durallm/durallm/workflows"
)

// Postgres is a Store in durallm's PostgreSQL database (internal/pgdb
// owns its schema: tables caller_spend and caller_holds), shared by every
// gateway that connects to it. A reservation locks its caller's account
// row for the length of one transaction, so gateways reserving for the
// same caller at once take turns and never both take the last of it.
type Postgres struct {
	pool *pgxpool.Pool
}

// OpenPostgres connects to the database dsn names (a postgres:// URL;
// database "durallm" when it names none), creating it when missing and
// migrating its schema, as the attempt journal does. An unreachable
// database is an error wrapping pgdb.ErrUnreachable, naming the address
// (never the password). Close it when done.
func OpenPostgres(ctx context.Context, dsn string) (*Postgres, error) {
	pool, err := pgdb.Open(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("callerbudget: %w", err)
	}
	return &Postgres{pool: pool}, nil
}

// Close implements Store.
func (p *Postgres) Close() error {
	p.pool.Close()
	return nil
}

// Reserve implements Store.
func (p *Postgres) Reserve(ctx context.Context, ask Ask) (Reservation, error) {
	var r Reservation
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO caller_spend (caller, period) VALUES ($1, $2) ON CONFLICT DO NOTHING`, ask.Caller, ask.Period); err != nil {
			return err
		}
		var a Account
		if err := tx.QueryRow(ctx, `SELECT settled_tokens, settled_cost, held_tokens, held_cost FROM caller_spend
WHERE caller = $1 AND period = $2 FOR UPDATE`, ask.Caller, ask.Period).Scan(&a.Settled.Tokens, &a.Settled.Cost, &a.Held.Tokens, &a.Held.Cost); err != nil {
			return err
		}
		var have workflows.Spend
		err := tx.QueryRow(ctx, `SELECT tokens, cost FROM caller_holds WHERE action_id = $1`, ask.ActionID).Scan(&have.Tokens, &have.Cost)
		switch {
		case err == nil:
			r = Reservation{OK: true, Existing: true, Held: have, Account: a}
			return nil
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		if r = decide(a, ask); !r.OK {
			return nil
		}
		if _, err := tx.Exec(ctx, `UPDATE caller_spend SET held_tokens = $3, held_cost = $4 WHERE caller = $1 AND period = $2`,
			ask.Caller, ask.Period, r.Account.Held.Tokens, r.Account.Held.Cost); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO caller_holds (action_id, caller, period, tokens, cost) VALUES ($1, $2, $3, $4, $5)`,
			ask.ActionID, ask.Caller, ask.Period, r.Held.Tokens, r.Held.Cost)
		return err
	})
	if err != nil {
		return Reservation{}, fmt.Errorf("callerbudget: reserve for %s: %w", ask.ActionID, err)
	}
	return r, nil
}

// Settle implements Store: one statement, which deletes the hold and
// moves it to the account together.
func (p *Postgres) Settle(ctx context.Context, actionID string, charged workflows.Spend) (Hold, bool, error) {
	h := Hold{ActionID: actionID}
	err := p.pool.QueryRow(ctx, `WITH h AS (DELETE FROM caller_holds WHERE action_id = $1 RETURNING caller, period, tokens, cost, made)
UPDATE caller_spend s SET
	held_tokens = greatest(0, s.held_tokens - h.tokens), held_cost = greatest(0, s.held_cost - h.cost),
	settled_tokens = s.settled_tokens + $2, settled_cost = s.settled_cost + $3
FROM h WHERE s.caller = h.caller AND s.period = h.period
RETURNING h.caller, h.period, h.tokens, h.cost, h.made`, actionID, charged.Tokens, charged.Cost).
		Scan(&h.Caller, &h.Period, &h.Spend.Tokens, &h.Spend.Cost, &h.Made)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Hold{}, false, nil
	case err != nil:
		return Hold{}, false, fmt.Errorf("callerbudget: settle %s: %w", actionID, err)
	}
	return h, true, nil
}

// Account implements Store.
func (p *Postgres) Account(ctx context.Context, caller, period string) (Account, error) {
	var a Account
	err := p.pool.QueryRow(ctx, `SELECT settled_tokens, settled_cost, held_tokens, held_cost FROM caller_spend WHERE caller = $1 AND period = $2`,
		caller, period).Scan(&a.Settled.Tokens, &a.Settled.Cost, &a.Held.Tokens, &a.Held.Cost)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Account{}, nil
	case err != nil:
		return Account{}, fmt.Errorf("callerbudget: account of %s: %w", caller, err)
	}
	return a, nil
}

// Holds implements Store.
func (p *Postgres) Holds(ctx context.Context, madeBefore time.Time, limit int) ([]Hold, error) {
	rows, err := p.pool.Query(ctx, `SELECT action_id, caller, period, tokens, cost, made FROM caller_holds WHERE made < $1 ORDER BY made LIMIT $2`, madeBefore, limit)
	if err != nil {
		return nil, fmt.Errorf("callerbudget: holds: %w", err)
	}
	defer rows.Close()
	var out []Hold
	for rows.Next() {
		var h Hold
		if err := rows.Scan(&h.ActionID, &h.Caller, &h.Period, &h.Spend.Tokens, &h.Spend.Cost, &h.Made); err != nil {
			return nil, fmt.Errorf("callerbudget: holds: %w", err)
		}
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("callerbudget: holds: %w", err)
	}
	return out, nil
}
