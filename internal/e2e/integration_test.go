package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	sdklog "go.temporal.io/sdk/log"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/server/temporaltest"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/activities"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/internal/devserver"
	"github.com/durallm/durallm/internal/syncbuf"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

// These tests run the real LLMAction workflow and CallModel activity on the
// embedded Temporal server (temporaltest) against the providertest HTTP/2
// provider over loopback TLS. The provider's records prove which requests
// executed and how often.

var updateHistories = flag.Bool("update-histories", false, "write the recorded histories replayed by workflows/replay_test.go")

type stack struct {
	t  *testing.T
	ts *temporaltest.TestServer
	p  *providertest.Provider
	c  *durallm.Client
	tc client.Client
	tq string
}

func newStack(t *testing.T) *stack {
	t.Helper()
	ts := temporaltest.NewServer(temporaltest.WithT(t), temporaltest.WithBaseServerOptions(devserver.TemporaltestOption()))
	tc := ts.GetDefaultClient()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := tc.OperatorService().AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{
		Namespace:        ts.GetDefaultNamespace(),
		SearchAttributes: workflows.SearchAttributes,
	}); err != nil {
		t.Fatal(err)
	}
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	s := &stack{t: t, ts: ts, p: p, tc: tc, tq: "durallm-" + strings.ReplaceAll(t.Name(), "/", "-")}
	s.c = durallm.NewClient(tc, s.tq)
	return s
}

func (s *stack) routes() routes.Config {
	caps := providers.Capabilities{Tools: true, Streaming: true, StructuredOutput: true}
	return routes.Config{Routes: []routes.Route{
		{Name: "primary", Kind: "openai", BaseURL: s.p.URL() + "/v1", Model: "model-primary", Capabilities: caps},
		{Name: "fallback", Kind: "openai", BaseURL: s.p.URL() + "/v1", Model: "model-fallback", Capabilities: caps},
	}}
}

func (s *stack) startWorker(opts ...func(*worker.Options)) *worker.Worker {
	s.t.Helper()
	o := worker.Options{
		TaskQueue: s.tq, Config: s.routes(), TLS: s.p.ClientTLSConfig(), SearchAttributes: true,
		Logger: slog.New(slog.DiscardHandler),
	}
	for _, f := range opts {
		f(&o)
	}
	w, err := worker.New(s.tc, o)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := w.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(w.Stop)
	return w
}

func actionInput(stream bool) workflows.ActionInput {
	return workflows.ActionInput{
		Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "say hello")}, Stream: stream},
		Routes:  []string{"primary", "fallback"},
		Needs:   providers.Capabilities{Streaming: stream},
	}
}

func (s *stack) run(id string, in workflows.ActionInput) (workflows.ActionResult, error) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, err := s.c.Start(ctx, id, in)
	if err != nil {
		s.t.Fatal(err)
	}
	return a.Result(ctx)
}

