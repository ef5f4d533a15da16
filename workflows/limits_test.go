package workflows

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/durallm/durallm/activities"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/fleetlimit"
	"github.com/durallm/durallm/providers/routes"
)

// limitedA runs with route a under fleet-wide limits on the worker.
func limitedA(t *testing.T) func(*activities.Activities) {
	return func(a *activities.Activities) {
		a.Limits = fleetlimit.New(fleetlimit.Options{Routes: map[string]routes.Limits{"a": {RequestsPerMinute: 60}}})
		t.Cleanup(a.Limits.Close)
	}
}

// noRoom is an attempt its route's limits had no room for, expecting
// room in in.
func noRoom(in time.Duration) step {
	return step{f: func(_ context.Context, ai attempt.Input) (attempt.Outcome, error) {
		return classified(ai, func(e *evidence.Evidence) {
			e.ConnRef, e.RequestSent, e.StreamID = "", false, 0
			e.Capacity = &evidence.Capacity{Wait: time.Millisecond, Limit: "requests", NoRoom: true, In: in}
		}), nil
	}}
}

// An attempt on a route with limits may wait for room for what the
// deadline leaves beyond its own timeout, and its activity's timeout
// covers that wait; an attempt on a route without limits may not wait.
func TestAnAttemptOnALimitedRouteMayWaitWhatTheDeadlineLeaves(t *testing.T) {
	r := newRunWith(t, limitedA(t), modelGone, ok) // straight to b
	in := input("a", "b")
	in.Deadline, in.AttemptTimeout = 5*time.Minute, time.Minute
	res := r.exec(in)
	if len(r.calls) != 2 {
		t.Fatalf("%d attempts", len(r.calls))
	}
	if got := r.calls[0].CapacityWait; got != 4*time.Minute {
		t.Fatalf("the limited route's attempt may wait %v, want the 4m the deadline leaves beyond its 1m timeout", got)
	}
	if got := r.calls[1].CapacityWait; got != 0 {
		t.Fatalf("the unlimited route's attempt may wait %v", got)
	}
	first := res.Attempts[0]
	if !strings.Contains(first.Summary, "may wait 4m0s for room") || strings.Contains(res.Attempts[1].Summary, "may wait") {
		t.Fatalf("summaries %q, %q", first.Summary, res.Attempts[1].Summary)
	}
	if got := first.Deadline.Sub(first.Scheduled); got < 5*time.Minute {
		t.Fatalf("the attempt's activity may run %v from its scheduling, less than its wait and its timeout", got)
	}
}

// No room before the deadline is not a provider failure: it falls back
// at once to a route that may have room, with no backoff.
func TestNoRoomBeforeTheDeadlineFallsBackAtOnce(t *testing.T) {
	r := newRunWith(t, limitedA(t), noRoom(time.Hour), ok)
	res := r.exec(input("a", "b"))
	if res.State != StateCompleted || len(res.Attempts) != 2 || res.Attempts[1].Route != "b" {
		t.Fatalf("state %s, attempts %+v", res.State, res.Attempts)
	}
	if c := res.Attempts[0].Classification; c.Class != evidence.Unsent || c.Reason != "fleet_limit_requests" || res.Attempts[0].HealthMoved {
		t.Fatalf("first attempt %+v, health moved %v", c, res.Attempts[0].HealthMoved)
	}
	if r.times[1].Sub(r.times[0]) != 0 {
		t.Fatalf("the fallback waited %v", r.times[1].Sub(r.times[0]))
	}
}

// With room expected before the deadline and nowhere else to go, the
// next attempt waits until then on the same route.
func TestNoRoomYetWaitsForTheRoomOnTheSameRoute(t *testing.T) {
	r := newRunWith(t, limitedA(t), noRoom(20*time.Second), ok)
	res := r.exec(input("a"))
	if res.State != StateCompleted || len(res.Attempts) != 2 || res.Attempts[1].Route != "a" {
		t.Fatalf("state %s, attempts %+v", res.State, res.Attempts)
	}
	if got := r.times[1].Sub(r.times[0]); got < 20*time.Second {
		t.Fatalf("the retry came after %v, before the limit expected room", got)
	}
}
