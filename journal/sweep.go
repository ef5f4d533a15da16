package journal

import (
	"context"
	"log/slog"
	"time"

	"github.com/durallm/durallm/internal/expiry"
)

// DefaultRetention is how long an entry is kept after its action closed.
const DefaultRetention = 7 * 24 * time.Hour

// Written is an entry as the sweeper sees it: whose, and when written.
type Written struct {
	AttemptID string
	// ActionRef is the entry's action (its workflow id); empty when the
	// entry could not be read (for want of its key, say), and then the
	// entry is kept.
	ActionRef string
	At        time.Time
}

// Expirable is a journal whose old entries can be listed and deleted; Dir
// and Postgres are.
type Expirable interface {
	Journal
	// Older calls each for every entry written before t.
	Older(ctx context.Context, t time.Time, each func(Written) error) error
	// Delete removes the attempts' entries; a missing one is no error.
	Delete(ctx context.Context, attemptIDs []string) error
}

// Actions says whether an action is closed, and since when: Closed
// returns when the action (a workflow id) closed, closed false while it
// runs; an action its server no longer knows (its history is past the
// namespace's retention) is closed, at a zero time.
// worker.TemporalActions is one on a Temporal client.
type Actions = expiry.Actions

// Sweeper expires journal entries: an entry goes Retention after its
// action closed. An entry of an action that still runs is kept however old
// it is: the action may still need it to reconcile an attempt. Every
// worker may run one on a shared journal; deleting is idempotent.
type Sweeper struct {
	Journal Expirable
	Actions Actions
	// Retention is how long an entry is kept after its action closed;
	// zero means DefaultRetention.
	Retention time.Duration
	// Logger receives a line per sweep that deleted or failed (counts and
	// ids, never content). Nil means slog.Default().
	Logger *slog.Logger
}

// SweepResult counts one sweep: Deleted entries; Kept entries of actions
// still running or closed less than Retention ago; Unreadable entries
// kept because their action could not be read from them.
type SweepResult = expiry.Result

// Sweep runs one pass at now: entries written more than Retention before
// now are candidates (an action closes after its attempts were written,
// so no younger entry can be due), and those whose action closed more
// than Retention before now are deleted. The action of each candidate is
// asked once.
func (s *Sweeper) Sweep(ctx context.Context, now time.Time) (SweepResult, error) {
	return expiry.Sweep(ctx, expiry.Store[Written]{
		Older:    s.Journal.Older,
		ActionOf: func(w Written) string { return w.ActionRef },
		Delete: func(ctx context.Context, ws []Written) (int, error) {
			ids := make([]string, len(ws))
			for i, w := range ws {
				ids[i] = w.AttemptID
			}
			return len(ids), s.Journal.Delete(ctx, ids)
		},
	}, s.Actions, now.Add(-s.retention()), "journal")
}

// Run sweeps every interval until ctx ends, the first time at once.
func (s *Sweeper) Run(ctx context.Context, every time.Duration) {
	expiry.Run(ctx, every, s.Logger, "attempt journal", func(now time.Time) (SweepResult, error) { return s.Sweep(ctx, now) })
}

func (s *Sweeper) retention() time.Duration {
	if s.Retention <= 0 {
		return DefaultRetention
	}
	return s.Retention
}
