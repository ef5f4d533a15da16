package actiontest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm/activities"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/internal/actionshape"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/testsuite/actiontest"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// call is what the parent saw of its one call.
type call = actionshape.Call

func newEnv(t *testing.T) *testsuite.TestWorkflowEnvironment {
	var s testsuite.WorkflowTestSuite
	s.SetLogger(log.NewStructuredLogger(slog.New(slog.DiscardHandler)))
	env := s.NewTestWorkflowEnvironment()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "parent"})
	env.SetTestTimeout(30 * time.Second)
	return env
}

func execute(t *testing.T, env *testsuite.TestWorkflowEnvironment, in workflows.ActionInput) call {
	t.Helper()
	env.ExecuteWorkflow(actionshape.Parent, actionshape.Input{Action: in})
	if err := env.GetWorkflowError(); err != nil || !env.IsWorkflowCompleted() {
		t.Fatalf("parent: %v", err)
	}
	var c call
	if err := env.GetWorkflowResult(&c); err != nil {
		t.Fatal(err)
	}
	return c
}

// The scripted action returns exactly what the real one returns: the
// real LLMAction with the real activities, over real frames to the
// fault-injecting provider, run in the same kind of environment by the
// same parent. Where the test environment cannot show the real shape (a
// canceled activity settles there at once, without its outcome), the
// real one is the shape internal/e2e recorded on a Temporal server
// (testdata/server_shapes.json, TestE2ERealActionShapesOnAServer). Values
// that differ run to run (times, ids, connection refs, byte counts) are
// compared by presence, everything else by value.
func TestScriptedActionsReturnWhatTheRealOnesReturn(t *testing.T) {
	in := workflows.ActionInput{
		Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "say hello")}},
		Routes:  []string{"primary", "fallback"},
	}
	verdict := func(v attempt.Verdict) func(env *testsuite.TestWorkflowEnvironment) func() {
		return func(env *testsuite.TestWorkflowEnvironment) func() {
			return func() {
				_ = env.UpdateWorkflowByID("parent-ask", workflows.UpdateReconcile, "u1", &testsuite.TestUpdateCallback{
					OnReject: func(err error) { t.Errorf("verdict rejected: %v", err) }, OnAccept: func() {}, OnComplete: func(any, error) {},
				}, workflows.ReconcileRequest{Attempt: 1, Verdict: v, By: "actiontest"})
			}
		}
	}
	toolCall := json.RawMessage(`[{"id":"call_durallm_1","type":"function","function":{"name":"lookup_order","arguments":"{\"order_id\":\"42\"}"}}]`)
	large := strings.Repeat("many words ", 30000) // over resultstore.DefaultThreshold
	cancelParent := func(env *testsuite.TestWorkflowEnvironment) func() { return env.CancelWorkflow }
	streamed := in
	streamed.Request.Stream = true
	// quick: an attempt timeout of a second (the real attempt waits for
	// it in real time) and no wait for a verdict.
	quick := func(in workflows.ActionInput) workflows.ActionInput {
		in.AttemptTimeout, in.ReconcileTimeout = time.Second, time.Minute
		return in
	}
	tests := []struct {
		name     string
		in       workflows.ActionInput
		scripted []actiontest.Attempt
		// real is what the provider does, one behaviour per attempt; nil
		// when the real shape is the one recorded on a server.
		real []providertest.Behavior
		// worker sets up the real worker's activities beyond routes and
		// engine (a result store, a reconciler).
		worker func(t *testing.T, a *activities.Activities)
		// event runs at virtual time at in the real environment, and in
		// the scripted one too when scriptOn (else the script does it).
		at       time.Duration
		event    func(env *testsuite.TestWorkflowEnvironment) func()
		scriptOn bool
		// racy are keys the real run may or may not have, left out of
		// both shapes.
		racy []string
	}{
		{name: "completes with this text", in: in, scripted: []actiontest.Attempt{actiontest.Answer("hello there")}, real: []providertest.Behavior{providertest.Answer("hello there")}},
		{name: "streams and completes", in: streamed, scripted: []actiontest.Attempt{actiontest.Answer("hello there")}, real: []providertest.Behavior{providertest.Answer("hello there")}},
		// The provider closes its connection once nothing is in flight
		// on it: the real attempt may end before its engine sees that.
		{name: "refused by a GOAWAY, then completes", in: in, scripted: []actiontest.Attempt{actiontest.Refused(), actiontest.Answer("hello there")}, real: []providertest.Behavior{providertest.GoAwayAbove(0), providertest.Answer("hello there")},
			racy: []string{"conn_closed"}},
		{name: "misdirected, then completes", in: in, scripted: []actiontest.Attempt{actiontest.Misdirected(), actiontest.Answer("hello there")}, real: []providertest.Behavior{providertest.Misdirected(), providertest.Answer("hello there")}},
		{name: "throttled, then completes", in: in, scripted: []actiontest.Attempt{actiontest.Throttled(0), actiontest.Answer("ok")}, real: []providertest.Behavior{providertest.TooManyRequests(nil), providertest.Answer("ok")}},
		{name: "a server error, then completes", in: in, scripted: []actiontest.Attempt{actiontest.ServerError(500), actiontest.Answer("ok")}, real: []providertest.Behavior{providertest.ServerError(500), providertest.Answer("ok")}},
		{name: "rejected", in: in, scripted: []actiontest.Attempt{actiontest.Rejected(400)}, real: []providertest.Behavior{providertest.Status(400, nil, `{"error":{"type":"invalid_request_error","message":"scripted by actiontest"}}`)}},
		{name: "cut after content: completed_partial", in: streamed, scripted: []actiontest.Attempt{actiontest.Partial("chunk1 chunk2")}, real: []providertest.Behavior{providertest.StreamCut(2, providertest.CutReset)}},
		{name: "ends awaiting a verdict, then not_executed arrives", in: in,
			scripted: []actiontest.Attempt{actiontest.Ambiguous().ThenVerdict(attempt.VerdictNotExecuted, time.Minute), actiontest.Answer("second")},
			real:     []providertest.Behavior{providertest.CloseAfterRead(), providertest.Answer("second")}, at: time.Minute, event: verdict(attempt.VerdictNotExecuted)},
		{name: "calls a tool", in: in, scripted: []actiontest.Attempt{actiontest.Respond(providers.Response{ToolCalls: toolCall})}, real: []providertest.Behavior{providertest.AnswerToolCall("lookup_order", `{"order_id":"42"}`)}},
		{name: "streams a tool call", in: streamed, scripted: []actiontest.Attempt{actiontest.Respond(providers.Response{ToolCalls: toolCall})}, real: []providertest.Behavior{providertest.AnswerToolCall("lookup_order", `{"order_id":"42"}`)}},
		{name: "a body cut before it was whole: ambiguous, never completed_partial", in: in,
			scripted: []actiontest.Attempt{actiontest.Partial("chunk1 chunk2").ThenVerdict(attempt.VerdictNotExecuted, time.Minute), actiontest.Answer("second")},
			real:     []providertest.Behavior{providertest.BodyCut(200, nil, `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"chunk1`, providertest.CutReset), providertest.Answer("second")},
			at:       time.Minute, event: verdict(attempt.VerdictNotExecuted)},
		{name: "blocked by the content filter", in: in, scripted: []actiontest.Attempt{actiontest.ContentFiltered()},
			real: []providertest.Behavior{providertest.Status(400, nil, `{"error":{"code":"content_filter","param":"prompt","message":"scripted by actiontest","status":400}}`)}},
		{name: "completes by reference", in: in, scripted: []actiontest.Attempt{actiontest.Answer("hello there").ByReference()}, real: []providertest.Behavior{providertest.Answer("hello there")},
			worker: func(t *testing.T, a *activities.Activities) {
				a.Results, a.LargeResponseBytes = resultstore.Dir{Path: t.TempDir()}, 1
			}},
		{name: "completes with an answer too large for history: by reference", in: in, scripted: []actiontest.Attempt{actiontest.Answer(large)}, real: []providertest.Behavior{providertest.Answer(large)},
			worker: func(t *testing.T, a *activities.Activities) { a.Results = resultstore.Dir{Path: t.TempDir()} }},
		{name: "a verdict from the worker's reconciler", in: in,
			scripted: []actiontest.Attempt{actiontest.Ambiguous().ThenReconciler(attempt.ReconcileOutput{Verdict: attempt.VerdictCompleted, Response: &providers.Response{Text: "from the ledger"}})},
			real:     []providertest.Behavior{providertest.CloseAfterRead()},
			worker: func(_ *testing.T, a *activities.Activities) {
				a.Reconciler = ledger{attempt.ReconcileOutput{Verdict: attempt.VerdictCompleted, Response: &providers.Response{Text: "from the ledger"}}}
			}},
		{name: "the worker's reconciler cannot tell, then not_executed arrives", in: in,
			scripted: []actiontest.Attempt{actiontest.Ambiguous().ThenReconciler(attempt.ReconcileOutput{Note: "no record of it"}).ThenVerdict(attempt.VerdictNotExecuted, time.Minute), actiontest.Answer("second")},
			real:     []providertest.Behavior{providertest.CloseAfterRead(), providertest.Answer("second")},
			worker: func(_ *testing.T, a *activities.Activities) {
				a.Reconciler = ledger{attempt.ReconcileOutput{Note: "no record of it"}}
			},
			at: time.Minute, event: verdict(attempt.VerdictNotExecuted)},
		{name: "a verdict by the reconcile signal", in: in,
			scripted: []actiontest.Attempt{actiontest.Ambiguous().ThenVerdict(attempt.VerdictNotExecuted, time.Minute).BySignal(), actiontest.Answer("second")},
			real:     []providertest.Behavior{providertest.CloseAfterRead(), providertest.Answer("second")},
			at:       time.Minute, event: func(env *testsuite.TestWorkflowEnvironment) func() {
				return func() {
					if err := env.SignalWorkflowByID("parent-ask", workflows.SignalReconcile, workflows.ReconcileRequest{Attempt: 1, Verdict: attempt.VerdictNotExecuted, By: "actiontest"}); err != nil {
						t.Error(err)
					}
				}
			}},
		{name: "canceled by parent_canceled: the parent canceled", in: in, scripted: []actiontest.Attempt{actiontest.Hold()},
			at: time.Second, event: cancelParent, scriptOn: true},
		{name: "canceled by parent_canceled: the action canceled through Temporal", in: in, scripted: []actiontest.Attempt{actiontest.Hold().CanceledAfter(time.Second)}},
		{name: "canceled after the commit: the parent canceled mid-stream", in: streamed, scripted: []actiontest.Attempt{actiontest.HoldAfter("chunk1 chunk2")},
			at: time.Second, event: cancelParent, scriptOn: true},
		{name: "stopped by a cancel signal: user_stop", in: in, scripted: []actiontest.Attempt{actiontest.Hold()},
			at: time.Second, event: func(env *testsuite.TestWorkflowEnvironment) func() {
				return func() {
					if err := env.SignalWorkflowByID("parent-ask", workflows.SignalCancel, workflows.CancelRequest{Origin: workflows.OriginUserStop}); err != nil {
						t.Error(err)
					}
				}
			}, scriptOn: true},
		{name: "held until the attempt timeout: ambiguous", in: quick(in), scripted: []actiontest.Attempt{actiontest.Hold()}, real: []providertest.Behavior{providertest.Hold()}},
		{name: "stalls after content until the attempt timeout: completed_partial", in: quick(streamed), scripted: []actiontest.Attempt{actiontest.HoldAfter("chunk1 chunk2")}, real: []providertest.Behavior{providertest.StreamStall(2)}},
	}
	server, err := actionshape.Read(filepath.Join("testdata", "server_shapes.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var real any
			if tt.real == nil {
				var ok bool
				if real, ok = server[tt.name]; !ok {
					t.Fatalf("no shape recorded on a server for %q (go test ./internal/e2e -run TestE2ERealActionShapesOnAServer -update-shapes)", tt.name)
				}
			} else {
				real = shape(t, runReal(t, tt.in, tt.real, tt.worker, tt.at, tt.event), tt.racy...)
			}

			env := newEnv(t)
			actiontest.Register(t, env).On("ask", tt.scripted...)
			if tt.scriptOn {
				env.RegisterDelayedCallback(tt.event(env), tt.at)
			}
			scripted := execute(t, env, tt.in)

			if d := actionshape.Diff("real", real, "scripted", shape(t, scripted, tt.racy...)); d != "" {
				t.Fatalf("the scripted action differs from the real one:\n%s", d)
			}
		})
	}
}

