package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm/activities"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/internal/syncbuf"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
)

// These tests run LLMAction in virtual time with CallModel scripted per
// attempt. The script's outcomes are built from evidence and classified by
// the real evidence.Classify, so each row is the workflow's view of the
// contract's row.

var testRoutes = map[string]routes.Route{
	"a":       {Name: "a", Kind: "openai", Model: "model-a", Capabilities: providers.Capabilities{Streaming: true}},
	"b":       {Name: "b", Kind: "openai", Model: "model-b", Capabilities: providers.Capabilities{Tools: true, Streaming: true}},
	"c":       {Name: "c", Kind: "openai", Model: "model-c", Capabilities: providers.Capabilities{Tools: true}},
	"idem":    {Name: "idem", Kind: "openai", Model: "model-i", HonoursIdempotencyKey: true, IdempotencyWindow: time.Hour},
	"ctx8k":   {Name: "ctx8k", Kind: "openai", Model: "model-8k", Capabilities: providers.Capabilities{ContextTokens: 8000}},
	"ctx8k-b": {Name: "ctx8k-b", Kind: "openai", Model: "model-8k-b", Capabilities: providers.Capabilities{ContextTokens: 8000}},
	"ctx128k": {Name: "ctx128k", Kind: "openai", Model: "model-128k", Capabilities: providers.Capabilities{ContextTokens: 128000}},
	"no-tool": {Name: "no-tool", Kind: "openai", Model: "model-n"},
}

// step answers one CallModel call, after a delay on the workflow's clock.
type step struct {
	after time.Duration
	f     func(ctx context.Context, in attempt.Input) (attempt.Outcome, error)
}

type run struct {
	t      *testing.T
	env    *testsuite.TestWorkflowEnvironment
	mu     sync.Mutex
	calls  []attempt.Input
	times  []time.Time
	events *syncbuf.Buffer // the llm.attempt events, as JSON lines
	acts   *activities.Activities
}

func newRun(t *testing.T, steps ...step) *run { return newRunWith(t, nil, steps...) }

// newRunWith is newRun with the worker's Activities adjusted first (a
// journal, say, which makes the plan run the built-in reconciler).
func newRunWith(t *testing.T, adjust func(*activities.Activities), steps ...step) *run {
	t.Helper()
	var s testsuite.WorkflowTestSuite
	s.SetLogger(log.NewStructuredLogger(slog.New(slog.DiscardHandler)))
	env := s.NewTestWorkflowEnvironment()
	env.SetTestTimeout(30 * time.Second)
	events := &syncbuf.Buffer{}
	env.RegisterWorkflowWithOptions(New(Options{Events: slog.New(slog.NewJSONHandler(events, nil))}), workflow.RegisterOptions{Name: WorkflowName})
	acts := &activities.Activities{Routes: testRoutes}
	if adjust != nil {
		adjust(acts)
	}
	env.RegisterActivity(acts)
	r := &run{t: t, env: env, events: events, acts: acts}
	env.SetOnActivityStartedListener(func(info *activity.Info, _ context.Context, args converter.EncodedValues) {
		if info.ActivityType.Name != "CallModel" {
			return
		}
		var in attempt.Input
		if err := args.Get(&in); err != nil {
			t.Error(err)
		}
		r.mu.Lock()
		r.calls = append(r.calls, in)
		r.times = append(r.times, env.Now())
		r.mu.Unlock()
	})
	for _, st := range steps {
		c := env.OnActivity(acts.CallModel, mock.Anything, mock.Anything).Return(st.f).Once()
		if st.after > 0 {
			c.After(st.after)
		}
	}
	return r
}

func (r *run) exec(in ActionInput) ActionResult {
	r.t.Helper()
	r.env.ExecuteWorkflow(WorkflowName, in)
	if !r.env.IsWorkflowCompleted() {
		r.t.Fatal("workflow did not complete")
	}
	if err := r.env.GetWorkflowError(); err != nil {
		r.t.Fatalf("workflow error: %v", err)
	}
	var res ActionResult
	if err := r.env.GetWorkflowResult(&res); err != nil {
		r.t.Fatal(err)
	}
	return res
}

func (r *run) attemptsStarted() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

func input(routes ...string) ActionInput {
	return ActionInput{
		Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hello")}},
		Routes:  routes,
	}
}

// Outcomes built from evidence.

func classified(in attempt.Input, f func(*evidence.Evidence)) attempt.Outcome {
	ev := evidence.Evidence{ActionRef: in.ActionRef, Attempt: in.Attempt, AttemptID: in.AttemptID, Route: in.Route,
		ConnRef: "p-c" + string(rune('0'+in.Attempt)), RequestSent: true, StreamID: 3}
	f(&ev)
	return attempt.Outcome{Evidence: ev, Classification: evidence.Classify(ev)}
}

func done(in attempt.Input) attempt.Outcome {
	o := classified(in, func(e *evidence.Evidence) { e.Status = 200; e.ContentStarted = true })
	o.Response = &providers.Response{Text: "answer from " + in.Route}
	return o
}

var ok = step{f: func(_ context.Context, in attempt.Input) (attempt.Outcome, error) { return done(in), nil }}

func with(f func(*evidence.Evidence)) step {
	return step{f: func(_ context.Context, in attempt.Input) (attempt.Outcome, error) {
		return classified(in, f), nil
	}}
}

var (
	goAwayAbove = with(func(e *evidence.Evidence) { e.GoAway = &evidence.GoAway{LastStreamID: 1} })
	goAwayAt    = with(func(e *evidence.Evidence) { e.GoAway = &evidence.GoAway{LastStreamID: 3} })
	goAwayProto = with(func(e *evidence.Evidence) {
		e.GoAway = &evidence.GoAway{LastStreamID: 1, Code: evidence.CodeProtocolError}
	})
	connLost      = with(func(e *evidence.Evidence) { e.ConnClosed = true })
	unsent        = with(func(e *evidence.Evidence) { e.RequestSent, e.StreamID, e.DialFailed = false, 0, true })
	misdirected   = with(func(e *evidence.Evidence) { e.Status = 421 })
	misdirected2  = with(func(e *evidence.Evidence) { e.Status = 421; e.AfterMisdirected = true })
	upstream500   = with(func(e *evidence.Evidence) { e.Status = 500 })
	rejected400   = with(func(e *evidence.Evidence) { e.Status = 400 })
	emptyResponse = with(func(e *evidence.Evidence) { e.Status = 200; e.Signal = evidence.SignalEmptyResponse })
	modelGone     = with(func(e *evidence.Evidence) { e.Status = 404; e.Signal = evidence.SignalModelNotFound })
	filtered      = with(func(e *evidence.Evidence) { e.Status = 400; e.Signal = evidence.SignalContentFiltered })
)

