package journal

import (
	"context"
	"fmt"
	"log/slog"
	"time"
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

// Actions says whether an action is closed, and since when.
type Actions interface {
	// Closed returns when the action (a workflow id) closed; closed is
	// false while it runs. An action its server no longer knows (its
	// history is past the namespace's retention) is closed, at a zero
	// time.
	Closed(ctx context.Context, actionRef string) (at time.Time, closed bool, err error)
}

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

// SweepResult counts one sweep.
type SweepResult struct {
	// Deleted entries; Kept entries of actions still running or closed
	// less than Retention ago; Unreadable entries kept because their
	// action could not be read from them.
	Deleted, Kept, Unreadable int
}

// Sweep runs one pass at now: entries written more than Retention before
// now are candidates (an action closes after its attempts were written,
// so no younger entry can be due), and those whose action closed more
// than Retention before now are deleted. The action of each candidate is
// asked once.
func (s *Sweeper) Sweep(ctx context.Context, now time.Time) (SweepResult, error) {
	var r SweepResult
	cutoff := now.Add(-s.retention())
	byAction := map[string][]string{}
	err := s.Journal.Older(ctx, cutoff, func(w Written) error {
		if w.ActionRef == "" {
			r.Unreadable++
			return nil
		}
		byAction[w.ActionRef] = append(byAction[w.ActionRef], w.AttemptID)
		return nil
	})
	if err != nil {
		return r, fmt.Errorf("journal: list old entries: %w", err)
	}
	for ref, ids := range byAction {
		at, closed, err := s.Actions.Closed(ctx, ref)
		if err != nil {
			return r, fmt.Errorf("journal: is action %s closed: %w", ref, err)
		}
		if !closed || at.After(cutoff) {
			r.Kept += len(ids)
			continue
		}
		if err := s.Journal.Delete(ctx, ids); err != nil {
			return r, err
		}
		r.Deleted += len(ids)
	}
	return r, nil
}

// Run sweeps every interval until ctx ends, the first time at once.
func (s *Sweeper) Run(ctx context.Context, every time.Duration) {
	log := s.Logger
	if log == nil {
		log = slog.Default()
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		r, err := s.Sweep(ctx, time.Now())
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			log.Warn("attempt journal sweep failed; entries are kept until the next", "error", err, "deleted", r.Deleted)
		case r.Deleted > 0 || r.Unreadable > 0:
			log.Info("attempt journal swept", "deleted", r.Deleted, "kept", r.Kept, "unreadable_kept", r.Unreadable)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Sweeper) retention() time.Duration {
	if s.Retention <= 0 {
		return DefaultRetention
	}
	return s.Retention
}
