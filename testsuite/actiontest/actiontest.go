// Package actiontest scripts durallm's LLM actions inside the Temporal
// SDK's test environment, so a unit test of a workflow that calls
// step.Call can say what each call does ("this one completes with this
// text", "this one ends awaiting a verdict, then not_executed arrives",
// "this one is canceled after it delivered some text") in virtual time,
// with no worker, no provider and no model.
//
//	var s testsuite.WorkflowTestSuite
//	env := s.NewTestWorkflowEnvironment()
//	actions := actiontest.Register(t, env)
//	actions.On("ask", actiontest.Answer("It is sunny."))
//	actions.On("check", actiontest.Ambiguous().ThenVerdict(attempt.VerdictNotExecuted, time.Minute), actiontest.Answer("checked"))
//	env.ExecuteWorkflow(MyWorkflow, in)
//	msgs := actions.Request("check").Messages // what the workflow asked
//	actions.AssertExpectations(t)             // every scripted attempt ran
//
// What runs is the real LLMAction workflow; only its activities are
// scripted, each attempt's outcome built from evidence and classified by
// the recovery engine's own Classify. So a scripted call returns exactly
// what a real one does in the same case: the same states, outcomes,
// reasons, decisions and timeline, and the same errors from step.Call.
// Every shape a caller must handle can be scripted: answers inline or by
// reference (ByReference, Results), partial streams, refusals and
// retries, rejections and the content filter, cancels with their
// evidence and after the commit (Hold, HoldAfter), verdicts by Update,
// by signal (BySignal) or by the worker's own reconciler
// (ThenReconciler). TestScriptedActionsReturnWhatTheRealOnesReturn
// checks each against the real activities over the fault-injecting
// provider, and the cancels against a Temporal server's.
//
// Attempts are scripted per call name (the name given to step.Call) or
// per action id, one value per attempt in order. An attempt nobody
// scripted fails the test and ends as an activity failure; one scripted
// that never ran fails AssertExpectations.
package actiontest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/step"
	"github.com/durallm/durallm/workflows"
)

// Actions holds the scripts of one test environment. Its methods are safe
// for concurrent use.
type Actions struct {
	t   testing.TB
	env *testsuite.TestWorkflowEnvironment

	mu      sync.Mutex
	calls   map[string]string // action id → the name it was called under
	scripts map[string][]Attempt
	routes  map[string]attempt.RouteInfo
	// The one scripted provider connection, as the engine's pool keeps
	// it: its number (0: none), the next stream id, how many were dialed.
	conn, nextStream, conns int
	// wires are the started attempts by attempt id: where each went on
	// the wire, and whether a cancel settled it.
	wires map[string]*wire
	// intercepted are the attempts the interceptor saw scheduled.
	intercepted map[string]bool
	// results keeps answers stored by reference; nil until one is.
	results *resultstore.Dir
	// given is what each started attempt was given, by action id.
	given map[string][]attempt.Input
}

// wire is where a started attempt went: its connection and stream,
// chosen when it started, as the engine's pool would.
type wire struct {
	conn   string
	stream uint32
	fresh  bool
	// settled: a cancel settled the attempt (Interceptor); what its
	// mocked activity returns later goes nowhere and must change nothing.
	settled bool
}

// Register registers LLMAction (the real workflow, under its name
// workflows.WorkflowName) in env together with scripted activities, and
// returns the scripts, empty. Register once per environment, before
// ExecuteWorkflow.
//
// Register also sets env's worker options, to install the actions'
// Interceptor. A test that sets worker options of its own sets them after
// Register, with actions.Interceptor() among their Interceptors: an
// attempt that runs without it fails the test.
func Register(t testing.TB, env *testsuite.TestWorkflowEnvironment) *Actions {
	a := &Actions{t: t, env: env, calls: map[string]string{}, scripts: map[string][]Attempt{}, routes: map[string]attempt.RouteInfo{},
		wires: map[string]*wire{}, intercepted: map[string]bool{}, given: map[string][]attempt.Input{}}
	env.SetWorkerOptions(worker.Options{Interceptors: []interceptor.WorkerInterceptor{a.Interceptor()}})
	// A method, not a closure: the SDK tells workflow functions apart by
	// the last element of their name, and a test's own closures are
	// "func1" too.
	env.RegisterWorkflowWithOptions(a.llmAction, workflow.RegisterOptions{Name: workflows.WorkflowName})
	env.RegisterActivityWithOptions(a.describeRoutes, activity.RegisterOptions{Name: attempt.DescribeRoutes})
	env.RegisterActivityWithOptions(a.reconciler, activity.RegisterOptions{Name: attempt.Reconcile})
	env.RegisterActivityWithOptions(a.unscripted, activity.RegisterOptions{Name: attempt.CallModel})
	env.OnActivity(attempt.CallModel, mock.Anything, mock.MatchedBy(func(in attempt.Input) bool {
		_, ok := a.scripted(in)
		return !ok
	})).Return(a.unscripted).Maybe()
	return a
}