func throttled(retryAfter time.Duration) step {
	return with(func(e *evidence.Evidence) { e.Status = 429; e.RetryAfter = retryAfter })
}

var partial = step{f: func(_ context.Context, in attempt.Input) (attempt.Outcome, error) {
	o := classified(in, func(e *evidence.Evidence) { e.Status = 200; e.ContentStarted = true; e.BodyFailed = true })
	o.Response = &providers.Response{Text: "half an ans", Partial: true, Incomplete: "reset"}
	return o, nil
}}

// blockUntilCanceled is an attempt that runs until the workflow cancels
// it (the mock resumes a day later on the workflow's clock, by when the
// cancel has reached its context), then returns ctx.Err() wrapped, as the
// real activity does.
var blockUntilCanceled = slow(24*time.Hour, ok)

func ctxErr(ctx context.Context) error { return errors.Join(errors.New("attempt canceled"), ctx.Err()) }

func TestRowsAsTheWorkflowSeesThem(t *testing.T) {
	tests := []struct {
		name     string
		routes   []string
		steps    []step
		state    State
		outcome  string
		attempts int
		check    func(t *testing.T, r *run, res ActionResult)
	}{
		{"completed", []string{"a"}, []step{ok}, StateCompleted, "completed", 1, func(t *testing.T, r *run, res ActionResult) {
			if res.Response == nil || res.Response.Text != "answer from a" {
				t.Fatalf("response %+v", res.Response)
			}
		}},
		{"unsent: retried on the same route", []string{"a"}, []step{unsent, ok}, StateCompleted, "completed", 2, nil},
		{"refused: transport retry avoids the connection, no backoff", []string{"a", "b"}, []step{goAwayAbove, ok}, StateCompleted, "completed", 2, func(t *testing.T, r *run, res ActionResult) {
			second := r.calls[1]
			if second.Route != "a" || len(second.Avoid) != 1 || second.Avoid[0] != "p-c1" {
				t.Fatalf("second attempt %+v", second)
			}
			if !r.times[1].Equal(r.times[0]) {
				t.Fatalf("a transport retry waited %v", r.times[1].Sub(r.times[0]))
			}
			if !strings.Contains(res.Attempts[1].Summary, "fresh connection after GOAWAY last=1") {
				t.Fatalf("summary %q", res.Attempts[1].Summary)
			}
			if res.Attempts[0].HealthMoved {
				t.Fatal("a NO_ERROR drain moved provider health")
			}
		}},
		{"refused with PROTOCOL_ERROR: the route is misconfigured, fall back", []string{"a", "b"}, []step{goAwayProto, ok}, StateCompleted, "completed", 2, func(t *testing.T, r *run, res ActionResult) {
			if r.calls[1].Route != "b" {
				t.Fatalf("went to %s", r.calls[1].Route)
			}
		}},
		{"misdirected: one retry on a fresh connection", []string{"a"}, []step{misdirected, ok}, StateCompleted, "completed", 2, func(t *testing.T, r *run, res ActionResult) {
			if c := r.calls[1]; !c.FreshConnection || !c.AfterMisdirected || c.Route != "a" {
				t.Fatalf("421 retry %+v", c)
			}
		}},
		{"misdirected_repeated stops", []string{"a", "b"}, []step{misdirected, misdirected2}, StateFailed, "misdirected_repeated", 2, nil},
		{"throttled: waits Retry-After, then retries", []string{"a"}, []step{throttled(3 * time.Second), ok}, StateCompleted, "completed", 2, func(t *testing.T, r *run, res ActionResult) {
			if waited := r.times[1].Sub(r.times[0]); waited < 3*time.Second {
				t.Fatalf("waited %v, Retry-After was 3s", waited)
			}
			if res.Attempts[0].BackoffAfter < 3*time.Second || !res.Attempts[0].HealthMoved {
				t.Fatalf("record %+v", res.Attempts[0])
			}
		}},
		{"throttled: Retry-After beyond the deadline falls back at once", []string{"a", "b"}, []step{throttled(time.Hour), ok}, StateCompleted, "completed", 2, func(t *testing.T, r *run, res ActionResult) {
			if r.calls[1].Route != "b" || !r.times[1].Equal(r.times[0]) {
				t.Fatalf("second attempt on %s after %v", r.calls[1].Route, r.times[1].Sub(r.times[0]))
			}
		}},
		{"throttled: Retry-After beyond the deadline with no fallback fails", []string{"a"}, []step{throttled(time.Hour)}, StateFailed, "throttled", 1, func(t *testing.T, r *run, res ActionResult) {
			if res.Reason != "retry_after_beyond_deadline" {
				t.Fatalf("reason %s", res.Reason)
			}
		}},
		{"upstream_error: one retry on the route, then fallback", []string{"a", "b"}, []step{upstream500, upstream500, ok}, StateCompleted, "completed", 3, func(t *testing.T, r *run, res ActionResult) {
			if r.calls[1].Route != "a" || r.calls[2].Route != "b" {
				t.Fatalf("routes %s %s", r.calls[1].Route, r.calls[2].Route)
			}
		}},
		{"empty_response falls back", []string{"a", "b"}, []step{emptyResponse, ok}, StateCompleted, "completed", 2, nil},
		{"empty_response with no fallback fails", []string{"a"}, []step{emptyResponse}, StateFailed, "empty_response", 1, nil},
		{"rejected is terminal", []string{"a", "b"}, []step{rejected400}, StateRejected, "rejected", 1, func(t *testing.T, r *run, res ActionResult) {
			if res.Attempts[0].HealthMoved {
				t.Fatal("a 400 moved provider health")
			}
		}},
		{"content_filtered is terminal and does not fail over", []string{"a", "b"}, []step{filtered}, StateRejected, "content_filtered", 1, nil},
		{"incompatible_route falls back", []string{"a", "b"}, []step{modelGone, ok}, StateCompleted, "completed", 2, nil},
		{"committed_partial ends completed_partial with the text kept", []string{"a", "b"}, []step{partial}, StateCompletedPartial, "committed_partial", 1, func(t *testing.T, r *run, res ActionResult) {
			if res.Response == nil || !res.Response.Partial || res.Response.Text != "half an ans" {
				t.Fatalf("response %+v", res.Response)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRun(t, tt.steps...)
			in := input(tt.routes...)
			in.Deadline = 10 * time.Minute
			res := r.exec(in)
			if res.State != tt.state || res.Outcome != tt.outcome || r.attemptsStarted() != tt.attempts || res.Used != tt.attempts {
				t.Fatalf("state %s outcome %s (%s), %d attempts (used %d); want %s %s %d\nnotes %v", res.State, res.Outcome, res.Reason, r.attemptsStarted(), res.Used, tt.state, tt.outcome, tt.attempts, res.Notes)
			}
			if tt.check != nil {
				tt.check(t, r, res)
			}
		})
	}
}

func TestOneBudgetAcrossTransportRetry421RetryAndFallback(t *testing.T) {
	r := newRun(t, goAwayAbove, misdirected, emptyResponse, ok)
	in := input("a", "b")
	in.MaxAttempts = 3
	res := r.exec(in)
	if res.State != StateFailed || res.Reason != "budget_exhausted" || r.attemptsStarted() != 3 {
		t.Fatalf("state %s reason %s attempts %d", res.State, res.Reason, r.attemptsStarted())
	}
	whys := []string{res.Attempts[0].Why, res.Attempts[1].Why, res.Attempts[2].Why}
	if whys[1] != "transport retry" || whys[2] != "421 retry" {
		t.Fatalf("whys %v", whys)
	}
}

func TestNoBackoffWhenTheBudgetIsSpent(t *testing.T) {
	r := newRun(t, throttled(time.Minute))
	in := input("a")
	in.MaxAttempts = 1
	start := r.env.Now()
	res := r.exec(in)
	if res.State != StateFailed || res.Reason != "budget_exhausted" || res.Attempts[0].BackoffAfter != 0 {
		t.Fatalf("state %s reason %s backoff %v", res.State, res.Reason, res.Attempts[0].BackoffAfter)
	}
	if waited := r.env.Now().Sub(start); waited >= time.Minute {
		t.Fatalf("waited %v for an attempt it could not make", waited)
	}
}

func TestFallbackOnlyToRoutesWithTheNeededCapabilities(t *testing.T) {
	r := newRun(t, emptyResponse, ok)
	in := input("no-tool", "b", "a", "c")
	in.Needs = providers.Capabilities{Tools: true}
	res := r.exec(in)
	if res.State != StateCompleted || r.calls[0].Route != "b" || r.calls[1].Route != "c" {
		t.Fatalf("state %s routes %s, %s", res.State, r.calls[0].Route, r.calls[1].Route)
	}
	var skipped []string
	for _, n := range res.Notes {
		if strings.Contains(n.What, "skipped") {
			skipped = append(skipped, n.What)
		}
	}
	if len(skipped) != 2 || !strings.Contains(skipped[0], "no-tool") || !strings.Contains(skipped[0], "tools") {
		t.Fatalf("skip notes %v", skipped)
	}
	if !strings.Contains(res.Attempts[1].Why, "fallback") || !strings.Contains(res.Attempts[1].Summary, "after empty_response on b") {
		t.Fatalf("fallback record %+v", res.Attempts[1])
	}
}

func TestNoRouteSatisfiesTheNeeds(t *testing.T) {
	r := newRun(t)
	in := input("a", "unknown")
	in.Needs = providers.Capabilities{Vision: true}
	res := r.exec(in)
	if res.State != StateFailed || res.Outcome != "no_route" || r.attemptsStarted() != 0 {
		t.Fatalf("state %s outcome %s attempts %d", res.State, res.Outcome, r.attemptsStarted())
	}
}

func TestInvalidInputFailsFastNamingTheField(t *testing.T) {
	tests := []struct {
		name  string
		in    func(*ActionInput)
		field string
	}{
		{"no routes", func(in *ActionInput) { in.Routes = nil }, "routes"},
		{"no messages", func(in *ActionInput) { in.Request.Messages = nil }, "request"},
		{"negative budget", func(in *ActionInput) { in.MaxAttempts = -1 }, "max_attempts"},
		{"attempt timeout past the deadline", func(in *ActionInput) { in.Deadline = time.Second; in.AttemptTimeout = time.Minute }, "attempt_timeout"},
		{"unknown replay policy", func(in *ActionInput) { in.ReplayPolicy = "sometimes" }, "replay_policy"},
		{"duplicate route", func(in *ActionInput) { in.Routes = []string{"a", "a"} }, "routes[1]"},
		{"an idempotency key the client cannot encode", func(in *ActionInput) { in.IdempotencyKey = "order-42\r\nX-Injected: 1" }, "idempotency_key"},
		{"an idempotency key longer than providers accept", func(in *ActionInput) { in.IdempotencyKey = strings.Repeat("k", 300) }, "idempotency_key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRun(t)
			in := input("a")
			tt.in(&in)
			r.env.ExecuteWorkflow(WorkflowName, in)
			err := r.env.GetWorkflowError()
			var app *temporal.ApplicationError
			if !errors.As(err, &app) || app.Type() != InvalidInputType || !app.NonRetryable() || !strings.Contains(app.Error(), tt.field) {
				t.Fatalf("error %v, want non-retryable %s naming %q", err, InvalidInputType, tt.field)
			}
			if r.attemptsStarted() != 0 {
				t.Fatal("an invalid action dispatched an attempt")
			}
		})
	}
}

