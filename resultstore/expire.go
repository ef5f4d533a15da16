package resultstore

import (
	"context"
	"log/slog"
	"time"

	"github.com/durallm/durallm/internal/expiry"
)

// DefaultRetention is how long a result is kept after the last action it
// was stored for closed: the attempt journal's retention, so a result
// outlives no entry that names it.
const DefaultRetention = 7 * 24 * time.Hour

// Claim is an action's hold on a stored result: the result is kept while
// any claim on it is.
type Claim struct {
	// Ref is the result's reference.
	Ref string
	// ActionRef is the action (its workflow id) the result was stored
	// for; empty when the claim could not be read, and then it is kept.
	ActionRef string
	// At is when the claim was last written.
	At time.Time
}

// Expirable is a store whose results expire a retention after their
// action closed (Dir and pgstore.Store are). Each result is stored for
// the actions that claim it, and deleted once no claim is left on it, so
// the same response stored for two actions stays while either needs it.
type Expirable interface {
	Store
	// PutFor stores data as a result of the action actionRef, as Put
	// does, and claims it for that action. The claim is written before
	// the data, so a sweep can never delete data a PutFor has returned.
	// Data already stored without a claim stays held for no action: the
	// claim's release never deletes it.
	PutFor(ctx context.Context, actionRef string, data []byte) (ref string, err error)
	// Older calls each for every claim last written before t.
	Older(ctx context.Context, t time.Time, each func(Claim) error) error
	// Release removes the claims and deletes every result no claim is
	// left on; it returns how many results it deleted. A missing claim or
	// result is no error.
	Release(ctx context.Context, claims []Claim) (deleted int, err error)
}

// Actions says whether an action is closed, and since when (as
// journal.Actions; worker.TemporalActions is one).
type Actions = expiry.Actions

// Sweeper expires stored results: a result goes Retention after the last
// action that claims it closed, never while one of them runs. Results
// stored without a claim (by Put, or before claims were kept) have no
// action to wait for and are never swept, not even when an action that
// stored the same data expires: each backend holds them for no action.
// Every worker may run one on a shared store; releasing is idempotent.
type Sweeper struct {
	Store   Expirable
	Actions Actions
	// Retention is how long a result is kept after its action closed;
	// zero means DefaultRetention.
	Retention time.Duration
	// Logger receives a line per sweep that deleted or failed (counts,
	// never content). Nil means slog.Default().
	Logger *slog.Logger
}

// SweepResult counts one sweep: Deleted results, Kept claims of actions
// still running or closed less than Retention ago, Unreadable claims
// kept because their action could not be read.
type SweepResult = expiry.Result

// Sweep runs one pass at now: claims written more than Retention before
// now whose action closed more than Retention before now are released,
// and the results left without a claim deleted.
func (s *Sweeper) Sweep(ctx context.Context, now time.Time) (SweepResult, error) {
	retention := s.Retention
	if retention <= 0 {
		retention = DefaultRetention
	}
	return expiry.Sweep(ctx, expiry.Store[Claim]{
		Older:    s.Store.Older,
		ActionOf: func(c Claim) string { return c.ActionRef },
		Delete:   s.Store.Release,
	}, s.Actions, now.Add(-retention), "resultstore")
}

// Run sweeps every interval until ctx ends, the first time at once.
func (s *Sweeper) Run(ctx context.Context, every time.Duration) {
	expiry.Run(ctx, every, s.Logger, "result store", func(now time.Time) (SweepResult, error) { return s.Sweep(ctx, now) })
}
