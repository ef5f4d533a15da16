package activities

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/internal/tick"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/resultstore"
)

// How long a write the report waits for may take: the end record (and
// the renewals in flight), then the result store's Put. Neither backend
// bounds a write by itself, and an answer held past the activity's
// deadline is lost to Temporal (which then asks a person), so each is cut
// there, and never later than reportReserve before the deadline.
const (
	journalWriteTimeout = time.Second
	resultWriteTimeout  = 5 * time.Second
	reportReserve       = 500 * time.Millisecond
)

// ErrWriteTimedOut is returned (wrapped, with the context's error) for a
// journal or result-store write that did not finish within its bound.
// The write may still land later.
var ErrWriteTimedOut = errors.New("durallm: the write did not finish in time")

// writeBy is when a write started now must be done: d from now, and
// never later than reportReserve before ctx's deadline.
func writeBy(ctx context.Context, d time.Duration) time.Time {
	by := time.Now().Add(d)
	if dl, ok := ctx.Deadline(); ok && dl.Add(-reportReserve).Before(by) {
		by = dl.Add(-reportReserve)
	}
	return by
}

// boundedWrite runs write on a goroutine of its own, with a context that
// ends at by (and not with ctx: a worker stop must not cut the record of
// what it saw), and stops waiting for it then (Activities.bounded). The
// backends keep a late Sent from hiding an end (journal.Journal.Record).
func (a *Activities) boundedWrite(ctx context.Context, by time.Time, write func(context.Context) error) error {
	return a.bounded(ctx, by, true, ErrWriteTimedOut, write)
}

// record journals how the attempt ended, before it is reported: the
// response a worker received survives the report being lost. A journal
// that cannot be written by by is logged and counted, never an attempt's
// failure: the outcome still goes to Temporal.
func (a *Activities) record(ctx context.Context, in attempt.Input, out attempt.Outcome, by time.Time) {
	if a.Journal == nil {
		return
	}
	e := journal.Entry{AttemptID: in.AttemptID, ActionRef: in.ActionRef, Attempt: in.Attempt,
		Class: out.Classification.Class, Reason: out.Classification.Reason, At: time.Now()}
	switch {
	case out.Response != nil && out.Response.Error == nil:
		e.State, e.Response = journal.Received, out.Response
	case out.Classification.Class == evidence.Unsent, out.Classification.Class == evidence.Refused:
		// The engine's proof that the provider did not process it: if
		// this report is lost, the reconciler can still send the action
		// on.
		e.State = journal.NotProcessed
	case out.Evidence.RequestSent || out.Evidence.MaybeSent:
		e.State = journal.EndedUnanswered
	default:
		return // no request, no proof of one: nothing worth keeping
	}
	// A worker shutdown may have ended ctx; the entry must still be
	// written.
	if err := a.boundedWrite(ctx, by, func(ctx context.Context) error { return a.Journal.Record(ctx, e) }); err != nil {
		a.logger().Warn("attempt journal unavailable: the outcome is reported without it", "attempt_id", in.AttemptID, "error", err)
		a.Telemetry.JournalFailed(ctx)
	}
}

// The journal's sent record: how soon after the request leaves it is
// written, and how often it is renewed while the exchange runs. The
// renewals are how the built-in reconciler tells a live worker's attempt
// (worth waiting for) from a dead worker's (not).
const (
	journalSentPoll = 50 * time.Millisecond
	journalLease    = 2 * time.Second
)

// renewalBound is how many leases a renewal write may take before the
// worker stops waiting for it. The next renewal starts a lease after this
// one, so a worker whose writes land within their bound lands a renewal
// at most a lease plus that bound after the one before: what it writes in
// the entry (journal.Entry.Renewal) for its readers' patience.
const renewalBound = 3

// sentInFlight bounds an attempt's renewal writes that have not returned
// (waited for or abandoned): a hung journal holds that many goroutines per
// attempt, not one per lease.
const sentInFlight = 3

// sentRecord is an attempt's Sent record in the journal while its
// exchange runs. A nil sentRecord (no journal) does nothing.
type sentRecord struct {
	stopTicks func()
	// writes counts the renewal writes that have not returned, inFlight
	// the same for reading without waiting.
	writes   sync.WaitGroup
	inFlight atomic.Int32
	failed   atomic.Bool
}

