// Package expiry is the one sweep the worker runs over what it keeps for
// actions (the attempt journal's entries, the result store's results):
// a record goes a retention after its action closed, never while the
// action runs. journal.Sweeper and resultstore.Sweeper are it over their
// stores.
package expiry

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// Actions says whether an action is closed, and since when.
type Actions interface {
	// Closed returns when the action (a workflow id) closed; closed is
	// false while it runs. An action its server no longer knows (its
	// history is past the namespace's retention) is closed, at a zero
	// time.
	Closed(ctx context.Context, actionRef string) (at time.Time, closed bool, err error)
}

// Result counts one sweep.
type Result struct {
	// Deleted records; Kept records of actions still running or closed
	// less than the retention ago; Unreadable records kept because their
	// action could not be read from them.
	Deleted, Kept, Unreadable int
}

// Store is what a sweep lists and deletes, records of type R.
type Store[R any] struct {
	// Older calls each for every record written before t.
	Older func(ctx context.Context, t time.Time, each func(R) error) error
	// ActionOf is a record's action, "" when it could not be read (the
	// record is then kept).
	ActionOf func(R) string
	// Delete removes the records of one action; it returns how many
	// records it counts as deleted.
	Delete func(ctx context.Context, records []R) (int, error)
}

// Sweep runs one pass: records written before cutoff are candidates (an
// action closes after its records were written, so no younger record can
// be due), and those whose action closed before cutoff are deleted. The
// action of each candidate is asked once; what is deleted is counted as
// Delete says. what names the store in errors.
func Sweep[R any](ctx context.Context, s Store[R], actions Actions, cutoff time.Time, what string) (Result, error) {
	var r Result
	byAction := map[string][]R{}
	err := s.Older(ctx, cutoff, func(rec R) error {
		ref := s.ActionOf(rec)
		if ref == "" {
			r.Unreadable++
			return nil
		}
		byAction[ref] = append(byAction[ref], rec)
		return nil
	})
	if err != nil {
		return r, fmt.Errorf("%s: list old records: %w", what, err)
	}
	for ref, recs := range byAction {
		at, closed, err := actions.Closed(ctx, ref)
		if err != nil {
			return r, fmt.Errorf("%s: is action %s closed: %w", what, ref, err)
		}
		if !closed || at.After(cutoff) {
			r.Kept += len(recs)
			continue
		}
		n, err := s.Delete(ctx, recs)
		if err != nil {
			return r, err
		}
		r.Deleted += n
	}
	return r, nil
}

// Run calls sweep at every interval until ctx ends, the first time at
// once, logging a sweep that deleted or kept something unreadable, or
// failed, with counts only (never content). what names the store in the
// lines ("attempt journal", "result store").
func Run(ctx context.Context, every time.Duration, log *slog.Logger, what string, sweep func(now time.Time) (Result, error)) {
	if log == nil {
		log = slog.Default()
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		r, err := sweep(time.Now())
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			log.Warn(what+" sweep failed; what it holds is kept until the next", "error", err, "deleted", r.Deleted)
		case r.Deleted > 0 || r.Unreadable > 0:
			log.Info(what+" swept", "deleted", r.Deleted, "kept", r.Kept, "unreadable_kept", r.Unreadable)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