// Reconciliation.

func (r *run) afterAwaiting(d time.Duration, f func()) {
	r.env.RegisterDelayedCallback(f, d)
}

// status queries the running action's status.
func (r *run) status() Status {
	var st Status
	v, err := r.env.QueryWorkflow(QueryStatus)
	if err == nil {
		err = v.Get(&st)
	}
	if err != nil {
		r.t.Error(err)
	}
	return st
}

// updateResult is filled in when the test environment has processed an
// Update, which happens after the callback that sent it returns.
type updateResult struct {
	accepted, rejected bool
	err                error
}

func (r *run) update(req ReconcileRequest) *updateResult {
	res := &updateResult{}
	r.env.UpdateWorkflow(UpdateReconcile, "u-"+string(req.Verdict)+"-"+time.Now().String(), &testsuite.TestUpdateCallback{
		OnAccept: func() { res.accepted = true },
		OnReject: func(err error) { res.rejected, res.err = true, err },
	}, req)
	return res
}

func TestReconcileVerdicts(t *testing.T) {
	tests := []struct {
		name     string
		steps    []step
		req      ReconcileRequest
		state    State
		attempts int
	}{
		{"completed with a result: reconciled", []step{connLost}, ReconcileRequest{Attempt: 1, Verdict: attempt.VerdictCompleted, Response: &providers.Response{Text: "stored answer"}, By: "ops"}, StateReconciled, 1},
		{"not_executed: the normal retry path", []step{goAwayAt, ok}, ReconcileRequest{Attempt: 1, Verdict: attempt.VerdictNotExecuted}, StateCompleted, 2},
		{"allow_replay: another attempt despite the risk", []step{connLost, ok}, ReconcileRequest{Attempt: 1, Verdict: attempt.VerdictAllowReplay}, StateCompleted, 2},
		{"abandon: indeterminate", []step{connLost}, ReconcileRequest{Attempt: 1, Verdict: attempt.VerdictAbandon}, StateIndeterminate, 1},
	}
	for _, tt := range tests {
		for _, via := range []string{"update", "signal"} {
			t.Run(tt.name+"/"+via, func(t *testing.T) {
				r := newRun(t, tt.steps...)
				var during Status
				var upd *updateResult
				var asked time.Time
				r.afterAwaiting(time.Minute, func() {
					asked = r.env.Now()
					during = r.status()
					if via == "update" {
						upd = r.update(tt.req)
					} else {
						r.env.SignalWorkflow(SignalReconcile, tt.req)
					}
				})
				res := r.exec(input("a"))
				if upd != nil && !upd.accepted {
					t.Fatalf("update not accepted: %v", upd.err)
				}
				// Since when it waits: before the question, and a minute of
				// waiting before it at most.
				if during.State != StateAwaitingReconciliation || during.AwaitingAttempt != 1 || during.AwaitingSince.After(asked) || asked.Sub(during.AwaitingSince) > time.Minute {
					t.Fatalf("while waiting: %s awaiting %d since %s (asked at %s)", during.State, during.AwaitingAttempt, during.AwaitingSince, asked)
				}
				if res.AwaitingAttempt != 0 || !res.AwaitingSince.IsZero() {
					t.Fatalf("after the verdict: awaiting %d since %s", res.AwaitingAttempt, res.AwaitingSince)
				}
				if res.State != tt.state || r.attemptsStarted() != tt.attempts {
					t.Fatalf("state %s (%s) attempts %d; want %s %d; notes %v", res.State, res.Reason, r.attemptsStarted(), tt.state, tt.attempts, res.Notes)
				}
				if tt.state == StateReconciled && (res.Response == nil || res.Response.Text != "stored answer") {
					t.Fatalf("reconciled response %+v", res.Response)
				}
			})
		}
	}
}