// stop ends the renewals: none starts once it returns.
func (s *sentRecord) stop() {
	if s != nil {
		s.stopTicks()
	}
}

// wait waits for the renewals still in flight to return, until by at the
// latest. Correctness needs no wait (a Sent landing after the end never
// hides it); a journal that is merely slow gets its last renewal in.
func (s *sentRecord) wait(by time.Time) {
	if s == nil || s.inFlight.Load() == 0 {
		return
	}
	done := make(chan struct{})
	go func() {
		s.writes.Wait()
		close(done)
	}()
	t := time.NewTimer(time.Until(by))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// journalSent journals the attempt as Sent once its request is on the
// wire, and renews the entry every journalLease while the exchange runs,
// with the time left to the exchange's deadline and how long its next
// renewal may take to land (journal.Entry.Renewal, the reader's
// patience). A renewal never waits for the one before it: each is a
// write of its own, bounded by renewalBound leases, so one stuck write
// does not make a live worker look dead. Failures are logged and counted
// like record's, once.
func (a *Activities) journalSent(ctx context.Context, in attempt.Input, att *recovery.Attempt) *sentRecord {
	if a.Journal == nil {
		return nil
	}
	deadline, _ := ctx.Deadline()
	var last time.Time
	s := &sentRecord{}
	// Not stopped by ctx: the caller's stop ends it, after the exchange.
	s.stopTicks = tick.Every(journalSentPoll, nil, func() {
		if time.Since(last) < a.journalLease() || s.inFlight.Load() >= sentInFlight || !att.OnTheWire() {
			return
		}
		last = time.Now()
		e := journal.Entry{AttemptID: in.AttemptID, ActionRef: in.ActionRef, Attempt: in.Attempt, State: journal.Sent, At: last, Deadline: deadline,
			Renewal: a.journalLease() + renewalBound*a.journalLease()}
		if !deadline.IsZero() {
			e.Remaining = deadline.Sub(last)
		}
		by := last.Add(renewalBound * a.journalLease())
		if !deadline.IsZero() && deadline.Before(by) {
			by = deadline
		}
		s.inFlight.Add(1)
		s.writes.Add(1)
		returned := func() {
			s.writes.Done()
			s.inFlight.Add(-1)
		}
		go func() {
			err := a.boundedWrite(ctx, by, func(ctx context.Context) error {
				defer returned()
				return a.Journal.Record(ctx, e)
			})
			if errors.Is(err, ErrJournalStuck) {
				returned() // never started
			}
			if err != nil && !s.failed.Swap(true) {
				a.logger().Warn("attempt journal unavailable: the attempt goes on without its sent record", "attempt_id", in.AttemptID, "error", err)
				a.Telemetry.JournalFailed(ctx)
			}
		}()
	})
	return s
}

// storeLarge moves a response too large for history into the result
// store, leaving a reference; a store whose results expire keeps it for
// the action actionRef. If the store fails, the response stays inline:
// Temporal may still accept it, and the answer is not lost.
func (a *Activities) storeLarge(ctx context.Context, actionRef string, out *attempt.Outcome) {
	if a.Results == nil || out.Response == nil {
		return
	}
	limit := a.LargeResponseBytes
	if limit <= 0 {
		limit = resultstore.DefaultThreshold
	}
	b, err := json.Marshal(out.Response)
	if err != nil || len(b) <= limit {
		return
	}
	var ref string
	err = a.boundedWrite(ctx, writeBy(ctx, resultWriteTimeout), func(ctx context.Context) error {
		var err error
		if ex, ok := a.Results.(resultstore.Expirable); ok {
			ref, err = ex.PutFor(ctx, actionRef, b)
		} else {
			ref, err = a.Results.Put(ctx, b)
		}
		return err
	})
	if err != nil {
		a.logger().Warn("large response kept inline: result store failed", "attempt_id", out.Evidence.AttemptID, "bytes", len(b), "error", err)
		return
	}
	out.Response, out.ResponseRef = nil, ref
}
