package activities

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/activity"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/internal/tick"
	"github.com/durallm/durallm/journal"
)

// Reconciler looks for application evidence of whether an ambiguous
// attempt was executed: a stored result, a usage record, a provider
// lookup. It returns a Verdict, or VerdictNone when it cannot tell.
type Reconciler interface {
	Reconcile(ctx context.Context, in attempt.ReconcileInput) (attempt.ReconcileOutput, error)
}

// The reconciler-facing types, under the names a Reconciler has always
// used; they are package attempt's.
type (
	// ReconcileInput describes the ambiguous attempt to the reconciler.
	ReconcileInput = attempt.ReconcileInput
	// ReconcileOutput is the reconciler's answer.
	ReconcileOutput = attempt.ReconcileOutput
	// Verdict is a reconciliation decision.
	Verdict = attempt.Verdict
)

// The verdicts, as in package attempt.
const (
	VerdictNone        = attempt.VerdictNone
	VerdictCompleted   = attempt.VerdictCompleted
	VerdictNotExecuted = attempt.VerdictNotExecuted
	VerdictAllowReplay = attempt.VerdictAllowReplay
	VerdictAbandon     = attempt.VerdictAbandon
)

// ErrNoReconciler is returned by Reconcile when none is configured: no
// journal, no application reconciler and no route with a provider record.
var ErrNoReconciler = errors.New("durallm: no reconciler configured on this worker")

// Reconcile asks the configured Reconciler about an ambiguous attempt.
//
// The journal comes first (docs/contract.md section 5.5):
//   - a response a worker received and journaled settles the attempt as
//     completed, by the journal;
//   - an exchange the engine proved unsent settles it as not executed;
//   - a request journaled as sent, with no end yet, may still end on a
//     live worker (Temporal lost track of it, the worker did not): the
//     reconciler waits for that end until the attempt's own deadline;
//   - otherwise the journal cannot tell.
//
// An unreadable journal is logged and passed over. Then, on a route that
// keeps a provider record, the provider's stored completions
// (reconcileFromProviderRecord). Then the application's Reconciler, if
// any; when it cannot tell either, its note follows what the built-in
// reconciler found. A Reconcile cut short (its worker stops, or it is
// canceled) returns an error wrapping ctx's error and cause: it has not
// found that nothing can tell, so Temporal retries it.
func (a *Activities) Reconcile(ctx context.Context, in attempt.ReconcileInput) (attempt.ReconcileOutput, error) {
	if activity.IsActivity(ctx) {
		// While any reconciler runs, the application's included: its
		// worker's loss is then seen within the heartbeat timeout, and it
		// runs again on another worker at once.
		defer tick.Every(reconcileHeartbeatEvery, ctx.Done(), func() {
			activity.RecordHeartbeat(ctx, "reconciling attempt "+in.AttemptID)
		})()
	}
	var builtin attempt.ReconcileOutput
	asked := false
	if a.Journal != nil {
		out, settled, err := a.reconcileFromJournal(ctx, in)
		if err != nil {
			return attempt.ReconcileOutput{}, err
		}
		if settled {
			return out, nil
		}
		builtin, asked = out, true
		builtin.By = attempt.ByJournal
	}
	if route, ok := a.Routes[in.Route]; ok && route.ProviderRecord != "" {
		out, settled, err := a.reconcileFromProviderRecord(ctx, in, route)
		if err != nil {
			return attempt.ReconcileOutput{}, err
		}
		out.JournalState = builtin.JournalState
		if settled {
			return out, nil
		}
		out.Note = joinNotes(builtin.Note, out.Note)
		builtin, asked = out, true
	}
	if a.Reconciler == nil {
		switch {
		case asked:
			builtin.Verdict = attempt.VerdictNone
			return builtin, nil
		case a.keepsProviderRecords():
			// The plan runs the reconciler for the action's other routes;
			// this attempt's has nothing to look at.
			return attempt.ReconcileOutput{Note: "route " + in.Route + " keeps no provider record, and this worker has no journal and no application reconciler"}, nil
		}
		return attempt.ReconcileOutput{}, ErrNoReconciler
	}
	out, err := a.Reconciler.Reconcile(ctx, in)
	if err != nil {
		return attempt.ReconcileOutput{}, fmt.Errorf("durallm: reconciler for %s attempt %d: %w", in.ActionRef, in.Attempt, err)
	}
	out.By, out.JournalState, out.ProviderRecord = attempt.ByReconciler, builtin.JournalState, builtin.ProviderRecord
	if out.Verdict == attempt.VerdictNone {
		// The person who decides next reads why nothing could tell.
		out.Note = joinNotes(builtin.Note, out.Note)
	}
	return out, nil
}