func TestReconcileTimeoutIsIndeterminate(t *testing.T) {
	r := newRun(t, connLost)
	in := input("a")
	in.ReconcileTimeout = time.Hour
	res := r.exec(in)
	if res.State != StateIndeterminate || res.Reason != "reconcile_timeout" || r.attemptsStarted() != 1 {
		t.Fatalf("state %s reason %s attempts %d", res.State, res.Reason, r.attemptsStarted())
	}
}

func TestRejectedUpdatesWriteNothing(t *testing.T) {
	r := newRun(t, connLost)
	bad := []ReconcileRequest{
		{Attempt: 7, Verdict: attempt.VerdictAbandon},
		{Attempt: 1, Verdict: "maybe"},
		{Attempt: 1, Verdict: attempt.VerdictCompleted},
	}
	var results []*updateResult
	var before, after Status
	query := func(into *Status) {
		v, err := r.env.QueryWorkflow(QueryStatus)
		if err != nil {
			t.Error(err)
			return
		}
		_ = v.Get(into)
	}
	r.afterAwaiting(time.Minute, func() {
		query(&before)
		for _, req := range bad {
			results = append(results, r.update(req))
		}
	})
	r.afterAwaiting(2*time.Minute, func() {
		query(&after)
		r.env.SignalWorkflow(SignalReconcile, ReconcileRequest{Attempt: 1, Verdict: attempt.VerdictAbandon})
	})
	res := r.exec(input("a"))
	want := []string{"stale attempt 7", `unknown verdict "maybe"`, "needs a response"}
	for i, w := range want {
		if i >= len(results) || !results[i].rejected || !strings.Contains(results[i].err.Error(), w) {
			t.Fatalf("update %d: %+v, want a rejection mentioning %q", i, results[i], w)
		}
	}
	if len(before.Notes) != len(after.Notes) || before.State != after.State || after.State != StateAwaitingReconciliation {
		t.Fatalf("a rejected update wrote something: %d → %d notes, %s → %s", len(before.Notes), len(after.Notes), before.State, after.State)
	}
	if res.State != StateIndeterminate {
		t.Fatalf("state %s", res.State)
	}
}

func TestUpdateInTheWrongStateIsRejected(t *testing.T) {
	r := newRun(t, slow(time.Minute, ok)) // the update arrives while the attempt is dispatching
	var u *updateResult
	r.env.RegisterDelayedCallback(func() {
		u = r.update(ReconcileRequest{Attempt: 1, Verdict: attempt.VerdictAbandon})
	}, time.Second)
	res := r.exec(input("a"))
	if u == nil || !u.rejected || !strings.Contains(u.err.Error(), "not awaiting reconciliation") {
		t.Fatalf("update %+v", u)
	}
	if res.State != StateCompleted {
		t.Fatalf("state %s", res.State)
	}
}

func TestReplayPolicyReplaysOnlyOnIdempotentRoutes(t *testing.T) {
	r := newRun(t, connLost, ok)
	in := input("idem")
	in.ReplayPolicy = ReplayIdempotent
	res := r.exec(in)
	if res.State != StateCompleted || r.attemptsStarted() != 2 || res.Attempts[1].Why != "replay" {
		t.Fatalf("state %s attempts %d", res.State, r.attemptsStarted())
	}

	r = newRun(t, connLost)
	in = input("a") // does not honour Idempotency-Key: must wait
	in.ReplayPolicy = ReplayIdempotent
	in.ReconcileTimeout = time.Minute
	res = r.exec(in)
	if res.State != StateIndeterminate || r.attemptsStarted() != 1 {
		t.Fatalf("non-idempotent route replayed: state %s attempts %d", res.State, r.attemptsStarted())
	}
}

// Cancellation race points. For each: the terminal state, attempts started
// (none after the cancel) and whether provider health moved.

func cancelSignal(origin CancelOrigin) any { return CancelRequest{Origin: origin} }

