package activities

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.temporal.io/sdk/activity"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers/exchange"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/recovery"
)

// The provider record lookup's own budget and pace (docs/contract.md
// section 5.6): each lookup is one GET, bounded by recordLookupTimeout;
// recordLookupFailures failed ones end the search (a throttled one is not
// a failure, and the next waits at least its Retry-After); between
// lookups that find nothing it backs off from recordPollFirst, doubling,
// to recordPollMax. A lookup is a read, so trying it again is safe.
const (
	recordLookupTimeout  = 10 * time.Second
	recordLookupFailures = 3
	recordPollFirst      = 500 * time.Millisecond
	recordPollMax        = 5 * time.Second
)

// recordSearch is one search of a provider's record, for its note.
type recordSearch struct {
	lookups, failures int
	lastFailure       string
	// throttled counts the lookups the provider throttled, which are not
	// failures; listed says one lookup had a list for an answer.
	throttled int
	listed    bool
	// refused: the provider refused the listing itself.
	refused   bool
	unusable  *exchange.StoredCompletion
	outOfTime bool
}

// reconcileFromProviderRecord is the built-in reconciler's second source:
// the stored completions of a route that keeps them (ProviderRecord). A
// completion carrying the attempt's id settles it as completed with the
// stored answer, by the provider; with several (the request went out
// more than once), the first settles it and the others are noted and
// counted. Finding none is never proof of "not executed": the store may
// lag, and a generation cut off at the provider may never be stored. So
// it looks again, with backoff, until the route's settle window has
// passed after the attempt's deadline (in.Remaining, on this worker's own
// clock), then leaves the attempt to the next reconciler, saying so in
// its note. It fails only when ctx ended (cutShort).
func (a *Activities) reconcileFromProviderRecord(ctx context.Context, in attempt.ReconcileInput, route routes.Route) (attempt.ReconcileOutput, bool, error) {
	route = route.WithDefaults()
	start := time.Now()
	until := start.Add(max(0, in.Remaining) + route.ProviderRecordSettle)
	if d, ok := ctx.Deadline(); ok && d.Add(-a.recordLookupBound()-time.Second).Before(until) {
		// The reconcilers after this one, and the report, need their time.
		until = d.Add(-a.recordLookupBound() - time.Second)
	}
	var s recordSearch
	wait := recordPollFirst
	for {
		s.lookups++
		f, class, timedOut, err := a.lookUpRecord(ctx, in, route, s.lookups)
		if ctx.Err() != nil {
			return attempt.ReconcileOutput{}, false, cutShort(ctx, in)
		}
		pause := wait
		switch {
		case err == nil && class.Class == evidence.Completed:
			s.listed = true
			if out, ok := a.settledByRecord(ctx, in, route, f); ok {
				return out, true, nil
			}
			if len(f.Completions) > 0 {
				s.unusable = &f.Completions[0]
			}
		case class.Class == evidence.Throttled:
			// The provider is busy, not failing: no failure is spent, and
			// the next lookup waits at least what it asked.
			s.throttled++
			pause = max(wait, class.RetryAfter)
			if !time.Now().Add(pause).Before(until) {
				s.outOfTime = until.Before(start.Add(max(0, in.Remaining) + route.ProviderRecordSettle))
				return a.recordUnsettled(ctx, route, s, time.Since(start)), false, nil
			}
		case lookupCannotSucceed(class.Class):
			s.failures, s.lastFailure, s.refused = s.failures+1, a.failureOf(class, err, timedOut), true
			return a.recordUnsettled(ctx, route, s, time.Since(start)), false, nil
		default:
			s.failures, s.lastFailure = s.failures+1, a.failureOf(class, err, timedOut)
			if s.failures >= recordLookupFailures {
				return a.recordUnsettled(ctx, route, s, time.Since(start)), false, nil
			}
		}
		now := time.Now()
		if !now.Before(until) {
			s.outOfTime = until.Before(start.Add(max(0, in.Remaining) + route.ProviderRecordSettle))
			return a.recordUnsettled(ctx, route, s, time.Since(start)), false, nil
		}
		if activity.IsActivity(ctx) {
			activity.RecordHeartbeat(ctx, "looking for attempt "+in.AttemptID+" in the provider's record")
		}
		select {
		case <-ctx.Done():
			return attempt.ReconcileOutput{}, false, cutShort(ctx, in)
		case <-time.After(min(pause, until.Sub(now))):
		}
		wait = min(2*wait, recordPollMax)
	}
}

// lookUpRecord makes lookup n: one GET through the engine, as an
// attempt of its own (its id is the attempt's with "-record-n", so it is
// never counted as the attempt), classified by the engine like any.
// timedOut says its own bound (recordLookupTimeout) ended it.
func (a *Activities) lookUpRecord(ctx context.Context, in attempt.ReconcileInput, route routes.Route, n int) (f exchange.Found, class evidence.Classification, timedOut bool, err error) {
	lctx, cancel := context.WithTimeoutCause(ctx, a.recordLookupBound(), recovery.ErrTimedOut)
	defer cancel()
	att := recovery.NewAttempt(recovery.Spec{
		ActionRef: in.ActionRef, Attempt: in.Attempt, AttemptID: in.AttemptID + "-record-" + strconv.Itoa(n),
		Route: route.Name, Provider: route.Kind, Model: route.Model,
		Intermediary: route.Intermediary, HonoursIdempotencyKey: route.HonoursIdempotencyKey,
		// Not an attempt of the action: no llm.attempt event.
		DeferEvent: true,
	})
	engine := a.Engine
	if route.InsecureSkipVerify && a.InsecureEngine != nil {
		engine = a.InsecureEngine
	}
	f, err = exchange.FindStored(recovery.WithAttempt(lctx, att), engine, route, in.AttemptID)
	_, class = att.Finish(f.Signal)
	return f, class, ctx.Err() == nil && errors.Is(context.Cause(lctx), recovery.ErrTimedOut), err
}

