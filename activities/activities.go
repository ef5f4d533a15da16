// Package activities adapts the recovery engine and the provider layer to
// Temporal: one CallModel execution is one attempt (docs/contract.md section 1).
//
// CallModel returns the attempt's classified outcome as data. The only
// error it returns is a cancellation when the action's own scope ended: it
// wraps ctx.Err() with %w, and a temporal.CanceledError whose details are
// the outcome, so Temporal records a cancellation rather than a failure
// and the timeline keeps the attempt's evidence. A worker shutdown, an
// activity pause, or Temporal losing track of an attempt not yet sent is
// not the action's scope: the attempt's outcome (a committed partial, an
// ambiguous or unsent attempt) is returned as data.
// Temporal must never retry it: the workflow schedules it with
// RetryPolicy.MaximumAttempts = 1 and owns the only budget.
package activities

import (
	"context"
	"log/slog"
	"time"

	"github.com/durallm/durallm/providers/routes"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/telemetry"
)

// Activities holds the worker-side dependencies of durallm's activities.
// Register it with worker.RegisterActivity(&Activities{...}); every
// exported method is an activity, so it has no other exported methods. It is safe for concurrent use once built.
type Activities struct {
	// Engine sends every attempt. Required.
	Engine *recovery.Engine
	// InsecureEngine sends attempts of routes with InsecureSkipVerify set;
	// nil when no route opts out of TLS verification.
	InsecureEngine *recovery.Engine
	// Routes are the configured routes by name. Keys never leave the
	// worker: the workflow refers to routes by name only.
	Routes map[string]routes.Route
	// Reconciler, when set, is asked for application evidence before an
	// ambiguous action waits for a person or program, after the journal.
	// Nil means none.
	Reconciler Reconciler
	// Journal, when set, is where each attempt's end is recorded before
	// the activity reports it (a received response, or an exchange that
	// ended unanswered), and what the built-in reconciler reads first for
	// every ambiguous attempt. Every worker of a task queue must share it.
	// Nil means none.
	Journal journal.Journal
	// BeforeReport, when set, is called with each outcome after it is
	// journaled and before the activity returns it: a hook for tests that
	// must hold the report (a worker killed between the two). Nil in
	// production.
	BeforeReport func(attempt.Outcome)
	// Streams receives streamed deltas while an attempt runs. Nil means
	// deltas are not forwarded (the final response still carries them).
	Streams *Streams
	// StreamURL, when set, is where other processes reach this worker's
	// stream endpoint (http://host:port, no path). A streamed attempt's
	// heartbeats carry it (attempt.Progress.StreamURL). Empty means none
	// is advertised.
	StreamURL string
	// HeartbeatEvery is how often an attempt heartbeats. Zero means 250ms,
	// so a cancellation reaches the HTTP request within about a second
	// (together with the worker's heartbeat throttle).
	HeartbeatEvery time.Duration
	// SearchAttributes says the Temporal namespace has durallm's search
	// attributes registered (DurallmState, DurallmOutcome, DurallmRoute,
	// all Keyword), so workflows keep them current. False means they are
	// not written: upserting an unregistered attribute fails the workflow
	// task.
	SearchAttributes bool
	// Results keeps responses larger than LargeResponseBytes out of
	// history: the outcome then carries a reference instead. Nil means
	// responses always travel inline.
	Results resultstore.Store
	// LargeResponseBytes is the JSON size above which a response goes to
	// Results. Zero means resultstore.DefaultThreshold (256 KiB).
	LargeResponseBytes int
	// StopGrace is how long a running attempt may go on once its worker
	// starts a graceful stop. Past it the activity ends the attempt itself
	// (its evidence intact) and returns, while the worker can still report
	// the outcome: the SDK fails any result reported after its stop
	// timeout has canceled the worker's context. Set it below the worker's
	// stop timeout. Zero means 8s (the worker's default stop timeout is
	// 10s); negative means the attempt runs until the SDK cancels it.
	StopGrace time.Duration
	// Telemetry records per-attempt metrics. Nil means none.
	Telemetry *telemetry.Telemetry
	// Logger receives worker-side events (never content). Nil means
	// slog.Default().
	Logger *slog.Logger

	// lease overrides journalLease, for tests.
	lease time.Duration
}

func (a *Activities) logger() *slog.Logger {
	if a.Logger != nil {
		return a.Logger
	}
	return slog.Default()
}

// DescribeRoutes returns the Plan for the named routes. The workflow runs
// it as a local activity so route configuration stays on the worker and
// the answer is recorded in history.
func (a *Activities) DescribeRoutes(_ context.Context, in attempt.PlanInput) (attempt.Plan, error) {
	p := attempt.Plan{Reconciler: a.Reconciler != nil || a.Journal != nil, SearchAttributes: a.SearchAttributes, StateUpserts: attempt.CurrentStateUpserts, DeadlineTimer: attempt.CurrentDeadlineTimer}
	for _, name := range in.Routes {
		r, ok := a.Routes[name]
		if !ok {
			p.Unknown = append(p.Unknown, name)
			continue
		}
		info := attempt.RouteInfo{
			Name: r.Name, Kind: r.Kind, Model: r.Model, Capabilities: r.Capabilities,
			HonoursIdempotencyKey: r.HonoursIdempotencyKey, IdempotencyWindow: r.IdempotencyWindow,
			AttemptTimeout: r.AttemptTimeout, Prices: r.Prices, ImageTokens: r.ImageTokens,
		}
		if r.ProviderRecord != "" {
			// The built-in reconciler looks the route's record up.
			p.Reconciler, info.ProviderRecordSettle = true, r.WithDefaults().ProviderRecordSettle
		}
		p.Routes = append(p.Routes, info)
	}
	return p, nil
}