// keepsProviderRecords reports whether any route keeps a provider record.
func (a *Activities) keepsProviderRecords() bool {
	for _, r := range a.Routes {
		if r.ProviderRecord != "" {
			return true
		}
	}
	return false
}

// joinNotes joins the notes of the reconcilers asked in turn.
func joinNotes(notes ...string) string {
	var kept []string
	for _, n := range notes {
		if n != "" {
			kept = append(kept, n)
		}
	}
	return strings.Join(kept, "; then ")
}

// journalPoll is how often the built-in reconciler looks again at an
// attempt that may still end on a live worker; journalEndGrace is how long
// past the attempt's deadline it waits for the end record the worker
// writes right after the exchange ends.
// A Sent entry unrenewed for as long as its writer said its next renewal
// may take (journal.Entry.Renewal; a lease plus renewalBound leases for an
// entry that does not say) counts as its worker's loss.
const (
	journalPoll     = 250 * time.Millisecond
	journalEndGrace = 3 * time.Second
)

// reconcileHeartbeatEvery is how often Reconcile heartbeats while it
// runs: well inside the workflow's heartbeat timeout for it (20 s).
const reconcileHeartbeatEvery = 2 * time.Second

// journalReadTimeout bounds each of the built-in reconciler's reads of the
// journal: a read past it (a half-open PostgreSQL connection, a table
// lock, a stalled disk) leaves the journal unreadable and the reconciler
// goes on to the next source, instead of waiting for it until its own
// deadline.
const journalReadTimeout = 5 * time.Second

// ErrReadTimedOut is returned (wrapped, with the context's error) for a
// journal read that did not finish within journalReadTimeout.
var ErrReadTimedOut = errors.New("durallm: the journal did not answer in time")

func (a *Activities) journalReadBound() time.Duration {
	if a.journalRead > 0 {
		return a.journalRead
	}
	return journalReadTimeout
}

// lookUpJournal is Journal.Lookup bounded by journalReadTimeout (and ctx),
// counted among the worker's abandoned operations while a read it stopped
// waiting for has not returned (Activities.bounded).
func (a *Activities) lookUpJournal(ctx context.Context, attemptID string) (journal.Entry, bool, error) {
	var res struct {
		e  journal.Entry
		ok bool
	}
	err := a.bounded(ctx, time.Now().Add(a.journalReadBound()), false, ErrReadTimedOut, func(ctx context.Context) error {
		e, ok, err := a.Journal.Lookup(ctx, attemptID)
		res.e, res.ok = e, ok
		return err
	})
	if err != nil {
		return journal.Entry{}, false, err
	}
	return res.e, res.ok, nil
}

func (a *Activities) journalLease() time.Duration {
	if a.lease > 0 {
		return a.lease
	}
	return journalLease
}

