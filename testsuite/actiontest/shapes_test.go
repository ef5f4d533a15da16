package actiontest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/worker"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/testsuite/actiontest"
	"github.com/durallm/durallm/workflows"
)

// ask is the request these tests make, streamed or not.
func ask(stream bool) workflows.ActionInput {
	return workflows.ActionInput{
		Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "say hello")}, Stream: stream},
		Routes:  []string{"primary", "fallback"},
	}
}

// A scripted tool call's body is a provider's: the assistant message has
// no content member at all, as a real one that calls a tool.
func TestAScriptedToolCallHasNoRawContent(t *testing.T) {
	env := newEnv(t)
	actiontest.Register(t, env).On("ask", actiontest.Respond(providers.Response{ToolCalls: json.RawMessage(`[{"id":"call_1","type":"function","function":{"name":"lookup","arguments":"{}"}}]`)}))
	c := execute(t, env, ask(false))
	var body struct {
		Choices []struct {
			Message map[string]json.RawMessage `json:"message"`
		} `json:"choices"`
	}
	if c.Err || c.Result.Response == nil || json.Unmarshal(c.Result.Response.Raw, &body) != nil || len(body.Choices) != 1 {
		t.Fatalf("call %+v", c)
	}
	if content, ok := body.Choices[0].Message["content"]; ok {
		t.Fatalf("the tool call's message has content %s; a provider's has none", content)
	}
}

// Partial on a request that is not streamed is what the real action does
// with a JSON body cut short: nothing reached the caller before the whole
// body, so nothing committed, and the attempt is ambiguous; never
// completed_partial, which the real action reaches only on a stream.
func TestPartialOnANonStreamedRequestIsWhatTheRealActionReturns(t *testing.T) {
	env := newEnv(t)
	actiontest.Register(t, env).On("ask", actiontest.Partial("chunk1 chunk2"))
	in := ask(false)
	in.ReconcileTimeout = time.Minute
	c := execute(t, env, in)
	a := c.Result.Attempts[0]
	if c.Result.State != workflows.StateIndeterminate || a.Classification.Class != evidence.Ambiguous || a.Evidence.ContentStarted || c.Result.Response != nil {
		t.Fatalf("state %s, attempt %s (%s), content started %v, response %+v", c.Result.State, a.Classification.Class, a.Classification.Reason, a.Evidence.ContentStarted, c.Result.Response)
	}
}

// A canceled attempt settles as on a Temporal server: with its evidence
// (the request sent, on its connection and stream) a second after the
// cancel, when the real attempt's heartbeat has delivered it. The SDK's
// test environment by itself settles a canceled activity at once, with
// nothing.
func TestAScriptedCancelKeepsItsEvidenceAndEndsASecondAfterTheCancel(t *testing.T) {
	for _, tt := range []struct {
		name         string
		attempt      actiontest.Attempt
		cancelParent bool
	}{
		{"the action canceled through Temporal", actiontest.Hold().CanceledAfter(time.Second), false},
		{"the parent canceled", actiontest.Hold(), true},
		{"the parent canceled during an answer", actiontest.Answer("late").Taking(time.Minute), true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t)
			actiontest.Register(t, env).On("ask", tt.attempt)
			if tt.cancelParent {
				env.RegisterDelayedCallback(env.CancelWorkflow, time.Second)
			}
			c := execute(t, env, ask(false))
			a := c.Result.Attempts[0]
			ev := a.Evidence
			if c.Result.State != workflows.StateCanceled || a.Classification.Class != evidence.Canceled || ev.Stop != evidence.StopScope ||
				!ev.RequestSent || ev.ConnRef == "" || ev.StreamID == 0 || ev.HTTPVersion == "" {
				t.Fatalf("state %s, attempt %+v", c.Result.State, a)
			}
			if a.Duration != 2*time.Second || ev.Elapsed != 2*time.Second {
				t.Fatalf("the attempt settled after %s (elapsed %s), want 2s: a second after the cancel", a.Duration, ev.Elapsed)
			}
		})
	}
}