// llm is LLMAction with its attempt events discarded (they would go to
// slog.Default, the test's output).
var llm = workflows.New(workflows.Options{Events: slog.New(slog.DiscardHandler)})

// llmAction is LLMAction, after noting the call name it runs under.
func (a *Actions) llmAction(ctx workflow.Context, in workflows.ActionInput) (workflows.ActionResult, error) {
	a.bind(workflow.GetInfo(ctx))
	return llm(ctx, in)
}

// bind records the call name an action was started under: its id less
// its parent's id and "-" (step.ActionID), or the id itself.
func (a *Actions) bind(info *workflow.Info) {
	id := info.WorkflowExecution.ID
	name := id
	if p := info.ParentWorkflowExecution; p != nil {
		name = strings.TrimPrefix(id, step.ActionID(p.ID, ""))
	}
	a.mu.Lock()
	a.calls[id] = name
	a.mu.Unlock()
}

// scripted finds the script for an attempt: by the action's id, else by
// its call name.
func (a *Actions) scripted(in attempt.Input) (Attempt, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.scripts[in.ActionRef]
	if !ok {
		s, ok = a.scripts[a.calls[in.ActionRef]]
	}
	if !ok || in.Attempt < 1 || in.Attempt > len(s) {
		return Attempt{}, false
	}
	return s[in.Attempt-1], true
}

// On scripts the attempts of the call named name (or of the action with
// that id), one Attempt per attempt in order. A call whose attempts run
// past its script fails the test. Script each name once.
func (a *Actions) On(name string, attempts ...Attempt) {
	a.mu.Lock()
	if _, dup := a.scripts[name]; dup {
		a.mu.Unlock()
		a.t.Fatalf("actiontest: %q is scripted twice", name)
		return
	}
	a.scripts[name] = attempts
	a.mu.Unlock()
	for i, at := range attempts {
		n := i + 1
		var started attempt.Input // the matched attempt, kept for AfterFn
		var startedMu sync.Mutex
		c := a.env.OnActivity(attempt.CallModel, mock.Anything, mock.MatchedBy(func(in attempt.Input) bool {
			if in.Attempt != n || !a.named(in.ActionRef, name) {
				return false
			}
			startedMu.Lock()
			started = in
			startedMu.Unlock()
			return true
		})).Return(func(ctx context.Context, in attempt.Input) (attempt.Outcome, error) {
			return a.run(ctx, at, in)
		}).Once()
		c.AfterFn(func() time.Duration {
			startedMu.Lock()
			in := started
			startedMu.Unlock()
			return a.start(at, in)
		})
	}
}

// named reports whether the action id is name, or was called under it.
func (a *Actions) named(id, name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return id == name || a.calls[id] == name
}

// Route declares what DescribeRoutes answers for a route (its kind,
// model, capabilities). A route not declared is an "openai" route whose
// model is its name and which declares tools, structured output,
// streaming and vision, so no action skips it.
func (a *Actions) Route(r attempt.RouteInfo) {
	a.mu.Lock()
	a.routes[r.Name] = r
	a.mu.Unlock()
}

func (a *Actions) route(name string) attempt.RouteInfo {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r, ok := a.routes[name]; ok {
		return r
	}
	return attempt.RouteInfo{Name: name, Kind: "openai", Model: name,
		Capabilities: providers.Capabilities{Tools: true, StructuredOutput: true, Streaming: true, Vision: true}}
}

// describeRoutes is DescribeRoutes for the scripted routes, with no
// search attributes. The worker has a reconciler for a call one of whose
// attempts scripts its answer (ThenReconciler); for any other, verdicts
// come from the script or the test.
func (a *Actions) describeRoutes(ctx context.Context, in attempt.PlanInput) (attempt.Plan, error) {
	p := attempt.Plan{StateUpserts: attempt.CurrentStateUpserts, DeadlineTimer: attempt.CurrentDeadlineTimer}
	for _, name := range in.Routes {
		p.Routes = append(p.Routes, a.route(name))
	}
	p.Reconciler = a.asksReconciler(activity.GetInfo(ctx).WorkflowExecution.ID)
	return p, nil
}