func TestCancellationRacePoints(t *testing.T) {
	tests := []struct {
		name     string
		steps    []step
		at       time.Duration // when the cancel signal arrives
		state    State
		origin   CancelOrigin
		attempts int // dispatched (the budget spent)
	}{
		{"before admission", []step{ok}, 0, StateCanceled, OriginUserStop, 0},
		{"while the attempt is queued or connecting", []step{blockUntilCanceled}, time.Millisecond, StateCanceled, OriginUserStop, 1},
		{"before response data", []step{blockUntilCanceled}, 5 * time.Second, StateCanceled, OriginClientDisconnect, 1},
		{"mid-stream", []step{blockUntilCanceled}, 30 * time.Second, StateCanceled, OriginOperatorStop, 1},
		{"during backoff", []step{throttled(time.Minute), ok}, 30 * time.Second, StateCanceled, OriginUserStop, 1},
		{"after a fallback was reserved", []step{slow(10*time.Second, emptyResponse), ok}, 5 * time.Second, StateCanceled, OriginUserStop, 1},
		{"during the fallback", []step{emptyResponse, blockUntilCanceled}, 5 * time.Second, StateCanceled, OriginUserStop, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRun(t, tt.steps...)
			origin := tt.origin
			if origin == "" {
				origin = OriginUserStop
			}
			var cancelAt time.Time
			r.env.RegisterDelayedCallback(func() {
				cancelAt = r.env.Now()
				r.env.SignalWorkflow(SignalCancel, cancelSignal(origin))
			}, tt.at)
			res := r.exec(input("a", "b"))
			if res.State != tt.state || res.Origin != tt.origin || res.Used != tt.attempts || r.attemptsStarted() > tt.attempts {
				t.Fatalf("state %s origin %s dispatched %d started %d; want %s %s %d; notes %v", res.State, res.Origin, res.Used, r.attemptsStarted(), tt.state, tt.origin, tt.attempts, res.Notes)
			}
			if res.Response != nil {
				t.Fatal("a canceled action carries a response")
			}
			for i, at := range r.times {
				if tt.state == StateCanceled && !cancelAt.IsZero() && at.After(cancelAt) {
					t.Fatalf("attempt %d started %v after the cancel", i+1, at.Sub(cancelAt))
				}
			}
			for _, a := range res.Attempts {
				if a.Classification.Class == evidence.Canceled && a.HealthMoved {
					t.Fatal("a canceled attempt moved provider health")
				}
			}
		})
	}
}

// A cancel at the very instant the response commits: exactly one terminal
// state, and it is consistent: completed with the response (and the late
// cancel noted), or canceled with none. Which one depends on whether the
// completion or the cancel is processed first; never both, never neither.
func TestCancelAtTheInstantCompletionCommits(t *testing.T) {
	r := newRun(t, step{after: 10 * time.Second, f: ok.f})
	r.env.RegisterDelayedCallback(func() { r.env.SignalWorkflow(SignalCancel, cancelSignal(OriginUserStop)) }, 10*time.Second)
	res := r.exec(input("a", "b"))
	switch res.State {
	case StateCompleted:
		if res.Response == nil || !hasNote(res, "cancel arrived as the response committed") {
			t.Fatalf("completed without the response or the note: %+v", res)
		}
	case StateCanceled:
		if res.Response != nil || res.Origin != OriginUserStop {
			t.Fatalf("canceled with a response or the wrong origin: %+v", res)
		}
	default:
		t.Fatalf("state %s", res.State)
	}
	if res.Used != 1 {
		t.Fatalf("dispatched %d attempts", res.Used)
	}
}

func hasNote(res ActionResult, s string) bool {
	for _, n := range res.Notes {
		if strings.Contains(n.What, s) {
			return true
		}
	}
	return false
}

// slow returns s's outcome after d on the workflow's clock, or the
// cancellation if the workflow canceled the attempt meanwhile.
func slow(d time.Duration, s step) step {
	return step{after: d, f: func(ctx context.Context, in attempt.Input) (attempt.Outcome, error) {
		if ctx.Err() != nil {
			return attempt.Outcome{}, ctxErr(ctx)
		}
		return s.f(ctx, in)
	}}
}

func TestTemporalCancellationIsParentCanceled(t *testing.T) {
	r := newRun(t, blockUntilCanceled)
	r.env.RegisterDelayedCallback(r.env.CancelWorkflow, time.Second)
	res := r.exec(input("a"))
	if res.State != StateCanceled || res.Origin != OriginParentCanceled || r.attemptsStarted() != 1 {
		t.Fatalf("state %s origin %s attempts %d", res.State, res.Origin, r.attemptsStarted())
	}
}

func TestOverallDeadlineCancelsTheAttempt(t *testing.T) {
	r := newRun(t, blockUntilCanceled)
	in := input("a")
	in.Deadline = time.Minute
	in.AttemptTimeout = time.Minute
	res := r.exec(in)
	if res.State != StateCanceled || res.Origin != OriginOverallDeadline || r.attemptsStarted() != 1 {
		t.Fatalf("state %s origin %s attempts %d", res.State, res.Origin, r.attemptsStarted())
	}
}

// timersOf counts the timers the workflow starts.
func (r *run) timersOf() *int {
	n := new(int)
	r.env.SetOnTimerScheduledListener(func(string, time.Duration) { *n++ })
	return n
}

// A timer for the overall deadline around every attempt would cost an
// event and a timer task each, though with the defaults (5 min deadline,
// 30 s queue, 60 s attempt) Temporal's own timeouts end the activity
// minutes before that timer could fire.
func TestAnAttemptWellInsideTheDeadlineStartsNoTimer(t *testing.T) {
	r := newRun(t, slow(10*time.Second, ok))
	timers := r.timersOf()
	if res := r.exec(input("a")); res.State != StateCompleted {
		t.Fatalf("state %s", res.State)
	}
	if *timers != 0 {
		t.Fatalf("%d timers started for an attempt Temporal ends long before the deadline", *timers)
	}
}

// An attempt whose queue and attempt timeouts reach past the deadline is
// still timed, and the deadline still ends it.
func TestAnAttemptThatCouldOutliveTheDeadlineIsTimed(t *testing.T) {
	r := newRun(t, blockUntilCanceled)
	timers := r.timersOf()
	in := input("a")
	in.Deadline = 2 * time.Minute
	in.AttemptTimeout = 100 * time.Second // + 30 s queue + 2 s grace > 2 min - the margin
	res := r.exec(in)
	if res.State != StateCanceled || res.Origin != OriginOverallDeadline || *timers != 1 {
		t.Fatalf("state %s origin %s, %d timers", res.State, res.Origin, *timers)
	}
}

// A plan from before DeadlineTimer (a history recorded then) keeps the
// timer on every attempt, so such histories replay as recorded.
func TestAPlanWithoutDeadlineTimerTimesEveryAttempt(t *testing.T) {
	r := newRunWith(t, nil, ok)
	r.env.OnActivity(r.acts.DescribeRoutes, mock.Anything, mock.Anything).Return(func(ctx context.Context, in attempt.PlanInput) (attempt.Plan, error) {
		p, err := r.acts.DescribeRoutes(ctx, in)
		p.DeadlineTimer = attempt.DeadlineTimerEveryAttempt
		return p, err
	})
	timers := r.timersOf()
	if res := r.exec(input("a")); res.State != StateCompleted || *timers != 1 {
		t.Fatalf("state %s, %d timers", res.State, *timers)
	}
}