// ledger is an application's reconciler (activities.Reconciler) that
// always answers out.
type ledger struct{ out attempt.ReconcileOutput }

func (l ledger) Reconcile(context.Context, attempt.ReconcileInput) (attempt.ReconcileOutput, error) {
	return l.out, nil
}

// runReal runs the parent's call with the real LLMAction and the real
// activities in the test environment, against a provider that behaves as
// behaviours say, one per attempt, with event (if any) at virtual time at.
func runReal(t *testing.T, in workflows.ActionInput, behaviours []providertest.Behavior, worker func(*testing.T, *activities.Activities), at time.Duration, event func(env *testsuite.TestWorkflowEnvironment) func()) call {
	t.Helper()
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Push(behaviours...)
	env := newEnv(t)
	env.RegisterWorkflowWithOptions(workflows.New(workflows.Options{Events: slog.New(slog.DiscardHandler)}), workflow.RegisterOptions{Name: workflows.WorkflowName})
	caps := providers.Capabilities{Tools: true, StructuredOutput: true, Streaming: true, Vision: true}
	cfg := routes.Config{Routes: []routes.Route{
		{Name: "primary", Kind: "openai", BaseURL: p.URL() + "/v1", Model: "primary", Capabilities: caps},
		{Name: "fallback", Kind: "openai", BaseURL: p.URL() + "/v1", Model: "fallback", Capabilities: caps},
	}}
	acts := &activities.Activities{
		Engine: recovery.New(recovery.Config{TLSClientConfig: p.ClientTLSConfig(), Logger: slog.New(slog.DiscardHandler)}),
		Routes: cfg.RouteMap(), Logger: slog.New(slog.DiscardHandler),
	}
	if worker != nil {
		worker(t, acts)
	}
	env.RegisterActivity(acts)
	if event != nil {
		env.RegisterDelayedCallback(event(env), at)
	}
	c := execute(t, env, in)
	if got := len(p.Received()); got != len(behaviours) {
		t.Fatalf("the real action sent %d requests for %d behaviours", got, len(behaviours))
	}
	return c
}

