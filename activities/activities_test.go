package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providers/routes"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	sdktestsuite "go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"

	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/testsuite/providertest"
)

// CallModel outside Temporal (no heartbeats): one attempt through the real
// engine to the providertest provider.
func newActs(t testing.TB) (*Activities, *providertest.Provider) {
	t.Helper()
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	e := recovery.New(recovery.Config{TLSClientConfig: p.ClientTLSConfig(), Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { e.Close(); p.Close() })
	return &Activities{Engine: e, Routes: map[string]routes.Route{
		"openai":    {Name: "openai", Kind: routes.KindOpenAI, BaseURL: p.URL() + "/v1", Model: "m"},
		"anthropic": {Name: "anthropic", Kind: routes.KindAnthropic, BaseURL: p.URL() + "/v1", Model: "claude"},
	}}, p
}

func attemptOn(route string, req providers.Request) attempt.Input {
	return attempt.Input{ActionRef: "act", Attempt: 1, AttemptID: "act-1-" + route, IdempotencyKey: "act", Route: route, Request: req}
}

func hello() providers.Request {
	return providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hello")}}
}

func TestCallModelCompletes(t *testing.T) {
	a, p := newActs(t)
	out, err := a.CallModel(context.Background(), attemptOn("openai", hello()))
	if err != nil || out.Classification.Class != evidence.Completed || out.Response == nil || out.Response.Text != "ok" {
		t.Fatalf("outcome %+v err %v", out, err)
	}
	if p.AttemptExecutions("act-1-openai") != 1 {
		t.Fatal("the provider did not execute the attempt once")
	}
}

// REFUSED_STREAM is proof of non-processing from the provider itself, not
// from a proxy in front of it (haproxy sends it when the origin failed
// after the request was forwarded): on a route marked Intermediary the
// same frame is ambiguous.
func TestCallModelRefusedStreamThroughAnIntermediaryIsAmbiguous(t *testing.T) {
	for _, tc := range []struct {
		intermediary bool
		want         evidence.Class
	}{{false, evidence.Refused}, {true, evidence.Ambiguous}} {
		a, p := newActs(t)
		r := a.Routes["openai"]
		r.Intermediary = tc.intermediary
		a.Routes["openai"] = r
		p.Push(providertest.RefuseStream())
		out, err := a.CallModel(context.Background(), attemptOn("openai", hello()))
		if err != nil || out.Classification.Class != tc.want || !out.Evidence.RequestSent {
			t.Fatalf("intermediary=%v: outcome %+v evidence %+v err %v", tc.intermediary, out.Classification, out.Evidence, err)
		}
		if out.Evidence.Intermediary != tc.intermediary {
			t.Fatalf("evidence does not record the route's intermediary setting: %+v", out.Evidence)
		}
	}
}

func TestCallModelUnknownRouteFallsBack(t *testing.T) {
	a, _ := newActs(t)
	out, err := a.CallModel(context.Background(), attemptOn("nope", hello()))
	if err != nil || out.Classification.Class != evidence.IncompatibleRoute {
		t.Fatalf("outcome %+v err %v", out.Classification, err)
	}
}

// A request the route's kind cannot express is refused before anything is
// sent: incompatible with this route (fall back), not an unsent attempt to
// retry on it.
func TestCallModelRefusalBeforeSendingIsIncompatibleRoute(t *testing.T) {
	a, p := newActs(t)
	req := hello()
	req.ResponseFormat = json.RawMessage(`{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}}`)
	out, err := a.CallModel(context.Background(), attemptOn("anthropic", req))
	if err != nil || out.Classification.Class != evidence.IncompatibleRoute {
		t.Fatalf("outcome %+v err %v", out.Classification, err)
	}
	if n := len(p.Received()); n != 0 {
		t.Fatalf("provider received %d requests", n)
	}
}

func TestCallModelStoresALargeResponseByReference(t *testing.T) {
	a, p := newActs(t)
	a.Results = resultstore.Dir{Path: t.TempDir()}
	a.LargeResponseBytes = 4096
	big := strings.Repeat("lorem ", 2000)
	p.Push(providertest.Answer(big))
	out, err := a.CallModel(context.Background(), attemptOn("openai", hello()))
	if err != nil || out.Classification.Class != evidence.Completed || out.Response != nil || out.ResponseRef == "" {
		t.Fatalf("outcome %+v ref %q err %v", out.Classification, out.ResponseRef, err)
	}
	b, err := a.Results.Get(context.Background(), out.ResponseRef)
	if err != nil {
		t.Fatal(err)
	}
	var r providers.Response
	if err := json.Unmarshal(b, &r); err != nil || strings.TrimSpace(r.Text) != strings.TrimSpace(big) {
		t.Fatalf("stored response: %d bytes of text, %v", len(r.Text), err)
	}

	// A small answer stays inline.
	out, err = a.CallModel(context.Background(), attempt.Input{ActionRef: "act2", Attempt: 1, AttemptID: "act2-1", Route: "openai", Request: hello()})
	if err != nil || out.Response == nil || out.ResponseRef != "" {
		t.Fatalf("small answer: %+v ref %q", out.Response, out.ResponseRef)
	}
}

// The outcome carries the usage the provider reported, whatever happens
// to the response (kept inline, or by reference when too large), for
// the workflow to charge the attempt with; none when it reported none.
func TestCallModelReturnsTheProvidersUsage(t *testing.T) {
	a, p := newActs(t)
	a.Results = resultstore.Dir{Path: t.TempDir()}
	a.LargeResponseBytes = 4096
	u := providertest.Usage{PromptTokens: 900, CachedTokens: 512, CompletionTokens: 2000}
	want := providers.Usage{PromptTokens: 900, CachedTokens: 512, CompletionTokens: 2000, TotalTokens: 2900}
	p.Push(providertest.Answer("short").WithUsage(u), providertest.Answer(strings.Repeat("lorem ", 2000)).WithUsage(u),
		providertest.ServerError(500))
	for i, kept := range []string{"inline", "by reference"} {
		out, err := a.CallModel(context.Background(), attempt.Input{ActionRef: "u", Attempt: i + 1, AttemptID: fmt.Sprintf("u-%d", i+1), Route: "openai", Request: hello()})
		if err != nil || out.Classification.Class != evidence.Completed || (kept == "by reference") != (out.ResponseRef != "") {
			t.Fatalf("%s: outcome %+v ref %q err %v", kept, out.Classification, out.ResponseRef, err)
		}
		if out.Usage == nil || *out.Usage != want {
			t.Fatalf("%s: usage %+v, the provider reported %+v", kept, out.Usage, want)
		}
	}
	out, err := a.CallModel(context.Background(), attempt.Input{ActionRef: "u", Attempt: 3, AttemptID: "u-3", Route: "openai", Request: hello()})
	if err != nil || out.Classification.Class != evidence.UpstreamError || out.Usage != nil {
		t.Fatalf("a 500: outcome %+v usage %+v err %v", out.Classification, out.Usage, err)
	}
}

// call is a CallModel running on its own goroutine.
type call struct {
	done chan struct{}
	out  attempt.Outcome
	err  error
}

func callAsync(a *Activities, ctx context.Context, in attempt.Input) *call {
	c := &call{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		c.out, c.err = a.CallModel(ctx, in)
	}()
	return c
}

func (c *call) wait() (attempt.Outcome, error) {
	<-c.done
	return c.out, c.err
}

// waitExecuted waits until the provider has executed the attempt, failing
// if CallModel returns first.
func waitExecuted(t *testing.T, p *providertest.Provider, id string, c *call) {
	t.Helper()
	for p.AttemptExecutions(id) == 0 {
		select {
		case <-c.done:
			t.Fatalf("returned before the provider held it: %v", c.err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Worker shutdown mid-stream loses a committed partial: during a graceful
// stop the SDK cancels the activity with worker.ErrWorkerShutdown as the
// cause. Content had reached subscribers, so the attempt is committed: it
// must come back as data, committed_partial with the text, not as
// ctx.Err() (which Temporal records as a failure, and the workflow then
// saw as an ambiguous attempt with no evidence).
func TestWorkerShutdownMidStreamKeepsTheCommittedPartial(t *testing.T) {
	a, p := newActs(t)
	a.Streams = NewStreams()
	events, unsubscribe := a.Streams.Subscribe("act", 16)
	defer unsubscribe()
	p.Push(providertest.StreamStall(2))
	req := hello()
	req.Stream = true
	ctx, cancel := context.WithCancelCause(context.Background())
	c := callAsync(a, ctx, attemptOn("openai", req))
	for got := 0; got < 2; got++ {
		if ev := <-events; ev.Delta == "" {
			t.Fatalf("event %+v before two deltas", ev)
		}
	}
	cancel(worker.ErrWorkerShutdown)
	out, err := c.wait()
	if err != nil {
		t.Fatalf("a worker shutdown returned an error, so the outcome is lost: %v", err)
	}
	if out.Classification.Class != evidence.CommittedPartial || out.Classification.Reason != "worker_stopped_after_content" {
		t.Fatalf("classified %s/%s", out.Classification.Class, out.Classification.Reason)
	}
	if out.Response == nil || !out.Response.Partial || out.Response.Text != "chunk1 chunk2" {
		t.Fatalf("response %+v", out.Response)
	}
	if !out.Evidence.ContentStarted || out.Evidence.StreamID == 0 || out.Evidence.Stop != evidence.StopWorkerShutdown {
		t.Fatalf("evidence %+v", out.Evidence)
	}
}

// The same stop before any content: the request left and the provider
// may have run it, so the action waits for a verdict; it is not canceled.
func TestWorkerShutdownBeforeContentIsAmbiguous(t *testing.T) {
	a, p := newActs(t)
	p.Push(providertest.Hold())
	ctx, cancel := context.WithCancelCause(context.Background())
	c := callAsync(a, ctx, attemptOn("openai", hello()))
	waitExecuted(t, p, "act-1-openai", c)
	cancel(worker.ErrWorkerShutdown)
	if out, err := c.wait(); err != nil || out.Classification.Class != evidence.Ambiguous || out.Classification.Reason != "worker_stopped_mid_attempt" {
		t.Fatalf("err %v outcome %+v", err, out.Classification)
	}
}

// A canceled attempt's wire evidence never reached history: the activity
// returned ctx.Err() alone. The cancellation now carries the outcome as
// its details, and is still a cancellation (context.Canceled, and a
// temporal.CanceledError for the SDK to report as one).
func TestCanceledAttemptKeepsItsWireEvidence(t *testing.T) {
	a, p := newActs(t)
	p.Push(providertest.Hold())
	ctx, cancel := context.WithCancel(context.Background())
	c := callAsync(a, ctx, attemptOn("openai", hello()))
	waitExecuted(t, p, "act-1-openai", c)
	cancel()
	returned, err := c.wait()
	var ce *temporal.CanceledError
	if returned.Classification.Class != evidence.Canceled || !errors.Is(err, context.Canceled) || !errors.As(err, &ce) || !ce.HasDetails() {
		t.Fatalf("err %v: want context.Canceled and a CanceledError with details", err)
	}
	var out attempt.Outcome
	if err := ce.Details(&out); err != nil {
		t.Fatal(err)
	}
	ev := out.Evidence
	if out.Classification.Class != evidence.Canceled || !ev.RequestSent || ev.StreamID == 0 || ev.ConnRef == "" || ev.Stop != evidence.StopScope {
		t.Fatalf("details %+v", out)
	}
}

// An action's attempt_timeout cannot go past the route's 60 s default:
// the exchange's own timer used the route's timeout whatever the workflow
// asked. The action's timeout governs (docs/workflow.md states the rule).
func TestAttemptTimeoutCanGoPastTheRouteDefault(t *testing.T) {
	a, p := newActs(t)
	r := a.Routes["openai"]
	r.AttemptTimeout = 50 * time.Millisecond // the route's default, shortened for the test
	a.Routes["openai"] = r
	p.Push(providertest.Answer("late but fine").After(300 * time.Millisecond))
	in := attemptOn("openai", hello())
	in.Timeout = 10 * time.Second
	out, err := a.CallModel(context.Background(), in)
	if err != nil || out.Classification.Class != evidence.Completed {
		t.Fatalf("err %v outcome %+v", err, out.Classification)
	}
}

// The SDK fails any result reported after the worker's stop timeout has
// canceled its context, so an attempt still streaming when the worker
// stops ends itself once StopGrace has passed, with its evidence and its
// committed text, while the worker can still report it.
func TestWorkerStoppingEndsTheAttemptWithinItsGrace(t *testing.T) {
	a, p := newActs(t)
	a.Streams = NewStreams()
	a.StopGrace = 50 * time.Millisecond
	events, unsubscribe := a.Streams.Subscribe("act", 16)
	defer unsubscribe()
	p.Push(providertest.StreamStall(1))
	req := hello()
	req.Stream = true
	var s sdktestsuite.WorkflowTestSuite
	env := s.NewTestActivityEnvironment()
	env.RegisterActivity(a)
	stopping := make(chan struct{})
	env.SetWorkerStopChannel(stopping)
	type result struct {
		out attempt.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := env.ExecuteActivity(a.CallModel, attemptOn("openai", req))
		var r result
		r.err = err
		if err == nil {
			r.err = v.Get(&r.out)
		}
		done <- r
	}()
	if ev := <-events; ev.Delta == "" {
		t.Fatalf("event %+v", ev)
	}
	close(stopping)
	r := <-done
	if r.err != nil || r.out.Classification.Class != evidence.CommittedPartial || r.out.Response == nil || r.out.Response.Text != "chunk1" {
		t.Fatalf("err %v outcome %+v response %+v", r.err, r.out.Classification, r.out.Response)
	}
	if r.out.Evidence.Stop != evidence.StopWorkerShutdown {
		t.Fatalf("evidence %+v", r.out.Evidence)
	}
}

// The attempt journal: a worker that received a response writes it down
// before it reports, and the built-in reconciler reads it first.
func TestCallModelJournalsTheResponseBeforeReporting(t *testing.T) {
	a, p := newActs(t)
	a.Journal = journal.Dir{Path: t.TempDir()}
	p.Push(providertest.Answer("the answer"))
	in := attemptOn("openai", hello())
	seen := false
	a.BeforeReport = func(out attempt.Outcome) {
		e, ok, err := a.Journal.Lookup(context.Background(), in.AttemptID)
		seen = err == nil && ok && e.State == journal.Received && e.Response != nil && e.Response.Text == "the answer"
	}
	out, err := a.CallModel(context.Background(), in)
	if err != nil || out.Classification.Class != evidence.Completed || !seen {
		t.Fatalf("err %v outcome %+v journaled before the report: %v", err, out.Classification, seen)
	}
	// An exchange that ended unanswered after the request left is noted,
	// as such: no proof either way.
	p.Push(providertest.CloseAfterRead())
	in2 := in
	in2.AttemptID = "act-2-openai"
	if out, _ := a.CallModel(context.Background(), in2); out.Classification.Class != evidence.Ambiguous {
		t.Fatalf("classified %s", out.Classification.Class)
	}
	if e, ok, _ := a.Journal.Lookup(context.Background(), in2.AttemptID); !ok || e.State != journal.EndedUnanswered || e.Response != nil {
		t.Fatalf("entry %+v ok %v", e, ok)
	}
}

func TestReconcileReadsTheJournalFirst(t *testing.T) {
	a, _ := newActs(t)
	a.Journal = journal.Dir{Path: t.TempDir()}
	ctx := context.Background()
	if err := a.Journal.Record(ctx, journal.Entry{AttemptID: "run-1", State: journal.Received, Response: &providers.Response{Text: "kept"}}); err != nil {
		t.Fatal(err)
	}
	out, err := a.Reconcile(ctx, attempt.ReconcileInput{AttemptID: "run-1"})
	if err != nil || out.Verdict != attempt.VerdictCompleted || out.By != attempt.ByJournal || out.Response == nil || out.Response.Text != "kept" {
		t.Fatalf("out %+v err %v", out, err)
	}
	// No entry and no application reconciler: the journal cannot tell,
	// and says so (the action waits for a person).
	out, err = a.Reconcile(ctx, attempt.ReconcileInput{AttemptID: "run-2"})
	if err != nil || out.Verdict != attempt.VerdictNone {
		t.Fatalf("out %+v err %v", out, err)
	}
	// Plans say a reconciler runs when only the journal is configured.
	if p, _ := a.DescribeRoutes(ctx, attempt.PlanInput{}); !p.Reconciler {
		t.Fatal("the plan does not run the built-in reconciler")
	}
}

// The journal unreachable: the attempt still completes, the journal's
// absence is reported (logged and counted), never a crash; the
// reconciler passes over it.
func TestJournalUnreachableTheAttemptStillCompletes(t *testing.T) {
	a, p := newActs(t)
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	a.Journal = journal.Dir{Path: filepath.Join(file, "journal")}
	p.Push(providertest.Answer("fine"))
	out, err := a.CallModel(context.Background(), attemptOn("openai", hello()))
	if err != nil || out.Classification.Class != evidence.Completed || out.Response == nil || out.Response.Text != "fine" {
		t.Fatalf("err %v outcome %+v", err, out.Classification)
	}
	if out, err := a.Reconcile(context.Background(), attempt.ReconcileInput{AttemptID: "act-1-openai"}); err != nil || out.Verdict != attempt.VerdictNone {
		t.Fatalf("reconcile over an unreachable journal: %+v %v", out, err)
	}
}

// heartbeatsOf runs CallModel in the SDK's activity environment (which
// delivers RecordHeartbeat calls to a listener) and counts the heartbeats
// the attempt recorded.
func heartbeatsOf(t *testing.T, a *Activities, in attempt.Input) (attempt.Outcome, int) {
	t.Helper()
	var s sdktestsuite.WorkflowTestSuite
	env := s.NewTestActivityEnvironment()
	env.RegisterActivity(a)
	var beats atomic.Int32
	env.SetOnActivityHeartbeatListener(func(*activity.Info, converter.EncodedValues) { beats.Add(1) })
	v, err := env.ExecuteActivity(a.CallModel, in)
	var out attempt.Outcome
	if err == nil {
		err = v.Get(&out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return out, int(beats.Load())
}

// A heartbeat recorded the moment an attempt starts would cost: the
// SDK sends a first heartbeat at once, as a synchronous call that the
// server persists, and the attempt's end would wait for it: ~3 ms of an
// action's critical path and ~3–4 ms of the server's CPU, for details
// (no content yet, no connection) that are the defaults anyway. An answer
// that comes before the first interval needs no heartbeat; a longer one
// still heartbeats every interval.
func TestAnAttemptAnsweredWithinTheHeartbeatIntervalRecordsNoHeartbeat(t *testing.T) {
	a, _ := newActs(t)
	a.HeartbeatEvery = time.Minute
	out, beats := heartbeatsOf(t, a, attemptOn("openai", hello()))
	if out.Classification.Class != evidence.Completed || beats != 0 {
		t.Fatalf("class %s, %d heartbeats: want completed with none", out.Classification.Class, beats)
	}
}

func TestALongAttemptStillHeartbeats(t *testing.T) {
	a, p := newActs(t)
	a.HeartbeatEvery = 20 * time.Millisecond
	p.Push(providertest.Answer("slow").After(300 * time.Millisecond))
	out, beats := heartbeatsOf(t, a, attemptOn("openai", hello()))
	// The SDK throttles what reaches the server (here: the first call,
	// then at most one per throttle window), so what counts is that a
	// running attempt is not silent: its heartbeats are how Temporal
	// tells a dead worker and delivers a cancel.
	if out.Classification.Class != evidence.Completed || beats == 0 {
		t.Fatalf("class %s, %d heartbeats: want completed with at least one", out.Classification.Class, beats)
	}
}

// A streamed attempt's heartbeats carry its worker's stream URL, when the
// worker advertises one; other attempts' do not. The first still waits for
// its interval: a caller elsewhere finds the stream sooner in the worker's
// identity (worker.Options.StreamURL).
func TestAStreamedAttemptsHeartbeatsCarryItsStreamURL(t *testing.T) {
	for _, tc := range []struct {
		name   string
		url    string
		stream bool
		want   string
	}{
		{"streamed, advertised", "http://127.0.0.1:9092", true, "http://127.0.0.1:9092"},
		{"streamed, not advertised", "", true, ""},
		{"not streamed, advertised", "http://127.0.0.1:9092", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, p := newActs(t)
			a.HeartbeatEvery, a.StreamURL = 20*time.Millisecond, tc.url
			p.Push(providertest.Answer("slow").After(200 * time.Millisecond))
			req := hello()
			req.Stream = tc.stream
			var s sdktestsuite.WorkflowTestSuite
			env := s.NewTestActivityEnvironment()
			env.RegisterActivity(a)
			var urls []string
			var mu sync.Mutex
			env.SetOnActivityHeartbeatListener(func(_ *activity.Info, d converter.EncodedValues) {
				var p attempt.Progress
				_ = d.Get(&p)
				mu.Lock()
				urls = append(urls, p.StreamURL)
				mu.Unlock()
			})
			if _, err := env.ExecuteActivity(a.CallModel, attemptOn("openai", req)); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(urls) == 0 {
				t.Fatal("no heartbeat")
			}
			for _, u := range urls {
				if u != tc.want {
					t.Fatalf("heartbeats with stream URLs %q, want %q", urls, tc.want)
				}
			}
		})
	}
}