// reconcileFromJournal is the built-in reconciler. Unsettled, out says
// in its Note and JournalState what the journal knew. It fails only when
// ctx ended (cutShort).
func (a *Activities) reconcileFromJournal(ctx context.Context, in attempt.ReconcileInput) (out attempt.ReconcileOutput, settled bool, err error) {
	unsettled := func(state, note string) (attempt.ReconcileOutput, bool, error) {
		return attempt.ReconcileOutput{JournalState: state, Note: note}, false, nil
	}
	e, ok, err := a.lookUpJournal(ctx, in.AttemptID)
	// A Sent entry's worker renews it while the exchange runs: the wait
	// goes on while it does, judged on this worker's own observation of
	// the entry (sentWait), whatever the writer's clock says.
	var w sentWait
	var why sentWaitEnd
	for err == nil && ok && e.State == journal.Sent {
		w.see(e, time.Now())
		if why = a.whyNotWait(ctx, w, time.Now()); why != "" {
			break
		}
		if activity.IsActivity(ctx) {
			activity.RecordHeartbeat(ctx, "waiting for attempt "+in.AttemptID+" to end on its worker")
		}
		select {
		case <-ctx.Done():
			return attempt.ReconcileOutput{}, false, cutShort(ctx, in)
		case <-time.After(journalPoll):
		}
		e, ok, err = a.lookUpJournal(ctx, in.AttemptID)
	}
	switch {
	case err != nil && ctx.Err() != nil:
		// A read that failed because the wait was cut short proves
		// nothing about the journal.
		return attempt.ReconcileOutput{}, false, cutShort(ctx, in)
	case err != nil:
		a.logger().Warn("attempt journal unavailable: the built-in reconciler cannot tell", "attempt_id", in.AttemptID, "error", err)
		a.Telemetry.JournalFailed(ctx)
		note := "the journal could not be read"
		switch {
		case errors.Is(err, ErrReadTimedOut):
			note = "the journal did not answer within " + a.journalReadBound().String() + ": it was passed over"
		case errors.Is(err, ErrJournalStuck):
			note = "the journal is stuck (reads and writes this worker stopped waiting for have not returned): it was passed over"
		}
		if w.changed.IsZero() {
			return unsettled("unreadable", note)
		}
		return unsettled("unreadable", note+" (it last held the request sent, written at "+w.last.At.UTC().Format(time.RFC3339Nano)+")")
	case !ok:
		return unsettled("none", "the journal holds no entry for this attempt")
	}
	at := e.At.UTC().Format(time.RFC3339Nano)
	switch e.State {
	case journal.Received:
		if e.Response == nil {
			return unsettled(string(e.State), "the journal's received entry holds no response")
		}
		out = attempt.ReconcileOutput{Verdict: attempt.VerdictCompleted, Response: e.Response, By: attempt.ByJournal, JournalState: string(e.State),
			Note: "a worker received the response at " + at + " and journaled it before its report was lost"}
		a.storeLargeVerdict(ctx, in.ActionRef, &out)
		return out, true, nil
	case journal.NotProcessed:
		return attempt.ReconcileOutput{Verdict: attempt.VerdictNotExecuted, By: attempt.ByJournal, JournalState: string(e.State),
			Note: "the worker proved at " + at + " that the provider did not process the request (" + string(e.Class) + ": " + e.Reason + ")"}, true, nil
	case journal.Sent:
		switch {
		case why == sentStoppedRenewing:
			return unsettled(string(e.State), "the request left and its worker stopped renewing the entry (last written at "+at+") with no end journaled: it was lost mid-request")
		case why == sentOutOfTime && w.renewals > 0:
			return unsettled(string(e.State), "the request left and its worker still renews the entry (last written at "+at+"), but the attempt had not ended when this reconciler's own time ran out")
		case why == sentOutOfTime:
			return unsettled(string(e.State), "the request left and no end was journaled (the entry was last written at "+at+") when this reconciler's own time ran out")
		default:
			return unsettled(string(e.State), "the request left and the attempt's deadline passed with no end journaled (the entry was last written at "+at+")")
		}
	default:
		return unsettled(string(e.State), "the exchange ended unanswered at "+at+" ("+e.Reason+"): no proof either way")
	}
}