func TestLateSignalsAreRecordedAndIgnored(t *testing.T) {
	r := newRun(t, slow(time.Minute, ok))
	r.env.RegisterDelayedCallback(func() {
		r.env.SignalWorkflow(SignalReconcile, ReconcileRequest{Attempt: 1, Verdict: attempt.VerdictAbandon})
	}, time.Second)
	res := r.exec(input("a"))
	if res.State != StateCompleted {
		t.Fatalf("state %s", res.State)
	}
	found := false
	for _, n := range res.Notes {
		found = found || strings.Contains(n.What, "reconcile signal ignored")
	}
	if !found {
		t.Fatalf("a stray reconcile was not recorded: %v", res.Notes)
	}
}

func TestActivityTimeoutsAsTheContractSays(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		class  evidence.Class
		reason string
	}{
		{"schedule-to-start: no worker took it, unsent", temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START, nil), evidence.Unsent, "no_worker_took_the_attempt"},
		{"start-to-close: ambiguous", temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_START_TO_CLOSE, nil), evidence.Ambiguous, "attempt_timeout"},
		{"heartbeat: worker died mid-attempt, ambiguous", temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_HEARTBEAT, nil, attempt.Progress{ConnRef: "p-c9", ContentStarted: false}), evidence.Ambiguous, "worker_lost_mid_attempt"},
		{"any other activity failure: ambiguous", errors.New("panic: boom"), evidence.Ambiguous, "activity_failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRun(t, step{f: func(context.Context, attempt.Input) (attempt.Outcome, error) {
				return attempt.Outcome{}, tt.err
			}})
			in := input("a")
			in.ReconcileTimeout = time.Minute
			res := r.exec(in)
			got := res.Attempts[0].Classification
			if got.Class != tt.class || got.Reason != tt.reason {
				t.Fatalf("classified %s/%s, want %s/%s", got.Class, got.Reason, tt.class, tt.reason)
			}
		})
	}
}

func TestStatusQueryMatchesTheResult(t *testing.T) {
	r := newRun(t, goAwayAbove, ok)
	res := r.exec(input("a"))
	v, err := r.env.QueryWorkflow(QueryStatus)
	if err != nil {
		t.Fatal(err)
	}
	var st Status
	if err := v.Get(&st); err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(st)
	b, _ := json.Marshal(res.Status)
	if string(a) != string(b) {
		t.Fatalf("status query differs from the result:\n%s\n%s", a, b)
	}
}

// Edge-path defects, each test named after its defect.

func fails(err error) step {
	return step{f: func(context.Context, attempt.Input) (attempt.Outcome, error) {
		return attempt.Outcome{}, err
	}}
}

func heartbeatLost(p attempt.Progress) step {
	return fails(temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_HEARTBEAT, nil, p))
}

// Automatic replay ignored the commit boundary: a worker that died after
// its last heartbeat said content_started was replayed on an idempotent
// route, and subscribers received a second answer.
func TestAutomaticReplayIgnoresTheCommitBoundary(t *testing.T) {
	r := newRun(t, heartbeatLost(attempt.Progress{ConnRef: "p-c1", Stage: "streaming", ContentStarted: true, ResponseBytes: 120}), ok)
	in := input("idem")
	in.ReplayPolicy = ReplayIdempotent
	res := r.exec(in)
	if res.State != StateCompletedPartial || r.attemptsStarted() != 1 {
		t.Fatalf("state %s (%s) after %d attempts; a committed attempt must never be replayed", res.State, res.Reason, r.attemptsStarted())
	}
	if res.Response == nil || !res.Response.Partial || res.Response.Incomplete != providers.IncompleteWorkerLost {
		t.Fatalf("response %+v", res.Response)
	}
}

// A canceled attempt's wire evidence never reached history: the workflow
// rebuilt an empty outcome from the cancellation. The activity now sends
// its outcome as the cancellation's details and the workflow keeps it.
// (The SDK's test environment drops the details of a cancellation the
// workflow requested, so this checks outcomeOfError directly; the
// end-to-end test TestE2ECancelStopsTheAttempt runs it through a
// real server.)
func TestCanceledAttemptWireEvidenceReachesHistory(t *testing.T) {
	in := attempt.Input{ActionRef: "act", Attempt: 1, AttemptID: "run-1", Route: "a"}
	sent := classified(in, func(e *evidence.Evidence) {
		e.Status, e.ContentStarted, e.ResponseBytes = 200, true, 42
		e.Canceled, e.Stop = true, evidence.StopScope
	})
	got := outcomeOfError(fmt.Errorf("attempt canceled: %w (%w)", context.Canceled, temporal.NewCanceledError(sent)), in)
	if got.Evidence.ConnRef != "p-c1" || got.Evidence.StreamID != 3 || !got.Evidence.ContentStarted || got.Classification.Class != evidence.Canceled {
		t.Fatalf("outcome %+v", got)
	}
	// Canceled before any worker ran it: no details, still the scope.
	got = outcomeOfError(temporal.NewCanceledError(), in)
	if got.Classification.Class != evidence.Canceled || got.Evidence.Stop != evidence.StopScope || got.Evidence.AttemptID != "run-1" {
		t.Fatalf("outcome %+v", got)
	}
	// Details of another attempt are not this attempt's evidence.
	other := sent
	other.Evidence.AttemptID = "run-9"
	got = outcomeOfError(temporal.NewCanceledError(other), in)
	if got.Evidence.ConnRef != "" {
		t.Fatalf("took another attempt's evidence: %+v", got.Evidence)
	}
}

// A second 421 was terminal only right after the 421 retry: 421, fresh
// retry unsent, ordinary retry, 421 again started another fresh retry.
// The action's second 421, wherever it falls, is misdirected_repeated.
func TestSecond421IsTerminalWhereverItFalls(t *testing.T) {
	got421 := step{f: func(_ context.Context, in attempt.Input) (attempt.Outcome, error) {
		return classified(in, func(e *evidence.Evidence) { e.Status = 421; e.AfterMisdirected = in.AfterMisdirected }), nil
	}}
	r := newRun(t, got421, unsent, got421, ok)
	in := input("a")
	in.MaxAttempts = 6
	in.RetriesPerRoute = 3
	res := r.exec(in)
	if res.State != StateFailed || res.Outcome != string(evidence.MisdirectedRepeated) || r.attemptsStarted() != 3 {
		t.Fatalf("state %s outcome %s after %d attempts", res.State, res.Outcome, r.attemptsStarted())
	}
}

// TransportReplays was counted but never charged to the budget: every
// stream a lower layer sent counts.
func TestTransportReplaysCountAgainstTheBudget(t *testing.T) {
	r := newRun(t, step{f: func(_ context.Context, in attempt.Input) (attempt.Outcome, error) {
		o := done(in)
		o.Evidence.TransportReplays = 2
		return o, nil
	}})
	res := r.exec(input("a"))
	if res.State != StateCompleted || res.Used != 3 {
		t.Fatalf("state %s, budget used %d, want 3 (one attempt, two replays)", res.State, res.Used)
	}
}