func (a *Activities) recordLookupBound() time.Duration {
	if a.recordLookup > 0 {
		return a.recordLookup
	}
	return recordLookupTimeout
}

// lookupCannotSucceed says a failed lookup would fail the same way again:
// the provider or the route refuses the listing itself.
func lookupCannotSucceed(c evidence.Class) bool {
	switch c {
	case evidence.Rejected, evidence.IncompatibleRoute, evidence.ContentFiltered, evidence.MisdirectedRepeated:
		return true
	}
	return false
}

// failureOf names a failed lookup by its class and reason (and status),
// never by what the body said; one its own bound ended says so.
func (a *Activities) failureOf(c evidence.Classification, err error, timedOut bool) string {
	why := string(c.Class) + " (" + c.Reason + ")"
	switch {
	case c.Class == evidence.Completed && err != nil:
		why = "an answer that is not a list of stored completions"
	case timedOut:
		why = "the provider's record did not answer within " + a.recordLookupBound().String() + ": " + why
	}
	return why
}

// settledByRecord settles the attempt from the first usable stored
// completion, noting and counting the others: more than one means the
// request was executed more than once.
func (a *Activities) settledByRecord(ctx context.Context, in attempt.ReconcileInput, route routes.Route, f exchange.Found) (attempt.ReconcileOutput, bool) {
	first := -1
	for i, c := range f.Completions {
		if c.Usable {
			first = i
			break
		}
	}
	if first < 0 {
		return attempt.ReconcileOutput{}, false
	}
	c := f.Completions[first]
	note := "the provider's record holds the answer: stored completion " + c.Response.ID
	if !c.Created.IsZero() {
		note += " (created " + c.Created.Format(time.RFC3339) + ")"
	}
	dups := len(f.Completions) - 1
	if dups > 0 {
		var others []string
		for i, o := range f.Completions {
			if i != first {
				others = append(others, o.Response.ID)
			}
		}
		more := ""
		if f.More {
			more = " and more"
		}
		note += fmt.Sprintf("; %d more stored completions%s carry this attempt's id (%s): the request was executed more than once on its way", dups, more, strings.Join(others, ", "))
		a.logger().Warn("a provider's record shows an attempt executed more than once", "attempt_id", in.AttemptID, "route", route.Name, "duplicates", dups, "more", f.More)
	}
	a.Telemetry.ProviderRecordLookup(ctx, route.Name, attempt.ProviderRecordFound, dups)
	r := c.Response
	out := attempt.ReconcileOutput{Verdict: attempt.VerdictCompleted, Response: &r, By: attempt.ByProvider, ProviderRecord: attempt.ProviderRecordFound, Note: note}
	a.storeLargeVerdict(ctx, in.ActionRef, &out)
	return out, true
}

// recordUnsettled is what a search that settled nothing says.
func (a *Activities) recordUnsettled(ctx context.Context, route routes.Route, s recordSearch, took time.Duration) attempt.ReconcileOutput {
	out := attempt.ReconcileOutput{By: attempt.ByProvider}
	looked := fmt.Sprintf("%d lookups over %s", s.lookups, took.Round(100*time.Millisecond))
	if s.failures > 0 {
		looked += fmt.Sprintf(", %d failed, the last with %s", s.failures, s.lastFailure)
	}
	if s.throttled > 0 {
		looked += fmt.Sprintf(", %d throttled by the provider", s.throttled)
	}
	switch {
	case s.unusable != nil:
		out.ProviderRecord = attempt.ProviderRecordUnusable
		out.Note = "the provider's record holds stored completion " + s.unusable.Response.ID + " for this attempt, with no usable answer (" + looked + "): the request was executed"
	case s.refused || s.failures >= recordLookupFailures:
		out.ProviderRecord = attempt.ProviderRecordUnreadable
		out.Note = fmt.Sprintf("the provider's record could not be read: %d of %d lookups failed, the last with %s", s.failures, s.lookups, s.lastFailure)
	case !s.listed && s.throttled > 0:
		// Throttled until the window ended: nothing was read.
		out.ProviderRecord = attempt.ProviderRecordUnreadable
		out.Note = "the provider's record could not be read: the provider throttled the lookups (" + looked + ")"
	default:
		out.ProviderRecord = attempt.ProviderRecordNotFound
		out.Note = "the provider's record lookup found nothing for this attempt (" + looked + ", " + route.ProviderRecordSettle.String() + " past the attempt's deadline"
		if s.outOfTime {
			out.Note = "the provider's record lookup found nothing for this attempt (" + looked + ", until this reconciler's own time ran out"
		}
		out.Note += "): not proof that the provider did not execute it"
	}
	a.Telemetry.ProviderRecordLookup(ctx, route.Name, out.ProviderRecord, 0)
	return out
}