func (s *stack) waitState(id string, want workflows.State) workflows.Status {
	s.t.Helper()
	var st workflows.Status
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var err error
		st, err = s.c.Status(context.Background(), id)
		if err == nil && st.State == want {
			return st
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.t.Fatalf("action %s never reached %s (last %s)", id, want, st.State)
	return st
}

func classes(res workflows.ActionResult) []evidence.Class {
	var out []evidence.Class
	for _, a := range res.Attempts {
		out = append(out, a.Classification.Class)
	}
	return out
}

// saveHistory writes the action's history for the replay test when
// -update-histories is set.
func (s *stack) saveHistory(id, name string) {
	s.saveHistoryAt(id, filepath.Join("..", "..", "workflows", "testdata", name+".json"))
}

// saveHistoryAt writes workflow id's history to path when
// -update-histories is set.
func (s *stack) saveHistoryAt(id, path string) { s.saveRunHistoryAt(id, "", path) }

// saveRunHistoryAt writes the history of workflow id's run runID (empty:
// its latest) to path when -update-histories is set.
func (s *stack) saveRunHistoryAt(id, runID, path string) {
	if !*updateHistories {
		return
	}
	ctx := context.Background()
	iter := s.tc.GetWorkflowHistory(ctx, id, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var events []json.RawMessage
	for iter.HasNext() {
		ev, err := iter.Next()
		if err != nil {
			s.t.Fatal(err)
		}
		b, err := protojson.Marshal(ev)
		if err != nil {
			s.t.Fatal(err)
		}
		events = append(events, b)
	}
	b, _ := json.MarshalIndent(map[string]any{"events": events}, "", " ")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		s.t.Fatal(err)
	}
}

// Runbook 1: above the GOAWAY boundary, retried on a different connection,
// executed once.
func TestE2ERunbookGoAwayAboveBoundary(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	s.p.Push(providertest.GoAwayAbove(http2.ErrCodeNo))
	res, err := s.run("goaway-above", actionInput(false))
	if err != nil {
		t.Fatal(err)
	}
	if got := classes(res); len(got) != 2 || got[0] != evidence.Refused || got[1] != evidence.Completed {
		t.Fatalf("attempts %v", got)
	}
	if a, b := res.Attempts[0].Evidence.ConnRef, res.Attempts[1].Evidence.ConnRef; a == b || a == "" {
		t.Fatalf("retry on the same connection %q", a)
	}
	if n := s.p.ExecutedCount("goaway-above"); n != 1 {
		t.Fatalf("executed %d times", n)
	}
	if res.Response == nil || res.Response.Text == "" {
		t.Fatalf("response %+v", res.Response)
	}
	if !strings.Contains(res.Attempts[1].Summary, "fresh connection after GOAWAY") {
		t.Fatalf("summary %q", res.Attempts[1].Summary)
	}
	s.saveHistory("goaway-above", "goaway_retry")
}

// Runbook 2: at or below the boundary: ambiguous, not re-sent, reconciled.
func TestE2ERunbookGoAwayAtBoundaryWaitsForReconciliation(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	s.p.Push(providertest.GoAwayAfterProcessing(http2.ErrCodeNo))
	ctx := context.Background()
	a, err := s.c.Start(ctx, "goaway-at", actionInput(false))
	if err != nil {
		t.Fatal(err)
	}
	st := s.waitState("goaway-at", workflows.StateAwaitingReconciliation)
	if st.AwaitingAttempt != 1 || st.Attempts[0].Classification.Reason != "goaway_at_or_below_boundary" {
		t.Fatalf("status %+v", st)
	}
	ids, err := s.c.List(ctx, workflows.StateAwaitingReconciliation, 10)
	if err != nil {
		t.Fatal(err)
	}
	if !listed(ids, "goaway-at") {
		// Visibility is eventually consistent; give it a moment.
		time.Sleep(500 * time.Millisecond)
		if ids, _ = s.c.List(ctx, workflows.StateAwaitingReconciliation, 10); !listed(ids, "goaway-at") {
			t.Fatalf("search by DurallmState did not find the action: %v", ids)
		}
	}
	var rerr *durallm.ReconcileError
	if err := s.c.Reconcile(ctx, "goaway-at", workflows.ReconcileRequest{Attempt: 9, Verdict: attempt.VerdictAbandon}); !errors.As(err, &rerr) || rerr.Reason != workflows.RejectStaleAttempt || !strings.Contains(rerr.Message, "stale attempt 9") {
		t.Fatalf("stale reconcile: %v", err)
	}
	if err := s.c.Reconcile(ctx, "goaway-at", workflows.ReconcileRequest{Attempt: 1, Verdict: attempt.VerdictCompleted, Response: &providers.Response{Text: "found in the provider's log"}, By: "test"}); err != nil {
		t.Fatal(err)
	}
	res, err := a.Result(ctx)
	if err != nil || res.State != workflows.StateReconciled {
		t.Fatalf("state %s err %v", res.State, err)
	}
	if n := s.p.ExecutedCount("goaway-at"); n != 1 {
		t.Fatalf("executed %d times", n)
	}
	if n := len(s.p.Received()); n != 1 {
		t.Fatalf("provider received %d requests; the ambiguous one must not be re-sent", n)
	}
	s.saveHistory("goaway-at", "reconciliation")
}

// Runbook 3: a connection lost with no GOAWAY is ambiguous.
func TestE2ERunbookConnectionLossIsAmbiguous(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	s.p.Push(providertest.CloseAfterRead())
	ctx := context.Background()
	a, err := s.c.Start(ctx, "conn-loss", actionInput(false))
	if err != nil {
		t.Fatal(err)
	}
	st := s.waitState("conn-loss", workflows.StateAwaitingReconciliation)
	if st.Attempts[0].Classification.Reason != "connection_closed_without_goaway" {
		t.Fatalf("reason %s", st.Attempts[0].Classification.Reason)
	}
	if err := s.c.Reconcile(ctx, "conn-loss", workflows.ReconcileRequest{Attempt: 1, Verdict: attempt.VerdictAbandon}); err != nil {
		t.Fatal(err)
	}
	_, err = a.Result(ctx)
	var ae *durallm.ActionError
	if !errors.As(err, &ae) || ae.State != workflows.StateIndeterminate || ae.Outcome != "ambiguous" {
		t.Fatalf("err %v", err)
	}
	if n := s.p.ExecutedCount("conn-loss"); n != 1 {
		t.Fatalf("executed %d times", n)
	}
}

// Runbook 4: 421 then success on a fresh connection; 421 twice stops.
func TestE2ERunbookMisdirected(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	s.p.Push(providertest.Misdirected())
	res, err := s.run("misdirected", actionInput(false))
	if err != nil {
		t.Fatal(err)
	}
	second := res.Attempts[1].Evidence
	if got := classes(res); len(got) != 2 || got[0] != evidence.Misdirected || !second.ConnFresh || second.ConnRef == res.Attempts[0].Evidence.ConnRef {
		t.Fatalf("attempts %v, second %+v", got, second)
	}
	s.p.Push(providertest.Misdirected(), providertest.Misdirected())
	_, err = s.run("misdirected-twice", actionInput(false))
	var ae *durallm.ActionError
	if !errors.As(err, &ae) || ae.State != workflows.StateFailed || ae.Outcome != "misdirected_repeated" {
		t.Fatalf("err %v", err)
	}
	if n := s.p.ExecutedCount("misdirected-twice"); n != 0 {
		t.Fatalf("executed %d times", n)
	}
}

// Runbook 5: content already started, then cut: completed_partial.
func TestE2ERunbookCommittedPartial(t *testing.T) {
	s := newStack(t)
	w := s.startWorker()
	s.p.Push(providertest.StreamCut(2, providertest.CutReset))
	events, stop := w.Streams().Subscribe("partial", 64)
	res, err := s.run("partial", actionInput(true))
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if res.State != workflows.StateCompletedPartial || res.Response == nil || !res.Response.Partial || res.Response.Text == "" {
		t.Fatalf("state %s response %+v", res.State, res.Response)
	}
	var deltas, incomplete int
	for ev := range events {
		if ev.Delta != "" {
			deltas++
		}
		if ev.Incomplete != "" {
			incomplete++
		}
	}
	if deltas == 0 || incomplete != 1 {
		t.Fatalf("sink saw %d deltas and %d stream_incomplete events", deltas, incomplete)
	}
	if n := s.p.ExecutedCount("partial"); n != 1 {
		t.Fatalf("executed %d times", n)
	}
}

func TestE2ECancelStopsTheAttempt(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	s.p.Push(providertest.Hold())
	ctx := context.Background()
	a, err := s.c.Start(ctx, "cancel-me", actionInput(false))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return s.p.ExecutedCount("cancel-me") == 1 })
	if err := s.c.Cancel(ctx, "cancel-me", workflows.OriginUserStop, "user pressed stop"); err != nil {
		t.Fatal(err)
	}
	_, err = a.Result(ctx)
	var ae *durallm.ActionError
	if !errors.As(err, &ae) || ae.State != workflows.StateCanceled || ae.Origin != workflows.OriginUserStop {
		t.Fatalf("err %v", err)
	}
	if got := classes(ae.Result); len(got) != 1 || got[0] != evidence.Canceled || ae.Result.Attempts[0].HealthMoved {
		t.Fatalf("attempts %v", got)
	}
	// The canceled attempt keeps its wire evidence: the activity reports
	// the cancellation with its outcome as details (the SDK's test
	// environment cannot show this, a real server does).
	if ev := ae.Result.Attempts[0].Evidence; !ev.RequestSent || ev.StreamID == 0 || ev.ConnRef == "" || ev.Stop != evidence.StopScope {
		t.Fatalf("the canceled attempt lost its evidence: %+v", ev)
	}
	waitFor(t, func() bool { return s.p.StreamsOpen() == 0 })
	s.saveHistory("cancel-me", "cancellation")
}