// Capability-safe fallback: the needs were never derived from the
// request, and context-too-long fell back without checking for a larger
// context.
func TestCapabilitySafeFallback(t *testing.T) {
	t.Run("a request with tools skips a route without tools", func(t *testing.T) {
		r := newRun(t, ok)
		in := input("no-tool", "c")
		in.Request.Tools = []json.RawMessage{json.RawMessage(`{"type":"function","function":{"name":"lookup"}}`)}
		res := r.exec(in)
		if res.State != StateCompleted || r.calls[0].Route != "c" || !hasNote(res, "route no-tool skipped: lacks tools") {
			t.Fatalf("state %s, first route %s, notes %v", res.State, r.calls[0].Route, res.Notes)
		}
	})
	t.Run("a streamed request skips a route without streaming", func(t *testing.T) {
		r := newRun(t, ok)
		in := input("c", "a")
		in.Request.Stream = true
		res := r.exec(in)
		if r.calls[0].Route != "a" || !hasNote(res, "route c skipped: lacks streaming") {
			t.Fatalf("first route %s, notes %v", r.calls[0].Route, res.Notes)
		}
	})
	t.Run("context too long falls back only to a larger context", func(t *testing.T) {
		tooLong := with(func(e *evidence.Evidence) { e.Status = 400; e.Signal = evidence.SignalContextTooLong })
		r := newRun(t, tooLong, ok)
		res := r.exec(input("ctx8k", "ctx8k-b", "ctx128k"))
		if res.State != StateCompleted || r.calls[1].Route != "ctx128k" {
			t.Fatalf("state %s, fell back to %s", res.State, r.calls[1].Route)
		}
		r = newRun(t, tooLong)
		res = r.exec(input("ctx8k", "ctx8k-b"))
		if res.State != StateFailed || r.attemptsStarted() != 1 {
			t.Fatalf("state %s after %d attempts: no route has a larger context", res.State, r.attemptsStarted())
		}
	})
}

// The reconcile timeout was signalled by By == "timeout": a person who
// typed --by timeout ended the action as if the wait had timed out.
func TestAVerdictByTimeoutIsNotTheReconcileTimeout(t *testing.T) {
	r := newRun(t, connLost)
	r.afterAwaiting(time.Second, func() {
		r.env.SignalWorkflow(SignalReconcile, ReconcileRequest{Attempt: 1, Verdict: attempt.VerdictAbandon, By: "timeout"})
	})
	res := r.exec(input("a"))
	if res.State != StateIndeterminate || res.Reason != "abandoned" {
		t.Fatalf("state %s reason %s", res.State, res.Reason)
	}
}

// The llm.attempt event is emitted once per attempt, after the workflow
// decided what follows, and says exactly what the record in history says:
// for every row, including those the workflow sees without an outcome
// (ScheduleToStart, worker lost), a canceled attempt and a request the
// route cannot express.
func TestAttemptEventAgreesWithHistoryForEveryRow(t *testing.T) {
	unsupported := with(func(e *evidence.Evidence) {
		e.RequestSent, e.StreamID, e.ConnRef = false, 0, ""
		e.Unsendable = evidence.UnsendableRoute
	})
	tests := []struct {
		name   string
		steps  []step
		cancel time.Duration
	}{
		{"completed", []step{ok}, 0},
		{"refused then completed", []step{goAwayAbove, ok}, 0},
		{"throttled then fallback", []step{throttled(time.Hour), ok}, 0},
		{"ScheduleToStart timed out, then completed", []step{fails(temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START, nil)), ok}, 0},
		{"worker lost, awaiting a verdict", []step{heartbeatLost(attempt.Progress{ConnRef: "p-c1"})}, 0},
		{"canceled", []step{blockUntilCanceled}, time.Second},
		{"route cannot express the request, fallback", []step{unsupported, ok}, 0},
		{"rejected", []step{rejected400}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRun(t, tt.steps...)
			if tt.cancel > 0 {
				r.env.RegisterDelayedCallback(func() { r.env.SignalWorkflow(SignalCancel, cancelSignal(OriginUserStop)) }, tt.cancel)
			}
			in := input("a", "b")
			in.ReconcileTimeout = time.Minute
			res := r.exec(in)
			var events []map[string]any
			for _, line := range strings.Split(strings.TrimSpace(r.events.String()), "\n") {
				var ev map[string]any
				if err := json.Unmarshal([]byte(line), &ev); err != nil {
					t.Fatalf("event %q: %v", line, err)
				}
				if ev["msg"] == evidence.AttemptEvent {
					events = append(events, ev)
				}
			}
			if len(events) != len(res.Attempts) {
				t.Fatalf("%d events for %d attempts:\n%s", len(events), len(res.Attempts), r.events.String())
			}
			for i, rec := range res.Attempts {
				ev := events[i]
				if ev["attempt"] != float64(rec.N) || ev["classification"] != string(rec.Classification.Class) || ev["reason"] != rec.Classification.Reason ||
					ev["next"] != rec.Decision.Next || ev["why"] != rec.Decision.Why || ev["conn_ref"] != rec.Evidence.ConnRef {
					t.Fatalf("attempt %d: event %v\nrecord %+v", rec.N, ev, rec)
				}
				if rec.Decision.Next == "" {
					t.Fatalf("attempt %d has no decision", rec.N)
				}
			}
		})
	}
}

