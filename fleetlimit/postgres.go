package fleetlimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/durallm/durallm/internal/pgdb"
)

// DefaultLease is how long a shared store keeps a holder's slots without
// hearing from it: a worker that dies holding slots frees them by then.
// A Limiter renews its leases three times per lease.
const DefaultLease = 15 * time.Second

// Postgres is a Store in durallm's PostgreSQL database (internal/pgdb
// owns its schema), shared by every worker that connects to it: one row
// per route, changed by one statement per take (a function of the
// schema's, so the row is locked, read and written in one round trip),
// and a lease per worker for the slots it holds. Open it with
// OpenPostgres; it is safe for concurrent use.
type Postgres struct {
	// Lease is how long the store keeps a holder's slots without a
	// renewal (set before first use). Zero means DefaultLease.
	Lease time.Duration

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
		return nil, fmt.Errorf("fleetlimit: %w", err)
	}
	return &Postgres{pool: pool}, nil
}

// Close closes the connections.
func (p *Postgres) Close() { p.pool.Close() }

func (p *Postgres) lease() float64 {
	if p.Lease > 0 {
		return p.Lease.Seconds()
	}
	return DefaultLease.Seconds()
}

// Take implements Store.
func (p *Postgres) Take(ctx context.Context, key, holder string, l Limits, a Ask) (Taken, error) {
	var t Taken
	var wait, reqWait, tokWait float64
	var blocked *time.Time
	err := p.pool.QueryRow(ctx, `SELECT wait, lim, refused, extra_requests, extra_tokens, slot, requests_wait, tokens_wait, given_requests, given_tokens, blocked_until
FROM fleet_take($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`,
		key, holder, l.RequestsPerMinute, l.TokensPerMinute, l.MaxConcurrent,
		a.Requests, a.Tokens, a.ExtraRequests, a.ExtraTokens, a.Slot, a.MaxWait.Seconds(), p.lease(), ArrivalLag.Seconds(),
	).Scan(&wait, &t.Limit, &t.Refused, &t.ExtraRequests, &t.ExtraTokens, &t.Slot, &reqWait, &tokWait, &t.Mark.GivenRequests, &t.Mark.GivenTokens, &blocked)
	if err != nil {
		return Taken{}, fmt.Errorf("fleetlimit: take %s: %w", key, err)
	}
	t.Wait, t.RequestsWait, t.TokensWait = seconds(wait), seconds(reqWait), seconds(tokWait)
	if blocked != nil {
		t.Mark.BlockedUntil = *blocked
	}
	return t, nil
}

// Mark implements Store: one read, no lock.
func (p *Postgres) Mark(ctx context.Context, key string) (Mark, error) {
	var m Mark
	var blocked *time.Time
	err := p.pool.QueryRow(ctx, `SELECT given_requests, given_tokens, blocked_until FROM fleet_limits WHERE key = $1`, key).
		Scan(&m.GivenRequests, &m.GivenTokens, &blocked)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Mark{}, nil
	case err != nil:
		return Mark{}, fmt.Errorf("fleetlimit: mark %s: %w", key, err)
	}
	if blocked != nil {
		m.BlockedUntil = *blocked
	}
	return m, nil
}

// Give implements Store.
func (p *Postgres) Give(ctx context.Context, key, holder string, l Limits, requests, tokens float64, slots int) error {
	_, err := p.pool.Exec(ctx, `SELECT fleet_give($1, $2, $3, $4, $5, $6, $7)`,
		key, holder, l.RequestsPerMinute, l.TokensPerMinute, requests, tokens, slots)
	if err != nil {
		return fmt.Errorf("fleetlimit: give %s: %w", key, err)
	}
	return nil
}

// Tighten implements Store.
func (p *Postgres) Tighten(ctx context.Context, key string, l Limits, pb Pushback) error {
	opt := func(v float64, ok bool) *float64 {
		if !ok {
			return nil
		}
		return &v
	}
	_, err := p.pool.Exec(ctx, `SELECT fleet_tighten($1, $2, $3, $4, $5, $6)`,
		key, l.RequestsPerMinute, l.TokensPerMinute,
		opt(pb.RetryAfter.Seconds(), pb.KnownRetryAfter), opt(pb.RemainingRequests, pb.KnownRemainingRequests), opt(pb.RemainingTokens, pb.KnownRemainingTokens))
	if err != nil {
		return fmt.Errorf("fleetlimit: tighten %s: %w", key, err)
	}
	return nil
}

// Renew implements Store.
func (p *Postgres) Renew(ctx context.Context, key, holder string, l Limits, slots int) error {
	_, err := p.pool.Exec(ctx, `SELECT fleet_renew($1, $2, $3, $4, $5, $6)`, key, holder, l.RequestsPerMinute, l.TokensPerMinute, slots, p.lease())
	if err != nil {
		return fmt.Errorf("fleetlimit: renew %s: %w", key, err)
	}
	return nil
}

// Shared implements Store: true.
func (p *Postgres) Shared() bool { return true }

// seconds converts the store's seconds to a Duration, bounded as a
// Retry-After is.
func seconds(s float64) time.Duration {
	if s <= 0 {
		return 0
	}
	if s >= (24 * time.Hour).Seconds() {
		return 24 * time.Hour
	}
	return time.Duration(s * float64(time.Second))
}
