package activities

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providers/exchange"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/testsuite/providertest"
)

// withRecordRoute adds the route "recorded", which keeps stored
// completions with the given settle window.
func withRecordRoute(a *Activities, p *providertest.Provider, settle time.Duration) {
	a.Routes["recorded"] = routes.Route{Name: "recorded", Kind: routes.KindOpenAI, BaseURL: p.URL() + "/v1", Model: "m",
		ProviderRecord: routes.ProviderRecordStoredCompletions, ProviderRecordSettle: settle}
}

// lostAnswer makes an attempt on "recorded" whose answer the provider
// generates (and stores) but the worker never gets: the attempt times
// out after sending, ambiguous. b is what the provider generates.
func lostAnswer(t *testing.T, a *Activities, p *providertest.Provider, b providertest.Behavior) attempt.ReconcileInput {
	t.Helper()
	gate := make(chan struct{})
	t.Cleanup(func() { close(gate) })
	p.Push(b.WaitFor(gate))
	in := attemptOn("recorded", hello())
	// Long enough to dial and send on a loaded machine.
	in.Timeout = time.Second
	out, err := a.CallModel(context.Background(), in)
	if err != nil || out.Classification.Class != evidence.Ambiguous {
		t.Fatalf("the attempt is %s (%s), %v; want ambiguous", out.Classification.Class, out.Classification.Reason, err)
	}
	return attempt.ReconcileInput{ActionRef: in.ActionRef, Attempt: in.Attempt, AttemptID: in.AttemptID, Route: in.Route, Evidence: out.Evidence}
}

// lookups counts the provider's record lookups it served.
func lookups(p *providertest.Provider) int {
	n := 0
	for _, r := range p.Received() {
		if r.Behavior == providertest.ListStored().String() {
			n++
		}
	}
	return n
}

func metricLine(t *testing.T, tel *telemetry.Telemetry, prefix string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	tel.Handler(nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	var lines []string
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(line, prefix) {
			lines = append(lines, line)
		}
	}
	return strings.Join(lines, "\n")
}

// withTelemetry gives a its own metrics.
func withTelemetry(t *testing.T, a *Activities) *telemetry.Telemetry {
	t.Helper()
	tel, err := telemetry.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	a.Telemetry = tel
	return tel
}

func TestAnAmbiguousAttemptIsSettledFromTheProvidersRecord(t *testing.T) {
	a, p := newActs(t)
	tel := withTelemetry(t, a)
	a.Journal = journal.Dir{Path: t.TempDir()}
	withRecordRoute(a, p, time.Second)
	in := lostAnswer(t, a, p, providertest.Answer("the provider's own answer"))
	out, err := a.Reconcile(context.Background(), in)
	if err != nil || out.Verdict != attempt.VerdictCompleted || out.By != attempt.ByProvider || out.ProviderRecord != attempt.ProviderRecordFound {
		t.Fatalf("out %+v err %v", out, err)
	}
	if r := out.Response; r == nil || r.Text != "the provider's own answer" || r.FinishReason != "stop" || r.Usage.TotalTokens == 0 || r.ID == "" {
		t.Fatalf("response %+v", out.Response)
	}
	if out.JournalState != string(journal.EndedUnanswered) || !strings.Contains(out.Note, "stored completion "+out.Response.ID) {
		t.Fatalf("journal state %q note %q", out.JournalState, out.Note)
	}
	if n := p.AttemptExecutions(in.AttemptID); n != 1 {
		t.Fatalf("executed %d times", n)
	}
	if got := metricLine(t, tel, "durallm_provider_record_lookups_total"); !strings.Contains(got, `result="found"`) || !strings.Contains(got, `route="recorded"`) {
		t.Fatalf("lookups metric %q", got)
	}
	if p, _ := a.DescribeRoutes(context.Background(), attempt.PlanInput{Routes: []string{"recorded"}}); p.Routes[0].ProviderRecordSettle != time.Second {
		t.Fatalf("plan %+v", p)
	}
}

func TestTheProvidersRecordSettlesAToolCall(t *testing.T) {
	a, p := newActs(t)
	withRecordRoute(a, p, time.Second)
	in := lostAnswer(t, a, p, providertest.AnswerToolCall("lookup", `{"q":"x"}`))
	out, err := a.Reconcile(context.Background(), in)
	if err != nil || out.Verdict != attempt.VerdictCompleted || out.Response.FinishReason != "tool_calls" || !strings.Contains(string(out.Response.ToolCalls), `"lookup"`) {
		t.Fatalf("out %+v err %v", out, err)
	}
}