// Worker shutdown mid-stream kept nothing: the SDK cancels a running
// activity with worker.ErrWorkerShutdown once the stop timeout passes, and
// the activity returned ctx.Err(), which Temporal records as a failure.
// Content had reached subscribers: the attempt is committed, and the
// action ends completed_partial with the text, on the next worker.
func TestE2EWorkerShutdownMidStreamKeepsTheCommittedPartial(t *testing.T) {
	s := newStack(t)
	w, err := worker.New(s.tc, worker.Options{
		TaskQueue: s.tq, Config: s.routes(), TLS: s.p.ClientTLSConfig(), SearchAttributes: true,
		Logger: slog.New(slog.DiscardHandler), StopTimeout: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	s.p.Push(providertest.StreamStall(2))
	events, unsubscribe := w.Streams().Subscribe("shutdown-mid-stream", 64)
	defer unsubscribe()
	ctx := context.Background()
	a, err := s.c.Start(ctx, "shutdown-mid-stream", actionInput(true))
	if err != nil {
		t.Fatal(err)
	}
	for got := 0; got < 2; {
		if ev := <-events; ev.Delta != "" {
			got++
		}
	}
	w.Stop()
	s.startWorker() // takes the workflow over
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := a.Result(rctx)
	if err != nil {
		st, _ := s.c.Status(ctx, "shutdown-mid-stream")
		t.Fatalf("no result (%v); status %+v", err, st)
	}
	if err != nil {
		t.Fatalf("err %v", err)
	}
	if res.State != workflows.StateCompletedPartial || res.Response == nil || res.Response.Text != "chunk1 chunk2" || len(res.Attempts) != 1 {
		t.Fatalf("state %s response %+v attempts %d", res.State, res.Response, len(res.Attempts))
	}
	if c := res.Attempts[0].Classification; c.Class != evidence.CommittedPartial || c.Reason != "worker_stopped_after_content" {
		t.Fatalf("classified %s/%s", c.Class, c.Reason)
	}
	if n := s.p.ExecutedCount("shutdown-mid-stream"); n != 1 {
		t.Fatalf("executed %d times", n)
	}
}

func TestE2EHappyPath(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	res, err := s.run("happy", actionInput(false))
	if err != nil {
		t.Fatal(err)
	}
	if res.State != workflows.StateCompleted || res.Used != 1 || res.Response == nil || res.Response.Text != "ok" {
		t.Fatalf("result %+v", res)
	}
	_, err = s.c.Start(context.Background(), "bad-input", workflows.ActionInput{Routes: []string{"primary"}})
	if !errors.Is(err, durallm.ErrInvalidInput) || !strings.Contains(err.Error(), "messages") {
		t.Fatalf("invalid input: %v", err)
	}
	if _, err := s.c.Status(context.Background(), "bad-input"); !errors.Is(err, durallm.ErrNotFound) {
		t.Fatalf("an invalid action was started: %v", err)
	}
	s.saveHistory("happy", "happy_path")
}

// A response too large for history goes to the result store; the client
// resolves it transparently and history holds only the reference.
func TestE2ELargeResponseByReference(t *testing.T) {
	s := newStack(t)
	store := resultstore.Dir{Path: t.TempDir()}
	s.startWorker(func(o *worker.Options) { o.Results = store })
	s.c.WithResults(store)
	big := strings.Repeat("a long answer ", 40000) // ~560 KB, above Temporal's payload warning
	s.p.Push(providertest.Answer(big))
	res, err := s.run("large", actionInput(false))
	if err != nil {
		t.Fatal(err)
	}
	if res.Response == nil || strings.TrimSpace(res.Response.Text) != strings.TrimSpace(big) || res.ResultRef == "" {
		t.Fatalf("response not resolved: ref %q, %d bytes", res.ResultRef, len(res.Response.Text))
	}
	iter := s.tc.GetWorkflowHistory(context.Background(), "large", "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for iter.HasNext() {
		ev, err := iter.Next()
		if err != nil {
			t.Fatal(err)
		}
		if n := proto.Size(ev); n > 64<<10 {
			t.Fatalf("event %d %s is %d bytes: the response went into history", ev.GetEventId(), ev.GetEventType(), n)
		}
	}
}

// A caller in another process reads the stream as server-sent events from
// the worker, opened before the action starts.
func TestE2EStreamOverSSE(t *testing.T) {
	s := newStack(t)
	tel, err := telemetry.New(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	w := s.startWorker(func(o *worker.Options) { o.Telemetry, o.MetricsAddr, o.StreamAddr = tel, "127.0.0.1:0", "127.0.0.1:0" })
	if resp, err := http.Get("http://" + w.MetricsAddr() + "/v1/streams/sse-action"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("the metrics endpoint serves streams: %v %v", resp, err)
	}
	resp, err := http.Get("http://" + w.StreamAddr() + "/v1/streams/sse-action")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	s.p.Push(providertest.StreamCut(3, providertest.CutReset))
	res, err := s.run("sse-action", actionInput(true))
	if err != nil || res.State != workflows.StateCompletedPartial {
		t.Fatalf("state %s err %v", res.State, err)
	}
	// The stream closes itself after stream_incomplete.
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for _, line := range strings.Split(string(body), "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok && strings.Contains(data, `"delta"`) {
			var d struct{ Delta string }
			if err := json.Unmarshal([]byte(data), &d); err != nil {
				t.Fatal(err)
			}
			text.WriteString(d.Delta)
		}
	}
	if text.String() == "" || text.String() != res.Response.Text || strings.Count(string(body), "event: stream_incomplete") != 1 {
		t.Fatalf("streamed %q, result %q; body:\n%s", text.String(), res.Response.Text, body)
	}
}

// No prompt, output or key reaches logs, metrics, search attributes or
// error strings: canaries go in, then every channel is captured and
// searched (docs/contract.md section 7).
func TestE2ENothingSecretIsWrittenAnywhere(t *testing.T) {
	const prompt, answer, key = "PROMPT-CANARY-4711", "ANSWER-CANARY-0815", "sk-KEY-CANARY-2342"
	t.Setenv("DURALLM_TEST_CANARY_KEY", key)
	s := newStack(t)
	var logs syncbuf.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	tel, err := telemetry.New(logger)
	if err != nil {
		t.Fatal(err)
	}
	w := s.startWorker(func(o *worker.Options) {
		o.Logger, o.Telemetry, o.MetricsAddr = logger, tel, "127.0.0.1:0"
		for i := range o.Config.Routes {
			o.Config.Routes[i].APIKeyEnv = "DURALLM_TEST_CANARY_KEY"
		}
	})
	in := actionInput(false)
	in.Request.Messages = []providers.Message{providers.TextMessage("user", prompt)}
	// One of each: an answer, a GOAWAY retry, a 400 with the prompt echoed
	// in its error body, an ambiguous one.
	s.p.Push(providertest.GoAwayAbove(http2.ErrCodeNo), providertest.Answer(answer))
	if _, err := s.run("canary-ok", in); err != nil {
		t.Fatal(err)
	}
	s.p.Push(providertest.Status(400, nil, `{"error":{"type":"invalid_request_error","message":"bad: `+prompt+`"}}`))
	_, rejErr := s.run("canary-rejected", in)
	if rejErr == nil {
		t.Fatal("a 400 succeeded")
	}
	if got := s.p.Received()[0]; got.AttemptID == "" {
		t.Fatal("no request reached the provider")
	}
	metrics, err := providertest.Scrape("http://" + w.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var attrs strings.Builder
	for _, id := range []string{"canary-ok", "canary-rejected"} {
		d, err := s.tc.DescribeWorkflowExecution(context.Background(), id, "")
		if err != nil {
			t.Fatal(err)
		}
		for name, p := range d.GetWorkflowExecutionInfo().GetSearchAttributes().GetIndexedFields() {
			attrs.WriteString(name + "=" + string(p.GetData()) + "\n")
		}
		st, _ := s.c.Status(context.Background(), id)
		for _, a := range st.Attempts {
			attrs.WriteString(a.Summary + " " + a.Classification.Reason + "\n")
		}
	}
	if !strings.Contains(attrs.String(), "DurallmState") {
		t.Fatalf("no search attributes captured: %s", attrs.String())
	}
	logText := logs.String()
	if !strings.Contains(logText, "llm.attempt") {
		t.Fatal("no attempt events captured")
	}
	for _, where := range []struct{ name, text string }{
		{"logs", logText}, {"metrics", metrics}, {"search attributes and summaries", attrs.String()}, {"error string", rejErr.Error()},
	} {
		for _, canary := range []string{prompt, answer, key} {
			if strings.Contains(where.text, canary) {
				t.Errorf("%s hold %q", where.name, canary)
			}
		}
	}
	if !strings.Contains(s.p.Received()[0].Path, "/chat/completions") {
		t.Fatalf("unexpected path %q", s.p.Received()[0].Path)
	}
}

// With tracing on, an action's workflow, its attempt activity and the
// client's start are spans of one trace.
func TestE2ETracing(t *testing.T) {
	s := newStack(t)
	spans := tracetest.NewInMemoryExporter()
	tel, err := telemetry.NewWithOptions(telemetry.Options{Logger: slog.New(slog.DiscardHandler), SpanExporter: spans})
	if err != nil {
		t.Fatal(err)
	}
	ti, err := tel.TracingInterceptor()
	if err != nil || ti == nil {
		t.Fatalf("interceptor %v %v", ti, err)
	}
	s.tc = s.ts.NewClientWithOptions(client.Options{Interceptors: []interceptor.ClientInterceptor{ti}})
	s.c = durallm.NewClient(s.tc, s.tq)
	s.startWorker()
	if _, err := s.run("traced", actionInput(false)); err != nil {
		t.Fatal(err)
	}
	if err := tel.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, sp := range spans.GetSpans() {
		names[sp.Name] = sp.SpanContext.TraceID().String()
	}
	want := []string{"StartWorkflow:LLMAction", "RunWorkflow:LLMAction", "StartActivity:CallModel", "RunActivity:CallModel"}
	for _, n := range want {
		if _, ok := names[n]; !ok {
			t.Fatalf("no span %q among %v", n, names)
		}
	}
	if names["RunActivity:CallModel"] != names["StartWorkflow:LLMAction"] {
		t.Fatalf("the attempt's span is not in the action's trace: %v", names)
	}
}

// A worker killed mid-attempt (SIGKILL, in another process): the action
// ends up ambiguous, awaiting reconciliation, never silently retried.
func TestE2EWorkerKilledMidAttemptIsAmbiguous(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a worker process")
	}
	s := newStack(t)
	s.p.Push(providertest.Hold())
	dir := t.TempDir()
	cmd := s.helperWorker("DURALLM_HELPER_JOURNAL=" + dir)
	ctx := context.Background()
	a, err := s.c.Start(ctx, "killed", actionInput(false))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return s.p.ExecutedCount("killed") == 1 })
	// The request is on the wire: the worker journals it as sent.
	waitFor(t, func() bool {
		e, ok, _ := journal.Dir{Path: dir}.Lookup(ctx, entryID(t, dir))
		return ok && e.State == journal.Sent
	})
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// A worker in this process takes over the workflow; the attempt itself
	// is never retried. The built-in reconciler sees a sent record nobody
	// renews any more: a dead worker's, not waited for to the attempt's
	// deadline (60 s, past waitState's bound), and left to a person.
	s.startWorker(func(o *worker.Options) { o.Journal = journal.Dir{Path: dir} })
	st := s.waitState("killed", workflows.StateAwaitingReconciliation)
	if c := st.Attempts[0].Classification; c.Class != evidence.Ambiguous || c.Reason != "worker_lost_mid_attempt" {
		t.Fatalf("classified %s/%s", c.Class, c.Reason)
	}
	// The state is set as the reconciler starts; what it found follows.
	waitFor(t, func() bool {
		st, _ = s.c.Status(ctx, "killed")
		return st.Attempts[0].JournalState != ""
	})
	if js := st.Attempts[0].JournalState; js != string(journal.Sent) || st.State != workflows.StateAwaitingReconciliation {
		t.Fatalf("state %s, journal state %q, want sent", st.State, js)
	}
	if err := s.c.Reconcile(ctx, "killed", workflows.ReconcileRequest{Attempt: 1, Verdict: attempt.VerdictAbandon}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Result(ctx); err == nil {
		t.Fatal("abandoned action reported success")
	}
	if n := len(s.p.Received()); n != 1 {
		t.Fatalf("provider received %d requests; the killed attempt was re-sent", n)
	}
}

// A worker SIGKILLed after the response arrived but before it was
// reported: the attempt journal holds the answer the worker had, and the
// built-in reconciler settles the action with exactly it, by the journal,
// with no person involved and nothing sent again.
func TestE2EWorkerKilledAfterTheResponseIsReconciledFromTheJournal(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a worker process")
	}
	s := newStack(t)
	dir := t.TempDir()
	s.p.Push(providertest.Answer("the answer the killed worker had"))
	cmd := s.helperWorker("DURALLM_HELPER_HOLD_REPORT=" + dir)
	ctx := context.Background()
	a, err := s.c.Start(ctx, "killed-after-answer", actionInput(false))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		entries, _ := filepath.Glob(filepath.Join(dir, "*.json"))
		return len(entries) == 1
	})
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	s.startWorker(func(o *worker.Options) { o.Journal = journal.Dir{Path: dir} })
	res, err := a.Result(ctx)
	if err != nil {
		t.Fatalf("err %v", err)
	}
	if res.State != workflows.StateReconciled || res.Response == nil || res.Response.Text != "the answer the killed worker had" {
		t.Fatalf("state %s response %+v notes %v", res.State, res.Response, res.Notes)
	}
	if rec := res.Attempts[0]; rec.VerdictBy != attempt.ByJournal || len(res.Attempts) != 1 {
		t.Fatalf("attempts %+v", res.Attempts)
	}
	if n := len(s.p.Received()); n != 1 {
		t.Fatalf("provider received %d requests; nothing may be sent again", n)
	}
}