// A cancel after the commit: the stream had delivered text when the
// parent was canceled, so the action ends canceled with that text, as the
// contract's cancel after the commit says (response partial, incomplete
// canceled), and step.Call's error carries it.
func TestACancelAfterTheCommitCanBeScripted(t *testing.T) {
	env := newEnv(t)
	actiontest.Register(t, env).On("ask", actiontest.HoldAfter("Hello, wor"))
	env.RegisterDelayedCallback(env.CancelWorkflow, time.Second)
	c := execute(t, env, ask(true))
	r := c.Result.Response
	if c.Action == nil || c.Action.State != workflows.StateCanceled || c.Action.Origin != workflows.OriginParentCanceled ||
		r == nil || r.Text != "Hello, wor" || !r.Partial || r.Incomplete != providers.IncompleteCanceled || !c.Result.Attempts[0].Evidence.ContentStarted {
		t.Fatalf("call %+v, response %+v", c, r)
	}
}

// A request the provider's content filter blocked: the action ends
// rejected, outcome content_filtered, with the provider's error object
// as its response (a gateway passes it back).
func TestContentFilteredCanBeScripted(t *testing.T) {
	env := newEnv(t)
	actiontest.Register(t, env).On("ask", actiontest.ContentFiltered())
	c := execute(t, env, ask(false))
	r := c.Result.Response
	if c.Action == nil || c.Action.State != workflows.StateRejected || c.Action.Outcome != string(evidence.ContentFiltered) || r == nil || r.Error == nil || r.Error.Code != "content_filter" {
		t.Fatalf("call %+v, response %+v", c, r)
	}
}

// An answer stored by reference, as a worker stores one too large for
// history: the result carries a reference and no response, and the
// actions' result store (a real one) resolves it to the answer.
func TestAnAnswerStoredByReferenceCanBeScripted(t *testing.T) {
	for _, tt := range []struct {
		name    string
		attempt actiontest.Attempt
		text    string
	}{
		{"asked for", actiontest.Answer("a short answer").ByReference(), "a short answer"},
		{"too large for history", actiontest.Answer(strings.Repeat("many words ", 30000)), strings.Repeat("many words ", 30000)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t)
			actions := actiontest.Register(t, env)
			actions.On("ask", tt.attempt)
			c := execute(t, env, ask(false))
			if c.Err || c.Result.State != workflows.StateCompleted || c.Result.Response != nil || c.Result.ResultRef == "" {
				t.Fatalf("state %s, response %v, ref %q", c.Result.State, c.Result.Response != nil, c.Result.ResultRef)
			}
			b, err := actions.Results().Get(context.Background(), c.Result.ResultRef)
			if err != nil {
				t.Fatal(err)
			}
			var r providers.Response
			if err := json.Unmarshal(b, &r); err != nil || r.Text != tt.text || r.FinishReason != "stop" {
				t.Fatalf("stored response %.80q (%v)", r.Text, err)
			}
		})
	}
}

// The worker's own reconciler settles an ambiguous attempt, as a
// journal, a provider's record or an application's reconciler does on a
// real worker: the verdict is recorded as theirs, and a person is asked
// only when it cannot tell.
func TestAVerdictFromTheWorkersReconcilerCanBeScripted(t *testing.T) {
	env := newEnv(t)
	actiontest.Register(t, env).On("ask", actiontest.Ambiguous().ThenReconciler(attempt.ReconcileOutput{
		Verdict: attempt.VerdictCompleted, Response: &providers.Response{Text: "from the journal"}, By: attempt.ByJournal, JournalState: "received"}))
	c := execute(t, env, ask(false))
	a := c.Result.Attempts[0]
	if c.Err || c.Result.State != workflows.StateReconciled || c.Result.Response == nil || c.Result.Response.Text != "from the journal" ||
		a.Verdict != attempt.VerdictCompleted || a.VerdictBy != attempt.ByJournal || a.JournalState != "received" {
		t.Fatalf("call %+v", c)
	}

	// A completed verdict too large for history comes by reference, as
	// the worker's reconciler stores it.
	env = newEnv(t)
	actions := actiontest.Register(t, env)
	large := strings.Repeat("many words ", 30000)
	actions.On("ask", actiontest.Ambiguous().ThenReconciler(attempt.ReconcileOutput{Verdict: attempt.VerdictCompleted, Response: &providers.Response{Text: large}}))
	c = execute(t, env, ask(false))
	if c.Result.State != workflows.StateReconciled || c.Result.Response != nil || c.Result.ResultRef == "" || c.Result.Attempts[0].VerdictBy != attempt.ByReconciler {
		t.Fatalf("state %s, response %v, ref %q", c.Result.State, c.Result.Response != nil, c.Result.ResultRef)
	}
	if b, err := actions.Results().Get(context.Background(), c.Result.ResultRef); err != nil || !strings.Contains(string(b), "many words") {
		t.Fatalf("stored verdict: %v", err)
	}
}