// asksReconciler reports whether an attempt of the action id's script
// has the worker's reconciler answer.
func (a *Actions) asksReconciler(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.scripts[id]
	if !ok {
		s = a.scripts[a.calls[id]]
	}
	return slices.ContainsFunc(s, func(at Attempt) bool { return at.reconciler != nil })
}

// reconciler is the worker's reconciler (the Reconcile activity): the
// attempt's scripted answer (ThenReconciler), its completed response
// stored by reference when too large for history, as a worker does; or,
// for an attempt with none, an answer that cannot tell.
func (a *Actions) reconciler(_ context.Context, in attempt.ReconcileInput) (attempt.ReconcileOutput, error) {
	at, ok := a.scripted(attempt.Input{ActionRef: in.ActionRef, Attempt: in.Attempt})
	if !ok || at.reconciler == nil {
		return attempt.ReconcileOutput{Note: "actiontest: no reconciler answer scripted for this attempt"}, nil
	}
	out := *at.reconciler
	if out.Verdict == attempt.VerdictCompleted && out.Response != nil && large(out.Response) {
		out.Response, out.ResultRef = nil, a.store(out.Response)
	}
	return out, nil
}

// unscripted answers an attempt nobody scripted: the test fails, and the
// attempt fails as an activity.
func (a *Actions) unscripted(_ context.Context, in attempt.Input) (attempt.Outcome, error) {
	a.mu.Lock()
	name := a.calls[in.ActionRef]
	a.given[in.ActionRef] = append(a.given[in.ActionRef], in)
	a.mu.Unlock()
	err := fmt.Errorf("actiontest: attempt %d of call %q (action %s) is not scripted", in.Attempt, name, in.ActionRef)
	a.t.Error(err)
	return attempt.Outcome{}, temporal.NewNonRetryableApplicationError(err.Error(), "Unscripted", nil)
}