// With no journal and no application reconciler, a route's record alone
// makes the plan run a reconciler.
func TestARecordRouteAloneRunsTheBuiltInReconciler(t *testing.T) {
	a, p := newActs(t)
	withRecordRoute(a, p, time.Second)
	for _, tc := range []struct {
		routes []string
		want   bool
	}{{[]string{"openai"}, false}, {[]string{"openai", "recorded"}, true}} {
		if plan, _ := a.DescribeRoutes(context.Background(), attempt.PlanInput{Routes: tc.routes}); plan.Reconciler != tc.want {
			t.Errorf("routes %v: reconciler %v", tc.routes, plan.Reconciler)
		}
	}
	// An attempt on a route without a record, when another route has one:
	// nothing to look at, and nothing to fail (and be tried again) either.
	if out, err := a.Reconcile(context.Background(), attempt.ReconcileInput{AttemptID: "x", Route: "openai"}); err != nil || out.Verdict != attempt.VerdictNone || !strings.Contains(out.Note, "keeps no provider record") || lookups(p) != 0 {
		t.Fatalf("a route without a record: %+v %v", out, err)
	}
	delete(a.Routes, "recorded")
	if _, err := a.Reconcile(context.Background(), attempt.ReconcileInput{AttemptID: "x", Route: "openai"}); !errors.Is(err, ErrNoReconciler) {
		t.Fatalf("no reconciler at all: %v", err)
	}
}

func TestAStoreThatLagsIsWaitedForWithinTheSettleWindow(t *testing.T) {
	a, p := newActs(t)
	withRecordRoute(a, p, 5*time.Second)
	p.SetStoreLag(time.Second)
	in := lostAnswer(t, a, p, providertest.Answer("late but there"))
	out, err := a.Reconcile(context.Background(), in)
	if err != nil || out.Verdict != attempt.VerdictCompleted || out.Response.Text != "late but there" {
		t.Fatalf("out %+v err %v", out, err)
	}
	if n := lookups(p); n < 2 {
		t.Fatalf("%d lookups: the first should have found nothing", n)
	}
}

// Not found is never proof of "not executed": past the window the
// attempt goes to the application reconciler, then a person, and the
// note says what the lookup found.
func TestNothingFoundWithinTheSettleWindowIsLeftToTheNext(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(p *providertest.Provider)
		b     providertest.Behavior
	}{
		{"the store lags past the window", func(p *providertest.Provider) { p.SetStoreLag(time.Hour) }, providertest.Answer("x")},
		{"the provider kept no record", nil, providertest.Answer("x").Unstored()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, p := newActs(t)
			withRecordRoute(a, p, 300*time.Millisecond)
			if tc.setup != nil {
				tc.setup(p)
			}
			in := lostAnswer(t, a, p, tc.b)
			out, err := a.Reconcile(context.Background(), in)
			if err != nil || out.Verdict != attempt.VerdictNone || out.By != attempt.ByProvider || out.ProviderRecord != attempt.ProviderRecordNotFound {
				t.Fatalf("out %+v err %v", out, err)
			}
			if !strings.Contains(out.Note, "lookup found nothing") || !strings.Contains(out.Note, "not proof") || lookups(p) < 2 {
				t.Fatalf("note %q after %d lookups", out.Note, lookups(p))
			}

			// The application reconciler comes next; its note follows.
			var asked atomic.Int32
			a.Reconciler = reconcilerFunc(func(context.Context, attempt.ReconcileInput) (attempt.ReconcileOutput, error) {
				asked.Add(1)
				return attempt.ReconcileOutput{Note: "the usage ledger has nothing either"}, nil
			})
			out, err = a.Reconcile(context.Background(), in)
			if err != nil || out.Verdict != attempt.VerdictNone || out.By != attempt.ByReconciler || asked.Load() != 1 || out.ProviderRecord != attempt.ProviderRecordNotFound ||
				!strings.Contains(out.Note, "lookup found nothing") || !strings.Contains(out.Note, "usage ledger") {
				t.Fatalf("out %+v err %v", out, err)
			}
		})
	}
}

type reconcilerFunc func(context.Context, attempt.ReconcileInput) (attempt.ReconcileOutput, error)

func (f reconcilerFunc) Reconcile(ctx context.Context, in attempt.ReconcileInput) (attempt.ReconcileOutput, error) {
	return f(ctx, in)
}