// cutShort is the error of a reconciler whose context ended before it
// could decide: it wraps ctx's error (so a cancellation is recorded as
// one) and its cause (a worker shutdown, say).
func cutShort(ctx context.Context, in attempt.ReconcileInput) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || cause == err {
		return fmt.Errorf("durallm: reconciling %s attempt %d was cut short: %w", in.ActionRef, in.Attempt, err)
	}
	return fmt.Errorf("durallm: reconciling %s attempt %d was cut short: %w (%w)", in.ActionRef, in.Attempt, err, cause)
}

// sentWait is what the built-in reconciler has seen of a Sent entry, on
// its own clock: the writer's clock never meets the reader's
// (docs/contract.md section 5.5).
type sentWait struct {
	last journal.Entry
	// changed is when this reader last saw the entry change (a renewal);
	// until is when, by this reader's clock, the attempt's worker gives up
	// on it: the time the entry said remained, from when it was seen.
	changed, until time.Time
	// renewals counts the changes seen after the first look.
	renewals int
}

func (w *sentWait) see(e journal.Entry, now time.Time) {
	switch {
	case w.changed.IsZero():
	case e.At.Equal(w.last.At) && e.Remaining == w.last.Remaining:
		return
	default:
		w.renewals++
	}
	w.last, w.changed, w.until = e, now, now.Add(remaining(e))
}

// remaining is how long the entry's worker still gave its attempt when it
// wrote the entry. An entry from before Remaining says it as its Deadline
// minus its At, both on the writer's clock.
func remaining(e journal.Entry) time.Duration {
	switch {
	case e.Remaining != 0:
		return e.Remaining
	case !e.Deadline.IsZero() && !e.At.IsZero():
		return e.Deadline.Sub(e.At)
	}
	return 0
}

// patience is how long a reader waits for a Sent entry to change before
// it takes its worker for dead: what the writer said its next renewal may
// take to land (Renewal), or, for an entry that does not say, a lease
// plus the bound on a renewal write, this worker's own.
func (a *Activities) patience(e journal.Entry) time.Duration {
	if e.Renewal > 0 {
		return e.Renewal
	}
	return a.journalLease() + renewalBound*a.journalLease()
}

// sentWaitEnd says why the built-in reconciler stopped waiting for a Sent
// attempt to end.
type sentWaitEnd string

const (
	// sentPastDeadline: the attempt's deadline, and the grace for its end
	// record, passed.
	sentPastDeadline sentWaitEnd = "past_deadline"
	// sentStoppedRenewing: the entry did not change for as long as its
	// writer said a renewal may take (patience).
	sentStoppedRenewing sentWaitEnd = "stopped_renewing"
	// sentOutOfTime: this reconcile activity's own deadline is near.
	sentOutOfTime sentWaitEnd = "out_of_time"
)

// whyNotWait says why a Sent attempt can no longer end on a live worker
// as far as this reconciler can wait, or "" while it may.
func (a *Activities) whyNotWait(ctx context.Context, w sentWait, now time.Time) sentWaitEnd {
	switch {
	case !now.Before(w.until.Add(journalEndGrace)):
		return sentPastDeadline
	case now.Sub(w.changed) >= a.patience(w.last):
		return sentStoppedRenewing
	}
	if d, ok := ctx.Deadline(); ok && !now.Before(d.Add(-time.Second)) {
		return sentOutOfTime
	}
	return ""
}

// storeLargeVerdict keeps a journaled response too large for history in
// the result store, as storeLarge does for an attempt's.
func (a *Activities) storeLargeVerdict(ctx context.Context, actionRef string, out *attempt.ReconcileOutput) {
	o := attempt.Outcome{Response: out.Response}
	a.storeLarge(ctx, actionRef, &o)
	out.Response, out.ResultRef = o.Response, o.ResponseRef
}