// The built-in reconciler: what a worker journaled settles an attempt
// whose report was lost, with no person involved.
func TestAmbiguousAttemptReconciledFromTheJournal(t *testing.T) {
	withJournal := func(a *activities.Activities) { a.Journal = journal.Dir{Path: t.TempDir()} }
	fromJournal := attempt.ReconcileOutput{Verdict: attempt.VerdictCompleted, By: attempt.ByJournal, Response: &providers.Response{Text: "journaled answer"}}

	t.Run("worker lost mid-attempt after the response arrived", func(t *testing.T) {
		r := newRunWith(t, withJournal, heartbeatLost(attempt.Progress{ConnRef: "p-c1"}))
		r.env.OnActivity(r.acts.Reconcile, mock.Anything, mock.Anything).Return(fromJournal, nil).Once()
		res := r.exec(input("a"))
		if res.State != StateReconciled || res.Response == nil || res.Response.Text != "journaled answer" || res.Attempts[0].VerdictBy != attempt.ByJournal {
			t.Fatalf("state %s response %+v record %+v", res.State, res.Response, res.Attempts[0])
		}
	})
	t.Run("committed on a worker that was lost: the journal holds the whole text", func(t *testing.T) {
		r := newRunWith(t, withJournal, heartbeatLost(attempt.Progress{ConnRef: "p-c1", ContentStarted: true}))
		r.env.OnActivity(r.acts.Reconcile, mock.Anything, mock.Anything).Return(fromJournal, nil).Once()
		res := r.exec(input("idem"))
		if res.State != StateReconciled || res.Response == nil || res.Response.Text != "journaled answer" || res.Used != 1 {
			t.Fatalf("state %s response %+v used %d", res.State, res.Response, res.Used)
		}
	})
	t.Run("nothing journaled: the action waits for a person", func(t *testing.T) {
		r := newRunWith(t, withJournal, heartbeatLost(attempt.Progress{ConnRef: "p-c1"}))
		r.env.OnActivity(r.acts.Reconcile, mock.Anything, mock.Anything).Return(attempt.ReconcileOutput{Verdict: attempt.VerdictNone, By: attempt.ByJournal, Note: "nothing"}, nil).Once()
		in := input("a")
		in.ReconcileTimeout = time.Minute
		res := r.exec(in)
		if res.State != StateIndeterminate || res.Reason != "reconcile_timeout" || !hasNote(res, "reconciler (journal) could not tell") {
			t.Fatalf("state %s reason %s notes %v", res.State, res.Reason, res.Notes)
		}
	})
	t.Run("the journal proved it was not processed: the action goes on", func(t *testing.T) {
		r := newRunWith(t, withJournal, heartbeatLost(attempt.Progress{ConnRef: "p-c1"}), ok)
		r.env.OnActivity(r.acts.Reconcile, mock.Anything, mock.Anything).Return(attempt.ReconcileOutput{
			Verdict: attempt.VerdictNotExecuted, By: attempt.ByJournal, JournalState: "not_processed", Note: "refused"}, nil).Once()
		res := r.exec(input("a"))
		if res.State != StateCompleted || res.Response == nil || res.Used != 2 {
			t.Fatalf("state %s used %d response %+v notes %v", res.State, res.Used, res.Response, res.Notes)
		}
		if a := res.Attempts[0]; a.Verdict != attempt.VerdictNotExecuted || a.VerdictBy != attempt.ByJournal || a.JournalState != "not_processed" {
			t.Fatalf("first attempt %+v", a)
		}
	})
}

// A cancel that arrives while the built-in reconciler is still reading the
// journal (it may wait up to the attempt's deadline for a live worker)
// ends the action at once, and cancels the reconcile activity, which only
// reads.
func TestACancelDuringTheBuiltInReconcilerEndsTheActionAtOnce(t *testing.T) {
	for _, tt := range []struct {
		name   string
		cancel func(r *run)
		origin CancelOrigin
	}{
		{"a cancel signal", func(r *run) { r.env.SignalWorkflow(SignalCancel, cancelSignal(OriginUserStop)) }, OriginUserStop},
		{"Temporal cancellation", func(r *run) { r.env.CancelWorkflow() }, OriginParentCanceled},
	} {
		t.Run(tt.name, func(t *testing.T) {
			withJournal := func(a *activities.Activities) { a.Journal = journal.Dir{Path: t.TempDir()} }
			r := newRunWith(t, withJournal, heartbeatLost(attempt.Progress{ConnRef: "p-c1"}))
			r.env.OnActivity(r.acts.Reconcile, mock.Anything, mock.Anything).After(time.Hour).
				Return(attempt.ReconcileOutput{Verdict: attempt.VerdictNone, By: attempt.ByJournal}, nil).Maybe()
			var reconcileCanceled bool
			r.env.SetOnActivityCanceledListener(func(info *activity.Info) {
				reconcileCanceled = reconcileCanceled || info.ActivityType.Name == "Reconcile"
			})
			var cancelAt time.Time
			r.env.RegisterDelayedCallback(func() { cancelAt = r.env.Now(); tt.cancel(r) }, 10*time.Second)
			res := r.exec(input("a"))
			if res.State != StateCanceled || res.Origin != tt.origin {
				t.Fatalf("state %s origin %s notes %v", res.State, res.Origin, res.Notes)
			}
			// Virtual time: the action ended when the cancel arrived, not
			// when the reconciler would have returned an hour later.
			if ended := r.env.Now(); ended.Sub(cancelAt) >= time.Minute {
				t.Fatalf("the action ended %v after the cancel", ended.Sub(cancelAt))
			}
			if !reconcileCanceled {
				t.Fatal("the reconcile activity was not canceled")
			}
		})
	}
}

// The provider's record settles an attempt the journal could not: the
// verdict's source is the provider, the reconcile activity is given the
// route's settle window on top of its own time, and it is told how long
// the attempt could still run.
func TestAmbiguousAttemptReconciledFromTheProvidersRecord(t *testing.T) {
	const settle = 10 * time.Minute
	withRecord := func(a *activities.Activities) {
		a.Routes = maps.Clone(testRoutes)
		a.Routes["rec"] = routes.Route{Name: "rec", Kind: "openai", Model: "model-r", ProviderRecord: routes.ProviderRecordStoredCompletions, ProviderRecordSettle: settle}
	}
	r := newRunWith(t, withRecord, heartbeatLost(attempt.Progress{ConnRef: "p-c1"}))
	var gotTimeout, gotRemaining time.Duration
	r.env.OnActivity(r.acts.Reconcile, mock.Anything, mock.Anything).Return(func(ctx context.Context, in attempt.ReconcileInput) (attempt.ReconcileOutput, error) {
		info := activity.GetInfo(ctx)
		gotTimeout, gotRemaining = info.Deadline.Sub(info.StartedTime), in.Remaining
		return attempt.ReconcileOutput{Verdict: attempt.VerdictCompleted, By: attempt.ByProvider, ProviderRecord: attempt.ProviderRecordFound,
			Response: &providers.Response{Text: "the stored answer"}, Note: "the provider's record holds the answer"}, nil
	}).Once()
	res := r.exec(input("rec"))
	if res.State != StateReconciled || res.Response == nil || res.Response.Text != "the stored answer" {
		t.Fatalf("state %s response %+v notes %v", res.State, res.Response, res.Notes)
	}
	if a := res.Attempts[0]; a.VerdictBy != attempt.ByProvider || a.ProviderRecord != attempt.ProviderRecordFound || !hasNote(res, "reconciler verdict completed by provider") {
		t.Fatalf("record %+v notes %v", a, res.Notes)
	}
	if gotTimeout < time.Minute+settle+gotRemaining || gotRemaining <= 0 {
		t.Fatalf("reconcile timeout %v, remaining %v: want at least a minute, the settle window and the remaining time", gotTimeout, gotRemaining)
	}
}