// Two stored completions for one attempt: the request was executed twice
// on its way. The first settles it; the second is evidence, and counted.
func TestSeveralRecordsSettleWithTheFirstAndCountTheDuplicate(t *testing.T) {
	a, p := newActs(t)
	tel := withTelemetry(t, a)
	withRecordRoute(a, p, time.Second)
	p.Push(providertest.Answer("first execution"))
	in := attemptOn("recorded", hello())
	if out, err := a.CallModel(context.Background(), in); err != nil || out.Classification.Class != evidence.Completed {
		t.Fatalf("first: %+v %v", out.Classification, err)
	}
	// The same attempt sent again, as a hidden replay would.
	again := lostAnswer(t, a, p, providertest.Answer("second execution"))
	if again.AttemptID != in.AttemptID || p.AttemptExecutions(in.AttemptID) != 2 {
		t.Fatalf("executions %d", p.AttemptExecutions(in.AttemptID))
	}
	out, err := a.Reconcile(context.Background(), again)
	if err != nil || out.Verdict != attempt.VerdictCompleted || out.Response.Text != "first execution" {
		t.Fatalf("out %+v err %v", out, err)
	}
	stored := p.Stored()
	if !strings.Contains(out.Note, "1 more stored completions") || !strings.Contains(out.Note, stored[1].ID) || !strings.Contains(out.Note, "executed more than once") {
		t.Fatalf("note %q", out.Note)
	}
	if got := metricLine(t, tel, "durallm_provider_record_duplicates_total"); !strings.Contains(got, `route="recorded"`) || !strings.HasSuffix(got, " 1") {
		t.Fatalf("duplicates metric %q", got)
	}
}

func TestARecordWithoutAUsableAnswerIsNoVerdict(t *testing.T) {
	a, p := newActs(t)
	withRecordRoute(a, p, 300*time.Millisecond)
	in := lostAnswer(t, a, p, providertest.Answer(""))
	out, err := a.Reconcile(context.Background(), in)
	if err != nil || out.Verdict != attempt.VerdictNone || out.ProviderRecord != attempt.ProviderRecordUnusable || !strings.Contains(out.Note, "was executed") {
		t.Fatalf("out %+v err %v", out, err)
	}
}

// A stored completion still in progress holds part of an answer at most:
// however much text it has, it settles nothing (contract section 5.6).
func TestAStoredCompletionInProgressWithTextSettlesNothing(t *testing.T) {
	a, p := newActs(t)
	withRecordRoute(a, p, 300*time.Millisecond)
	in := lostAnswer(t, a, p, providertest.Answer("x").Unstored())
	p.Script(func(r providertest.Request) (providertest.Behavior, bool) {
		if r.Method != http.MethodGet {
			return providertest.Behavior{}, false
		}
		return providertest.Status(http.StatusOK, nil, `{"object":"list","data":[{"id":"chatcmpl-half","object":"chat.completion","status":"in_progress",`+
			`"metadata":{"durallm_attempt_id":"`+in.AttemptID+`"},"choices":[{"index":0,"message":{"role":"assistant","content":"the first half of"}}]}]}`), true
	})
	out, err := a.Reconcile(context.Background(), in)
	if err != nil || out.Verdict != attempt.VerdictNone || out.ProviderRecord != attempt.ProviderRecordUnusable || out.Response != nil || !strings.Contains(out.Note, "chatcmpl-half") {
		t.Fatalf("out %+v err %v", out, err)
	}
}

func TestFailedLookupsSpendTheirOwnBudget(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fail      int // lookups the provider fails
		b         providertest.Behavior
		want      string
		atMostRun int
	}{
		{"two failures, then found", 2, providertest.Unavailable(nil), attempt.ProviderRecordFound, 3},
		{"three failures spend the budget", 100, providertest.ServerError(http.StatusBadGateway), attempt.ProviderRecordUnreadable, recordLookupFailures},
		{"a refused listing is not tried again", 100, providertest.Status(http.StatusNotFound, nil, `{"error":{"type":"invalid_request_error","message":"x"}}`), attempt.ProviderRecordUnreadable, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, p := newActs(t)
			withRecordRoute(a, p, 10*time.Second)
			in := lostAnswer(t, a, p, providertest.Answer("found at last"))
			var failed atomic.Int32
			p.Script(func(r providertest.Request) (providertest.Behavior, bool) {
				if r.Method == http.MethodGet && failed.Add(1) <= int32(tc.fail) {
					return tc.b, true
				}
				return providertest.Behavior{}, false
			})
			out, err := a.Reconcile(context.Background(), in)
			if err != nil || out.ProviderRecord != tc.want || int(failed.Load()) > tc.atMostRun {
				t.Fatalf("out %+v err %v after %d lookups", out, err, failed.Load())
			}
			if tc.want == attempt.ProviderRecordUnreadable && (out.Verdict != attempt.VerdictNone || !strings.Contains(out.Note, "could not be read")) {
				t.Fatalf("out %+v", out)
			}
		})
	}
}