// shape is v's shape (actionshape.Of).
func shape(t *testing.T, v any, ignore ...string) any {
	t.Helper()
	s, err := actionshape.Of(v, ignore...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// recorder is a testing.TB that keeps the errors actiontest reports.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recorder) Error(args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprint(args...))
}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// An attempt past its call's script fails the test, naming the call, and
// the attempt fails as an activity (the action then awaits a verdict).
func TestAnUnscriptedAttemptFailsTheTest(t *testing.T) {
	rec := &recorder{TB: t}
	env := newEnv(t)
	actiontest.Register(rec, env).On("ask", actiontest.Refused())
	in := workflows.ActionInput{Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hi")}}, Routes: []string{"a"}, ReconcileTimeout: time.Minute}
	c := execute(t, env, in)
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], `attempt 2 of call "ask"`) {
		t.Fatalf("errors %q", rec.errs)
	}
	if c.Action == nil || c.Action.State != workflows.StateIndeterminate || c.Result.Attempts[1].Evidence.Activity != evidence.ActivityFailed {
		t.Fatalf("call %+v", c)
	}
}

// Reconcile delivers a verdict from the test, on the awaiting attempt.
func TestReconcileFromACallback(t *testing.T) {
	env := newEnv(t)
	actions := actiontest.Register(t, env)
	actions.On("ask", actiontest.Ambiguous())
	env.RegisterDelayedCallback(func() {
		actions.Reconcile("ask", workflows.ReconcileRequest{Verdict: attempt.VerdictCompleted, Response: &providers.Response{Text: "from the provider's log"}})
	}, time.Hour)
	in := workflows.ActionInput{Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hi")}}, Routes: []string{"a"}}
	c := execute(t, env, in)
	if c.Err || c.Result.State != workflows.StateReconciled || c.Result.Response.Text != "from the provider's log" || c.Result.Attempts[0].VerdictBy != "person" {
		t.Fatalf("call %+v", c)
	}
}

// A declared route is what DescribeRoutes answers: one that lacks what
// the request needs is skipped, as on a real worker.
func TestDeclaredRoutesAreDescribed(t *testing.T) {
	env := newEnv(t)
	actions := actiontest.Register(t, env)
	actions.Route(attempt.RouteInfo{Name: "small", Kind: "openai", Model: "small-model"})
	actions.On("ask", actiontest.Answer("from big"))
	in := workflows.ActionInput{Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hi")}, Tools: []json.RawMessage{json.RawMessage(`{"type":"function","function":{"name":"f"}}`)}},
		Routes: []string{"small", "big"}}
	c := execute(t, env, in)
	if c.Err || c.Result.Attempts[0].Route != "big" || !strings.Contains(fmt.Sprint(c.Result.Notes), "route small skipped: lacks tools") {
		t.Fatalf("call %+v", c)
	}
}