// Sent returns what each attempt of the call named name (or of the
// action with that id) was given to send, in the order they started,
// scripted or not: its route, its request, its idempotency key, the
// connections it had to avoid. Nil when none started. A test asserts with
// it what the workflow under test asked the model (Request for the
// request alone).
func (a *Actions) Sent(name string) []attempt.Input {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ids []string
	for id := range a.given {
		if id == name || a.calls[id] == name {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	var out []attempt.Input
	for _, id := range ids {
		out = append(out, a.given[id]...)
	}
	return out
}

// Request returns the request the call named name (or the action with
// that id) sent: every attempt of an action sends the same one. A call
// that sent nothing fails the test, and gets the zero Request.
func (a *Actions) Request(name string) providers.Request {
	sent := a.Sent(name)
	if len(sent) == 0 {
		a.t.Errorf("actiontest: call %q sent no request", name)
		return providers.Request{}
	}
	return sent[0].Request
}

// AssertExpectations fails t (Errorf) for each scripted attempt that
// never ran, naming its call and number, and reports whether every one
// ran. Call it after ExecuteWorkflow. env.AssertExpectations checks the
// same along with the test's own mocks, less legibly (each scripted
// attempt is a CallModel mock called once); attempts past a script fail
// the test as they run, whatever either says.
func (a *Actions) AssertExpectations(t testing.TB) bool {
	t.Helper()
	a.mu.Lock()
	names := slices.Sorted(maps.Keys(a.scripts))
	ran := map[string]int{}
	for id, ins := range a.given {
		for _, in := range ins {
			for _, name := range []string{id, a.calls[id]} {
				if _, ok := a.scripts[name]; ok {
					ran[name] = max(ran[name], in.Attempt)
				}
			}
		}
	}
	scripts := maps.Clone(a.scripts)
	a.mu.Unlock()
	ok := true
	for _, name := range names {
		for n := ran[name] + 1; n <= len(scripts[name]); n++ {
			t.Errorf("actiontest: call %q: attempt %d of %d never ran", name, n, len(scripts[name]))
			ok = false
		}
	}
	return ok
}

// Reconcile delivers a verdict to the action of call name (or id) through
// the reconcile Update, as Client.Reconcile does; call it from a
// callback (env.RegisterDelayedCallback) while the action awaits one. A
// rejected verdict fails the test. An attempt of 0 means the attempt
// awaiting the verdict.
func (a *Actions) Reconcile(name string, r workflows.ReconcileRequest) {
	a.mu.Lock()
	id := name
	for ref, n := range a.calls {
		if n == name {
			id = ref
		}
	}
	a.mu.Unlock()
	a.reconcile(id, r)
}

// signalVerdict sends a verdict to action id by the reconcile signal.
func (a *Actions) signalVerdict(id string, r workflows.ReconcileRequest) {
	if r.By == "" {
		r.By = "actiontest"
	}
	if err := a.env.SignalWorkflowByID(id, workflows.SignalReconcile, r); err != nil {
		a.t.Errorf("actiontest: signal the %s verdict to %s: %v", r.Verdict, id, err)
	}
}

func (a *Actions) reconcile(id string, r workflows.ReconcileRequest) {
	if r.Attempt == 0 {
		v, err := a.env.QueryWorkflowByID(id, workflows.QueryStatus)
		var st workflows.Status
		if err == nil {
			err = v.Get(&st)
		}
		if err != nil {
			a.t.Errorf("actiontest: status of %s: %v", id, err)
			return
		}
		r.Attempt = st.AwaitingAttempt
	}
	if r.By == "" {
		r.By = "actiontest"
	}
	err := a.env.UpdateWorkflowByID(id, workflows.UpdateReconcile, "actiontest-"+id+"-"+strconv.Itoa(r.Attempt), &testsuite.TestUpdateCallback{
		OnReject: func(err error) { a.t.Errorf("actiontest: the %s verdict for %s was rejected: %v", r.Verdict, id, err) },
		OnAccept: func() {},
		OnComplete: func(_ any, err error) {
			if err != nil {
				a.t.Errorf("actiontest: the %s verdict for %s failed: %v", r.Verdict, id, err)
			}
		},
	}, r)
	if err != nil {
		a.t.Errorf("actiontest: reconcile %s: %v", id, err)
	}
}

// Attempt is what one scripted attempt does. Build one with Answer,
// Respond, Partial, Refused, Misdirected, Throttled, ServerError,
// Rejected, ContentFiltered, Ambiguous, Hold or HoldAfter, and adjust it
// with its methods, which return a copy.
type Attempt struct {
	kind     kind
	response providers.Response
	status   int
	retry    time.Duration
	taking   time.Duration

	verdict      *workflows.ReconcileRequest
	verdictAfter time.Duration
	bySignal     bool
	reconciler   *attempt.ReconcileOutput
	cancelAfter  time.Duration
	byReference  bool
}

type kind int

const (
	kindAnswer kind = iota
	kindPartial
	kindRefused
	kindMisdirected
	kindStatus
	kindAmbiguous
	kindHold
	kindHoldAfter
	kindFiltered
)

// Answer completes the attempt with text: the action ends completed with
// a response whose Text it is.
func Answer(text string) Attempt {
	return Respond(providers.Response{Text: text, FinishReason: "stop"})
}

// Respond completes the attempt with r, for a response with tool calls
// (r.ToolCalls, the OpenAI "tool_calls" array) or a refusal.
func Respond(r providers.Response) Attempt { return Attempt{kind: kindAnswer, response: r} }

// Partial delivers text and then loses the stream (a reset). On a
// streamed request the attempt is committed_partial and the action ends
// completed_partial with the text and Incomplete "reset". On a request
// that is not streamed nothing reaches the caller before the whole body,
// so a body cut short is what a real worker makes of it: no content,
// ambiguous (body_failed_before_content), and the action awaits a
// verdict (ThenVerdict).
func Partial(text string) Attempt {
	return Attempt{kind: kindPartial, response: providers.Response{Text: text, Partial: true, Incomplete: providers.IncompleteReset}}
}

// Refused is a GOAWAY NO_ERROR above the attempt's stream: provably not
// processed, so the action retries at once on a fresh connection (a
// transport retry).
func Refused() Attempt { return Attempt{kind: kindRefused} }

// Misdirected is a 421: the action retries once on a fresh connection; a
// second one ends it failed (misdirected_repeated).
func Misdirected() Attempt { return Attempt{kind: kindMisdirected} }

// Throttled is a 429 with the given Retry-After (zero: none): the action
// backs off, then retries or falls back.
func Throttled(retryAfter time.Duration) Attempt {
	return Attempt{kind: kindStatus, status: 429, retry: retryAfter}
}

// ServerError is a 5xx other than 503 and 504 before any content
// (upstream_error): the action backs off, then retries or falls back.
func ServerError(status int) Attempt { return Attempt{kind: kindStatus, status: status} }

// Rejected is a 4xx other than 408, 421 and 429: the request is wrong,
// and the action ends rejected.
func Rejected(status int) Attempt { return Attempt{kind: kindStatus, status: status} }

// ContentFiltered is the provider's content filter blocking the request:
// a 400 whose error object has code "content_filter" (as Azure OpenAI
// answers a prompt its filter takes). The action ends rejected, outcome
// content_filtered, with no retry and no fallback (another route would
// only route around the filter), and the error object as its response.
func ContentFiltered() Attempt { return Attempt{kind: kindFiltered, status: 400} }

// Ambiguous is a connection closed after the request left, with no
// GOAWAY: the provider may have executed it, so the action awaits a
// reconciliation verdict (ThenVerdict, Actions.Reconcile) until its
// reconcile_timeout.
func Ambiguous() Attempt { return Attempt{kind: kindAmbiguous} }

// Hold is an attempt the provider keeps generating, with nothing sent
// back, until the action is canceled (CanceledAfter, a cancel of the
// calling workflow, a cancel signal) or the attempt's timeout. Canceled,
// it settles a second after the cancel (as the real attempt's heartbeat
// delivers it) with its evidence (the request sent, on its connection and
// stream), classified canceled, with no move of health: the action ends
// canceled. Timed out, it is ambiguous.
func Hold() Attempt { return Attempt{kind: kindHold} }

// HoldAfter delivers text on a stream and then holds, as Hold does: the
// provider has sent part of its answer and goes on generating. The
// content committed the attempt, so canceled it ends canceled after the
// commit: the action ends canceled with the text delivered (response
// partial, Incomplete "canceled"); timed out, completed_partial. On a
// request that is not streamed nothing reaches the caller before the
// whole body, and it is Hold.
func HoldAfter(text string) Attempt {
	return Attempt{kind: kindHoldAfter, response: providers.Response{Text: text, Partial: true}}
}

// Taking makes the attempt last d of virtual time before it ends. A
// cancel meanwhile settles it as it would Hold.
func (at Attempt) Taking(d time.Duration) Attempt {
	at.taking = d
	return at
}

// ThenVerdict delivers verdict v (not_executed, allow_replay or abandon)
// through the reconcile Update after the attempt has been awaiting it for
// after (zero means a second), as a person or program would. For a
// completed verdict use ThenReconciled.
func (at Attempt) ThenVerdict(v attempt.Verdict, after time.Duration) Attempt {
	at.verdict, at.verdictAfter = &workflows.ReconcileRequest{Verdict: v}, after
	return at
}

// ThenReconciled delivers a completed verdict with r after the attempt
// has been awaiting it for after (zero means a second): the action ends
// reconciled with r.
func (at Attempt) ThenReconciled(r providers.Response, after time.Duration) Attempt {
	at.verdict, at.verdictAfter = &workflows.ReconcileRequest{Verdict: attempt.VerdictCompleted, Response: &r}, after
	return at
}

// BySignal delivers the verdict of ThenVerdict or ThenReconciled through
// the reconcile signal instead of the Update, as a program that sends it
// fire-and-forget does (temporal workflow signal --name reconcile). The
// action records it as a person's, via signal.
func (at Attempt) BySignal() Attempt {
	at.bySignal = true
	return at
}

// ThenReconciler has the worker's own reconciler answer out for this
// attempt, once it is ambiguous: a journal, a provider's record or an
// application's reconciler (activities.Reconciler), as out.By says
// (attempt.ByJournal, ByProvider; empty means ByReconciler). The worker
// then has a reconciler, so every ambiguous attempt of the call asks it
// first (one not scripted so gets an answer that cannot tell). A verdict
// settles the attempt as that source's (a completed one with a response
// too large for history by reference); out.Verdict empty means it cannot
// tell (out.Note says why), and the action waits for a person's
// (ThenVerdict).
func (at Attempt) ThenReconciler(out attempt.ReconcileOutput) Attempt {
	at.reconciler = &out
	return at
}

// ByReference stores the attempt's answer in the result store, as a
// worker stores one too large for history, whatever its size: the
// action's result has ResultRef and no Response, and Actions.Results
// resolves it. An answer over resultstore.DefaultThreshold (256 KiB of
// JSON) is stored so without asking, as on a durallm worker.
func (at Attempt) ByReference() Attempt {
	at.byReference = true
	return at
}

// CanceledAfter cancels the action through Temporal d after this attempt
// started, as a canceled parent does (origin parent_canceled); meant for
// a Hold or HoldAfter.
func (at Attempt) CanceledAfter(d time.Duration) Attempt {
	at.cancelAfter = d
	return at
}

// defaultHold is how long a Hold lasts when nothing cancels it and the
// attempt has no timeout of its own (the workflow always sets one).
const defaultHold = 60 * time.Second

// held reports whether the attempt runs until a cancel or its timeout.
func (at Attempt) held() bool { return at.kind == kindHold || at.kind == kindHoldAfter }

// start runs when the attempt starts (virtual time): it puts the attempt
// on its connection and says how long it lasts.
func (a *Actions) start(at Attempt, in attempt.Input) time.Duration {
	conn, stream, fresh := a.connFor(in)
	a.mu.Lock()
	a.wires[in.AttemptID] = &wire{conn: conn, stream: stream, fresh: fresh}
	a.given[in.ActionRef] = append(a.given[in.ActionRef], in)
	intercepted := a.intercepted[in.AttemptID]
	a.mu.Unlock()
	if !intercepted {
		a.t.Errorf("actiontest: attempt %d of %s ran without actiontest's interceptor: worker options set after Register must have actions.Interceptor() among their Interceptors", in.Attempt, in.ActionRef)
	}
	d := at.taking
	if at.held() && d == 0 {
		d = in.Timeout
		if d <= 0 {
			d = defaultHold
		}
	}
	if at.cancelAfter > 0 {
		id := in.ActionRef
		a.env.RegisterDelayedCallback(func() { a.env.CancelWorkflowByID(id, "") }, at.cancelAfter)
		// The cancel settles the attempt a little later (Interceptor);
		// the mocked activity need not outlast it.
		d = min(d, at.cancelAfter+cancelDelivery)
	}
	return d
}

// sentEvidence is the evidence of an attempt whose request left on its wire: the
// route, the connection and stream, the request's size.
func (a *Actions) sentEvidence(in attempt.Input, route attempt.RouteInfo, w wire) evidence.Evidence {
	body, _ := json.Marshal(in.Request)
	return evidence.Evidence{
		ActionRef: in.ActionRef, Attempt: in.Attempt, AttemptID: in.AttemptID, Route: in.Route,
		Provider: route.Kind, Model: route.Model, Authority: "provider.actiontest.invalid:443", HTTPVersion: "HTTP/2.0",
		ConnRef: w.conn, ConnFresh: w.fresh, AfterMisdirected: in.AfterMisdirected,
		RequestSent: true, StreamID: w.stream, RequestBytes: int64(len(body)),
	}
}

// wireOf is the attempt's wire, and whether a cancel has settled it.
func (a *Actions) wireOf(in attempt.Input) (wire, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w, ok := a.wires[in.AttemptID]
	if !ok {
		return wire{}, false
	}
	return *w, w.settled
}

// errSettled is what the mocked activity of an attempt a cancel settled
// returns; it goes nowhere (the environment has dropped the activity).
var errSettled = temporal.NewCanceledError()

// run ends the attempt as scripted: its outcome, from evidence the real
// engine would have recorded, classified by evidence.Classify.
func (a *Actions) run(_ context.Context, at Attempt, in attempt.Input) (attempt.Outcome, error) {
	w, settled := a.wireOf(in)
	if settled {
		return attempt.Outcome{}, errSettled
	}
	route := a.route(in.Route)
	ev := a.sentEvidence(in, route, w)
	defer func() {
		if ev.ConnClosed || ev.GoAway != nil || ev.Status == 421 {
			a.dropConn(w.conn)
		}
	}()
	var resp *providers.Response
	switch at.kind {
	case kindAnswer:
		r := a.response(at, in, route)
		ev.ResponseHeaders, ev.Status, ev.ContentStarted, ev.ResponseBytes = true, 200, true, int64(len(r.Raw))
		ev.FirstByte = max(at.taking, time.Millisecond)
		if in.Request.Stream {
			ev.ResponseBytes = int64(len(r.Text)) + 100
		}
		resp = &r
	case kindPartial, kindHoldAfter:
		if !in.Request.Stream {
			if at.kind == kindHoldAfter {
				ev.TimedOut = true
				break
			}
			// A JSON body cut short: headers and part of a body, no
			// usable answer, so nothing committed.
			ev.ResponseHeaders, ev.Status, ev.ResponseBytes = true, 200, int64(len(at.response.Text))+60
			ev.RSTStream = code(evidence.CodeInternalError)
			ev.BodyFailed, ev.Signal = true, evidence.SignalEmptyResponse
			break
		}
		r := a.response(at, in, route)
		ev.ResponseHeaders, ev.Status, ev.ContentStarted = true, 200, true
		ev.ResponseBytes, ev.FirstByte = int64(len(r.Text))+100, time.Millisecond
		ev.Signal = evidence.SignalStreamIncomplete
		if at.kind == kindPartial {
			ev.RSTStream, ev.BodyFailed = code(evidence.CodeInternalError), true
		} else {
			// The attempt's own timer ended the stream mid-body.
			ev.TimedOut, ev.BodyFailed, r.Incomplete = true, true, providers.IncompleteAttemptTimeout
		}
		resp = &r
	case kindRefused:
		// As a provider draining its connection answers the first stream.
		ev.GoAway = &evidence.GoAway{LastStreamID: max(w.stream, 2) - 2, Code: evidence.CodeNoError, DebugLen: len("actiontest")}
		ev.ConnClosed, ev.Signal = true, evidence.SignalEmptyResponse
	case kindMisdirected:
		// The body is the provider's own error object, as a provider sends.
		ev.ResponseHeaders, ev.Status, ev.ResponseBytes, ev.ProviderError = true, 421, int64(len(errorBody)), true
	case kindStatus:
		ev.ResponseHeaders, ev.Status, ev.RetryAfter, ev.ResponseBytes, ev.ProviderError = true, at.status, at.retry, int64(len(errorBody)), true
	case kindFiltered:
		ev.ResponseHeaders, ev.Status, ev.ResponseBytes, ev.ProviderError = true, at.status, int64(len(filteredBody)), true
		ev.Signal = evidence.SignalContentFiltered
	case kindAmbiguous:
		// The activity finds no usable body where the connection ended.
		ev.ConnClosed, ev.Signal = true, evidence.SignalEmptyResponse
	case kindHold:
		ev.TimedOut = true
	}
	if ev.TimedOut && !ev.ContentStarted {
		ev.Signal = evidence.SignalEmptyResponse
	}
	ev.Elapsed = max(ev.Elapsed, at.taking, time.Millisecond)
	out := attempt.Outcome{Evidence: ev, Classification: evidence.Classify(ev)}
	if resp != nil && resp.Usage.Reported() {
		// As the real activity does, whatever becomes of the response.
		u := resp.Usage
		out.Usage = &u
	}
	switch out.Classification.Class {
	case evidence.Completed, evidence.CommittedPartial:
		out.Response = resp
		if at.byReference || large(resp) {
			out.Response, out.ResponseRef = nil, a.store(resp)
		}
	case evidence.Rejected:
		// As the real activity does: the provider's error object is the
		// caller's answer.
		out.Response = &providers.Response{Error: &providers.APIError{Type: errorType, Message: errorMessage}}
	case evidence.ContentFiltered:
		out.Response = &providers.Response{Error: &providers.APIError{Code: filteredCode, Param: "prompt", Message: errorMessage}}
	}
	if at.verdict != nil {
		v := *at.verdict
		v.Attempt = in.Attempt
		after := at.verdictAfter
		if after <= 0 {
			after = time.Second
		}
		id, bySignal := in.ActionRef, at.bySignal
		a.env.RegisterDelayedCallback(func() {
			if bySignal {
				a.signalVerdict(id, v)
				return
			}
			a.reconcile(id, v)
		}, after)
	}
	return out, nil
}

// large reports whether a worker would store r by reference: its JSON is
// over resultstore.DefaultThreshold.
func large(r *providers.Response) bool {
	b, err := json.Marshal(r)
	return err == nil && len(b) > resultstore.DefaultThreshold
}

// store puts r in the actions' result store and returns its reference.
func (a *Actions) store(r *providers.Response) string {
	b, err := json.Marshal(r)
	if err == nil {
		var ref string
		if ref, err = a.Results().Put(context.Background(), b); err == nil {
			return ref
		}
	}
	a.t.Errorf("actiontest: store a response by reference: %v", err)
	return ""
}

// Results is the result store the scripted attempts keep answers stored
// by reference in (ByReference, or over resultstore.DefaultThreshold): a
// resultstore.Dir in a directory of the test's, whose references are a
// worker's ("file:<sha256>"). Hand it to the code under test that
// resolves a reference (durallm.Client.WithResults, an activity of
// yours).
func (a *Actions) Results() resultstore.Store {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.results == nil {
		a.results = &resultstore.Dir{Path: a.t.TempDir()}
	}
	return a.results
}

// canceled is the outcome of a started attempt a cancel reached after it
// had been running for elapsed: canceled with what it had done, the text
// it had delivered if any. ok is false for an attempt that never started.
func (a *Actions) canceled(in attempt.Input, elapsed time.Duration) (out attempt.Outcome, ok bool) {
	at, scripted := a.scripted(in)
	a.mu.Lock()
	w := a.wires[in.AttemptID]
	if w != nil {
		w.settled = true
	}
	a.mu.Unlock()
	if !scripted || w == nil {
		return attempt.Outcome{}, false
	}
	route := a.route(in.Route)
	ev := a.sentEvidence(in, route, *w)
	ev.Canceled, ev.Stop, ev.Elapsed = true, evidence.StopScope, elapsed
	ev.Signal = evidence.SignalEmptyResponse
	if at.kind == kindHoldAfter && in.Request.Stream {
		r := a.response(at, in, route)
		r.Incomplete = providers.IncompleteCanceled
		ev.ResponseHeaders, ev.Status, ev.ContentStarted = true, 200, true
		ev.ResponseBytes, ev.FirstByte = int64(len(r.Text))+100, time.Millisecond
		ev.Signal = evidence.SignalStreamIncomplete
		out.Response = &r
	}
	out.Evidence, out.Classification = ev, evidence.Classify(ev)
	return out, true
}

func code(c evidence.ErrCode) *evidence.ErrCode { return &c }

// connFor picks the attempt's connection as the engine's pool would: the
// one in use, unless the attempt must avoid it or asks for a fresh one.
func (a *Actions) connFor(in attempt.Input) (ref string, stream uint32, fresh bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ref = "actiontest-c" + strconv.Itoa(a.conn)
	if a.conn == 0 || in.FreshConnection || slices.Contains(in.Avoid, ref) {
		a.conns++
		a.conn, a.nextStream, fresh = a.conns, 1, true
		ref = "actiontest-c" + strconv.Itoa(a.conn)
	}
	stream = uint32(a.nextStream)
	a.nextStream += 2
	return ref, stream, fresh
}

// dropConn retires a connection that saw a GOAWAY, a 421 or its end.
func (a *Actions) dropConn(ref string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ref == "actiontest-c"+strconv.Itoa(a.conn) {
		a.conn = 0
	}
}

// errorBody is the body of a scripted error status, filteredBody that of
// a request the content filter blocked.
const (
	errorBody    = `{"error":{"type":"` + errorType + `","message":"` + errorMessage + `"}}`
	filteredBody = `{"error":{"code":"` + filteredCode + `","param":"prompt","message":"` + errorMessage + `","status":400}}`
)

// The scripted error object's type and message, and a content filter's
// code.
const (
	errorType    = "invalid_request_error"
	errorMessage = "scripted by actiontest"
	filteredCode = "content_filter"
)

// response is the scripted response as the provider layer would have read
// it: the provider's id, model and token counts, and for a response that
// was not streamed its whole body (Raw), whose assistant message has no
// content member when there is no text (a tool call).
func (a *Actions) response(at Attempt, in attempt.Input, route attempt.RouteInfo) providers.Response {
	r := at.response
	a.mu.Lock()
	n := a.conns
	a.mu.Unlock()
	if r.ID == "" {
		r.ID = "chatcmpl-actiontest-" + strconv.Itoa(n)
	}
	if r.Model == "" {
		r.Model = route.Model
	}
	if r.FinishReason == "" && !r.Partial {
		r.FinishReason = "stop"
		if len(r.ToolCalls) > 0 {
			r.FinishReason = "tool_calls"
		}
	}
	if r.Usage == (providers.Usage{}) && !r.Partial {
		body, _ := json.Marshal(in.Request)
		r.Usage = providers.Usage{PromptTokens: len(body) / 4, CompletionTokens: len(strings.Fields(r.Text)) + 1}
		r.Usage.TotalTokens = r.Usage.PromptTokens + r.Usage.CompletionTokens
	}
	if r.Raw == nil && !in.Request.Stream && !r.Partial {
		msg := map[string]any{"role": "assistant"}
		if r.Text != "" || len(r.ToolCalls) == 0 {
			msg["content"] = r.Text
		}
		if len(r.ToolCalls) > 0 {
			msg["tool_calls"] = r.ToolCalls
		}
		r.Raw, _ = json.Marshal(map[string]any{
			"id": r.ID, "object": "chat.completion", "created": time.Now().Unix(), "model": r.Model,
			"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": r.FinishReason}},
			"usage":   map[string]int{"prompt_tokens": r.Usage.PromptTokens, "completion_tokens": r.Usage.CompletionTokens, "total_tokens": r.Usage.TotalTokens},
		})
	}
	return r
}