// A provider that throttles the lookup asks to be left alone for a while:
// a throttled lookup is not a failed one (the record is there, the
// provider is busy), so it spends none of the three failures' budget, and
// the next waits at least as long as Retry-After says.
func TestThrottledLookupsHonourRetryAfterAndSpendNoFailure(t *testing.T) {
	t.Run("the record is found after the throttling", func(t *testing.T) {
		a, p := newActs(t)
		withRecordRoute(a, p, 20*time.Second)
		in := lostAnswer(t, a, p, providertest.Answer("found after the throttling"))
		var throttled atomic.Int32
		p.Script(func(r providertest.Request) (providertest.Behavior, bool) {
			if r.Method == http.MethodGet && throttled.Add(1) <= recordLookupFailures+1 {
				return providertest.TooManyRequests(providertest.RetryAfterMS(300)), true
			}
			return providertest.Behavior{}, false
		})
		out, err := a.Reconcile(context.Background(), in)
		if err != nil || out.ProviderRecord != attempt.ProviderRecordFound || out.Response == nil || out.Response.Text != "found after the throttling" {
			t.Fatalf("out %+v err %v after %d lookups", out, err, throttled.Load())
		}
	})
	t.Run("Retry-After paces the lookups", func(t *testing.T) {
		a, p := newActs(t)
		withRecordRoute(a, p, 3*time.Second)
		in := lostAnswer(t, a, p, providertest.Answer("x"))
		in.Remaining = 0
		var lookups atomic.Int32
		p.Script(func(r providertest.Request) (providertest.Behavior, bool) {
			if r.Method == http.MethodGet {
				lookups.Add(1)
				h := http.Header{}
				h.Set("Retry-After", "2")
				return providertest.TooManyRequests(h), true
			}
			return providertest.Behavior{}, false
		})
		out, err := a.Reconcile(context.Background(), in)
		// A 3 s window and 2 s between lookups leaves room for two;
		// ignoring Retry-After, the backoff (0.5 s, 1 s, 2 s) makes three
		// in 1.5 s, and three failures end the search.
		if err != nil || out.Verdict != attempt.VerdictNone || out.ProviderRecord != attempt.ProviderRecordUnreadable || lookups.Load() > 2 {
			t.Fatalf("out %+v err %v after %d lookups", out, err, lookups.Load())
		}
		if !strings.Contains(out.Note, "throttled") {
			t.Fatalf("the note does not say the provider throttled the lookups: %q", out.Note)
		}
	})
}

// A journaled answer settles the attempt before the provider is asked.
func TestTheJournalComesBeforeTheProvidersRecord(t *testing.T) {
	a, p := newActs(t)
	a.Journal = journal.Dir{Path: t.TempDir()}
	withRecordRoute(a, p, time.Second)
	in := attemptOn("recorded", hello())
	if out, err := a.CallModel(context.Background(), in); err != nil || out.Classification.Class != evidence.Completed {
		t.Fatal(out.Classification, err)
	}
	out, err := a.Reconcile(context.Background(), attempt.ReconcileInput{AttemptID: in.AttemptID, Route: "recorded"})
	if err != nil || out.By != attempt.ByJournal || lookups(p) != 0 {
		t.Fatalf("out %+v err %v, %d lookups", out, err, lookups(p))
	}
}

// A search cut short (its worker stops) has not found that nothing can
// tell: it fails, so Temporal runs it again.
func TestARecordSearchCutShortIsAnError(t *testing.T) {
	a, p := newActs(t)
	withRecordRoute(a, p, time.Hour)
	p.SetStoreLag(time.Hour)
	in := lostAnswer(t, a, p, providertest.Answer("x"))
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		for lookups(p) == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		cancel(ErrWorkerStopping)
	}()
	if _, err := a.Reconcile(ctx, in); !errors.Is(err, context.Canceled) || !errors.Is(err, ErrWorkerStopping) {
		t.Fatalf("err %v", err)
	}
}

// The request the provider stored carries what the lookup lists by.
func TestARecordRoutesRequestNamesTheAttemptAndTheAction(t *testing.T) {
	a, p := newActs(t)
	withRecordRoute(a, p, time.Second)
	in := attemptOn("recorded", hello())
	if _, err := a.CallModel(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	s := p.Stored()
	if len(s) != 1 || s[0].Metadata[exchange.MetadataAttemptID] != in.AttemptID || s[0].Metadata[exchange.MetadataActionID] != in.ActionRef {
		t.Fatalf("stored %+v", s)
	}
}