// A verdict by the reconcile signal, the fire-and-forget way a program
// may send one: the notes say so.
func TestAVerdictBySignalCanBeScripted(t *testing.T) {
	env := newEnv(t)
	actiontest.Register(t, env).On("ask", actiontest.Ambiguous().ThenVerdict(attempt.VerdictAbandon, time.Minute).BySignal())
	c := execute(t, env, ask(false))
	if c.Action == nil || c.Action.State != workflows.StateIndeterminate || c.Result.Attempts[0].VerdictBy != "person" ||
		!strings.Contains(fmt.Sprint(c.Result.Notes), "reconcile abandon by actiontest via signal for attempt 1") {
		t.Fatalf("call %+v", c)
	}
}

// Sent is what each attempt of a call was given to send, in order: what a
// test asserts about the request a workflow built (the messages, the
// tools, a tool's result sent back).
func TestSentIsWhatEachAttemptOfACallWasGiven(t *testing.T) {
	env := newEnv(t)
	actions := actiontest.Register(t, env)
	actions.On("ask", actiontest.Refused(), actiontest.Answer("hello"))
	in := ask(false)
	in.Request.Messages = append(in.Request.Messages, providers.TextMessage("tool", "order 42: shipped"))
	execute(t, env, in)
	sent := actions.Sent("ask")
	if len(sent) != 2 || sent[0].Attempt != 1 || sent[1].Attempt != 2 || sent[1].Route != "primary" || len(sent[1].Avoid) != 1 || sent[0].IdempotencyKey != "parent-ask" {
		t.Fatalf("sent %+v", sent)
	}
	req := actions.Request("ask")
	if len(req.Messages) != 2 || req.Messages[1].Role != "tool" {
		t.Fatalf("request %+v", req)
	}
	if got := actions.Sent("parent-ask"); len(got) != 2 {
		t.Fatalf("by action id: %d attempts", len(got))
	}
	if got := actions.Sent("other"); got != nil {
		t.Fatalf("a call never made sent %+v", got)
	}
}

// AssertExpectations fails the test for each scripted attempt that never
// ran, naming its call and number; a script run to its end passes.
func TestAssertExpectationsNamesAScriptedAttemptThatNeverRan(t *testing.T) {
	env := newEnv(t)
	actions := actiontest.Register(t, env)
	actions.On("ask", actiontest.Answer("first"), actiontest.Answer("never needed"))
	actions.On("unused", actiontest.Answer("never asked"))
	execute(t, env, ask(false))
	rec := &recorder{TB: t}
	if actions.AssertExpectations(rec) || len(rec.errs) != 2 ||
		!strings.Contains(rec.errs[0], `call "ask": attempt 2 of 2 never ran`) || !strings.Contains(rec.errs[1], `call "unused": attempt 1 of 1 never ran`) {
		t.Fatalf("errors %q", rec.errs)
	}

	env = newEnv(t)
	actions = actiontest.Register(t, env)
	actions.On("ask", actiontest.Refused(), actiontest.Answer("second"))
	execute(t, env, ask(false))
	if !actions.AssertExpectations(t) || !env.AssertExpectations(t) {
		t.Fatal("a script run to its end fails AssertExpectations")
	}
}

// Worker options a test sets after Register replace the interceptor that
// settles a canceled attempt as a server does: every attempt then fails
// the test, saying what to do; with actions.Interceptor() among them, a
// canceled attempt keeps its evidence.
func TestWorkerOptionsSetAfterRegisterNeedTheInterceptor(t *testing.T) {
	rec := &recorder{TB: t}
	env := newEnv(t)
	actiontest.Register(rec, env).On("ask", actiontest.Answer("hello"))
	env.SetWorkerOptions(worker.Options{DeadlockDetectionTimeout: time.Minute})
	execute(t, env, ask(false))
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "actions.Interceptor()") {
		t.Fatalf("errors %q", rec.errs)
	}

	env = newEnv(t)
	actions := actiontest.Register(t, env)
	actions.On("ask", actiontest.Hold().CanceledAfter(time.Second))
	env.SetWorkerOptions(worker.Options{DeadlockDetectionTimeout: time.Minute, Interceptors: []interceptor.WorkerInterceptor{actions.Interceptor()}})
	c := execute(t, env, ask(false))
	if ev := c.Result.Attempts[0].Evidence; c.Result.State != workflows.StateCanceled || !ev.RequestSent || ev.ConnRef == "" {
		t.Fatalf("call %+v", c)
	}
}