// helperWorker starts TestHelperWorkerProcess as a worker process on the
// stack's task queue (env adds to its settings); it is killed when the
// test ends, if the test has not killed it first.
func (s *stack) helperWorker(env ...string) *exec.Cmd {
	s.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWorkerProcess$")
	cmd.Env = append(append(os.Environ(),
		"DURALLM_HELPER_WORKER=1",
		"DURALLM_HELPER_TEMPORAL="+s.ts.GetFrontendHostPort(),
		"DURALLM_HELPER_NAMESPACE="+s.ts.GetDefaultNamespace(),
		"DURALLM_HELPER_QUEUE="+s.tq,
		"DURALLM_HELPER_PROVIDER="+s.p.H2CURL(),
	), env...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// TestHelperWorkerProcess is the worker process the kill test starts and
// kills. It does nothing in a normal run.
func TestHelperWorkerProcess(t *testing.T) {
	if os.Getenv("DURALLM_HELPER_WORKER") != "1" {
		t.Skip("helper process for TestE2EWorkerKilledMidAttemptIsAmbiguous")
	}
	tc, err := client.Dial(client.Options{HostPort: os.Getenv("DURALLM_HELPER_TEMPORAL"), Namespace: os.Getenv("DURALLM_HELPER_NAMESPACE"), Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	maxAttempts, _ := strconv.Atoi(os.Getenv("DURALLM_HELPER_MAX_ATTEMPTS")) // 0: the default
	helperRoutes := routes.Config{Routes: []routes.Route{
		{Name: "primary", Kind: "openai", BaseURL: os.Getenv("DURALLM_HELPER_PROVIDER") + "/v1", Model: "m", Capabilities: providers.Capabilities{Streaming: true}},
		{Name: "fallback", Kind: "openai", BaseURL: os.Getenv("DURALLM_HELPER_PROVIDER") + "/v1", Model: "m", Capabilities: providers.Capabilities{Streaming: true}},
	}}
	if settle := os.Getenv("DURALLM_HELPER_PROVIDER_RECORD"); settle != "" {
		// Routes whose provider keeps a record of every request.
		d, err := time.ParseDuration(settle)
		if err != nil {
			t.Fatal(err)
		}
		for i := range helperRoutes.Routes {
			helperRoutes.Routes[i].ProviderRecord, helperRoutes.Routes[i].ProviderRecordSettle = routes.ProviderRecordStoredCompletions, d
		}
	}
	if dir := os.Getenv("DURALLM_HELPER_HOLD_REPORT"); dir != "" {
		// A worker that journals each outcome and then never reports it:
		// killed here, it is a worker that had the answer in its hands.
		acts := &activities.Activities{
			Engine:  recovery.New(recovery.Config{AllowH2C: true, Logger: slog.New(slog.DiscardHandler)}),
			Routes:  helperRoutes.RouteMap(),
			Journal: journal.Dir{Path: dir}, Streams: activities.NewStreams(),
			SearchAttributes: true, Logger: slog.New(slog.DiscardHandler),
			BeforeReport: func(attempt.Outcome) { select {} },
		}
		w := sdkworker.New(tc, os.Getenv("DURALLM_HELPER_QUEUE"), sdkworker.Options{})
		worker.Register(w, acts)
		if err := w.Start(); err != nil {
			t.Fatal(err)
		}
		select {} // until killed
	}
	var j journal.Journal
	if dir := os.Getenv("DURALLM_HELPER_JOURNAL"); dir != "" {
		j = journal.Dir{Path: dir}
	}
	w, err := worker.New(tc, worker.Options{
		TaskQueue: os.Getenv("DURALLM_HELPER_QUEUE"), AllowH2C: true, SearchAttributes: true,
		Logger: slog.New(slog.DiscardHandler), MaxConcurrentAttempts: maxAttempts,
		Config: helperRoutes, Journal: j,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	select {} // until killed
}

func listed(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(fmt.Sprintf("condition not met in %s", 30*time.Second))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Starting an action id that already exists returned a handle on the old
// action, and its old result, as if a new one had run: the Go SDK returns
// the existing run unless WorkflowExecutionErrorWhenAlreadyStarted is set.
// Start promises an error wrapping serviceerror.WorkflowExecutionAlreadyStarted,
// whether the first action is still running or has ended.
func TestE2EStartingAnExistingActionIDIsAnError(t *testing.T) {
	s := newStack(t)
	s.startWorker()
	if _, err := s.run("same-id", actionInput(false)); err != nil {
		t.Fatal(err)
	}
	_, err := s.c.Start(context.Background(), "same-id", actionInput(false))
	var started *serviceerror.WorkflowExecutionAlreadyStarted
	if !errors.As(err, &started) {
		t.Fatalf("starting an ended action's id again: %v, want WorkflowExecutionAlreadyStarted", err)
	}
	s.p.Push(providertest.Hold())
	if _, err := s.c.Start(context.Background(), "running-id", actionInput(false)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return s.p.ExecutedCount("running-id") == 1 })
	if _, err := s.c.Start(context.Background(), "running-id", actionInput(false)); !errors.As(err, &started) {
		t.Fatalf("starting a running action's id again: %v, want WorkflowExecutionAlreadyStarted", err)
	}
	if n := len(s.p.Received()); n != 2 {
		t.Fatalf("provider received %d requests", n)
	}
}
