package actiontest_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
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
// same parent. Values that differ run to run (times, ids, connection
// refs, byte counts) are compared by presence, everything else by value.
func TestScriptedActionsReturnWhatTheRealOnesReturn(t *testing.T) {
	in := workflows.ActionInput{
		Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "say hello")}},
		Routes:  []string{"primary", "fallback"},
	}
	verdict := func(env *testsuite.TestWorkflowEnvironment, v attempt.Verdict) func() {
		return func() {
			_ = env.UpdateWorkflowByID("parent-ask", workflows.UpdateReconcile, "u1", &testsuite.TestUpdateCallback{
				OnReject: func(err error) { t.Errorf("verdict rejected: %v", err) }, OnAccept: func() {}, OnComplete: func(any, error) {},
			}, workflows.ReconcileRequest{Attempt: 1, Verdict: v, By: "actiontest"})
		}
	}
	streamed := in
	streamed.Request.Stream = true
	tests := []struct {
		name     string
		in       workflows.ActionInput
		scripted []actiontest.Attempt
		real     []providertest.Behavior
		// event runs at a virtual time in the real environment, and in
		// the scripted one too unless the script does it itself.
		at       time.Duration
		event    func(env *testsuite.TestWorkflowEnvironment) func()
		scriptOn bool
	}{
		{"completes with this text", in, []actiontest.Attempt{actiontest.Answer("hello there")}, []providertest.Behavior{providertest.Answer("hello there")}, 0, nil, false},
		{"streams and completes", streamed, []actiontest.Attempt{actiontest.Answer("hello there")}, []providertest.Behavior{providertest.Answer("hello there")}, 0, nil, false},
		{"refused by a GOAWAY, then completes", in, []actiontest.Attempt{actiontest.Refused(), actiontest.Answer("hello there")}, []providertest.Behavior{providertest.GoAwayAbove(0), providertest.Answer("hello there")}, 0, nil, false},
		{"misdirected, then completes", in, []actiontest.Attempt{actiontest.Misdirected(), actiontest.Answer("hello there")}, []providertest.Behavior{providertest.Misdirected(), providertest.Answer("hello there")}, 0, nil, false},
		{"throttled, then completes", in, []actiontest.Attempt{actiontest.Throttled(0), actiontest.Answer("ok")}, []providertest.Behavior{providertest.TooManyRequests(nil), providertest.Answer("ok")}, 0, nil, false},
		{"a server error, then completes", in, []actiontest.Attempt{actiontest.ServerError(500), actiontest.Answer("ok")}, []providertest.Behavior{providertest.ServerError(500), providertest.Answer("ok")}, 0, nil, false},
		{"rejected", in, []actiontest.Attempt{actiontest.Rejected(400)}, []providertest.Behavior{providertest.Status(400, nil, `{"error":{"type":"invalid_request_error","message":"scripted by actiontest"}}`)}, 0, nil, false},
		{"cut after content: completed_partial", streamed, []actiontest.Attempt{actiontest.Partial("chunk1 chunk2")}, []providertest.Behavior{providertest.StreamCut(2, providertest.CutReset)}, 0, nil, false},
		{"ends awaiting a verdict, then not_executed arrives", in,
			[]actiontest.Attempt{actiontest.Ambiguous().ThenVerdict(attempt.VerdictNotExecuted, time.Minute), actiontest.Answer("second")},
			[]providertest.Behavior{providertest.CloseAfterRead(), providertest.Answer("second")}, time.Minute,
			func(env *testsuite.TestWorkflowEnvironment) func() { return verdict(env, attempt.VerdictNotExecuted) }, false},
		{"canceled by parent_canceled: the parent canceled", in, []actiontest.Attempt{actiontest.Hold()}, []providertest.Behavior{providertest.Hold()}, time.Second,
			func(env *testsuite.TestWorkflowEnvironment) func() { return env.CancelWorkflow }, true},
		{"canceled by parent_canceled: the action canceled through Temporal", in, []actiontest.Attempt{actiontest.Hold().CanceledAfter(time.Second)}, []providertest.Behavior{providertest.Hold()}, time.Second,
			func(env *testsuite.TestWorkflowEnvironment) func() {
				return func() { env.CancelWorkflowByID("parent-ask", "") }
			}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The real one.
			p, err := providertest.NewProvider()
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			p.Push(tt.real...)
			env := newEnv(t)
			env.RegisterWorkflowWithOptions(workflows.New(workflows.Options{Events: slog.New(slog.DiscardHandler)}), workflow.RegisterOptions{Name: workflows.WorkflowName})
			caps := providers.Capabilities{Tools: true, StructuredOutput: true, Streaming: true, Vision: true}
			cfg := routes.Config{Routes: []routes.Route{
				{Name: "primary", Kind: "openai", BaseURL: p.URL() + "/v1", Model: "primary", Capabilities: caps},
				{Name: "fallback", Kind: "openai", BaseURL: p.URL() + "/v1", Model: "fallback", Capabilities: caps},
			}}
			env.RegisterActivity(&activities.Activities{
				Engine: recovery.New(recovery.Config{TLSClientConfig: p.ClientTLSConfig(), Logger: slog.New(slog.DiscardHandler)}),
				Routes: cfg.RouteMap(), Logger: slog.New(slog.DiscardHandler),
			})
			if tt.event != nil {
				env.RegisterDelayedCallback(tt.event(env), tt.at)
			}
			real := execute(t, env, tt.in)

			// The scripted one.
			env = newEnv(t)
			actiontest.Register(t, env).On("ask", tt.scripted...)
			if tt.scriptOn {
				env.RegisterDelayedCallback(tt.event(env), tt.at)
			}
			scripted := execute(t, env, tt.in)

			if d := actionshape.Diff(shape(t, real), shape(t, scripted)); d != "" {
				t.Fatalf("the scripted action differs from the real one:\n%s", d)
			}
			if got := len(p.Received()); got != len(tt.real) {
				t.Fatalf("the real action sent %d requests for %d behaviours", got, len(tt.real))
			}
		})
	}
}

// shape is v's shape (actionshape.Of).
func shape(t *testing.T, v any) any {
	t.Helper()
	s, err := actionshape.Of(v)
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
