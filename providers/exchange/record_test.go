package exchange_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers/exchange"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/testsuite/providertest"
)

// recordRoute is the harness's route with stored completions, its key
// read from the environment.
func (h *harness) recordRoute() routes.Route {
	r := h.route()
	r.ProviderRecord, r.APIKeyEnv = routes.ProviderRecordStoredCompletions, "RECORD_TEST_KEY"
	return r
}

// find looks the attempt up as the reconciler does, with an attempt of
// its own, and returns what it found and how the lookup classified.
func (h *harness) find(route routes.Route, attemptID string) (exchange.Found, error, evidence.Classification) {
	h.t.Helper()
	a := recovery.NewAttempt(recovery.Spec{AttemptID: attemptID + "-lookup", Route: route.Name, DeferEvent: true})
	f, err := exchange.FindStored(recovery.WithAttempt(context.Background(), a), h.e, route, attemptID)
	_, c := a.Finish(f.Signal)
	return f, err, c
}

func TestARecordRouteStoresTheAttemptAndTheLookupFindsIt(t *testing.T) {
	for _, stream := range []bool{false, true} {
		h := newHarness(t)
		t.Setenv("RECORD_TEST_KEY", "sk-record")
		h.p.Push(providertest.Answer("the answer"))
		route := h.recordRoute()
		a := recovery.NewAttempt(recovery.Spec{ActionRef: "act-1", Attempt: 1, AttemptID: "run-1-1", Route: route.Name, ManualCommit: true, DeferEvent: true})
		res, err := exchange.CallOpenAI(recovery.WithAttempt(context.Background(), a), h.e, exchange.Call{Route: route, Request: chat(stream), Record: exchange.RecordIDs{AttemptID: "run-1-1", ActionRef: "act-1"}})
		if err != nil || res.Response.Text != "the answer" {
			t.Fatalf("stream %v: %+v %v", stream, res, err)
		}
		stored := h.p.Stored()
		if len(stored) != 1 || stored[0].Metadata[exchange.MetadataAttemptID] != "run-1-1" || stored[0].Metadata[exchange.MetadataActionID] != "act-1" || stored[0].ID != res.Response.ID {
			t.Fatalf("stream %v: stored %+v, answered %s", stream, stored, res.Response.ID)
		}

		var mu sync.Mutex
		var auth string
		h.p.Script(func(r providertest.Request) (providertest.Behavior, bool) {
			mu.Lock()
			defer mu.Unlock()
			auth = r.Header.Get("Authorization")
			return providertest.Behavior{}, false
		})
		f, err, c := h.find(route, "run-1-1")
		if err != nil || c.Class != evidence.Completed || len(f.Completions) != 1 || f.More || f.Foreign != 0 {
			t.Fatalf("stream %v: found %+v %v (%s)", stream, f, err, c.Class)
		}
		got := f.Completions[0]
		if !got.Usable || got.Response.Text != "the answer" || got.Response.FinishReason != "stop" || got.Response.Usage.TotalTokens == 0 || got.Response.ID != res.Response.ID {
			t.Fatalf("stream %v: stored answer %+v", stream, got)
		}
		mu.Lock()
		if auth != "Bearer sk-record" {
			t.Fatalf("the lookup did not use the route's key")
		}
		mu.Unlock()
		if f, err, _ := h.find(route, "run-2-1"); err != nil || len(f.Completions) != 0 {
			t.Fatalf("another attempt: %+v %v", f, err)
		}
		if n := h.p.AttemptExecutions("run-1-1"); n != 1 {
			t.Fatalf("executed %d times", n)
		}
	}
}

func TestARouteWithoutARecordSendsNoStore(t *testing.T) {
	h := newHarness(t)
	get := capture(h.p, providertest.Answer("ok"))
	h.call(context.Background(), h.route(), chat(false), nil).want(t, evidence.Completed)
	if len(h.p.Stored()) != 0 || strings.Contains(string(get().Body), `"store"`) || strings.Contains(string(get().Body), "durallm_attempt_id") {
		t.Fatalf("body %s", get().Body)
	}
}

func TestARequestTheRecordCannotCarryIsRefusedBeforeSending(t *testing.T) {
	h := newHarness(t)
	t.Setenv("RECORD_TEST_KEY", "sk-record")
	req := chat(false)
	req.Params = map[string]json.RawMessage{"store": json.RawMessage("false")}
	o := h.call(context.Background(), h.recordRoute(), req, nil)
	if !errors.Is(o.err, exchange.ErrUnsupported) || len(h.p.Received()) != 0 {
		t.Fatalf("err %v, received %d", o.err, len(h.p.Received()))
	}
	claude := h.recordRoute()
	claude.Kind = routes.KindAnthropic
	if _, err := exchange.CallAnthropic(context.Background(), h.e, exchange.Call{Route: claude, Request: chat(false), Record: exchange.RecordIDs{AttemptID: "a"}}); !errors.Is(err, exchange.ErrUnsupported) {
		t.Fatalf("anthropic with a record: %v", err)
	}
	if _, err, _ := h.find(h.route(), "a"); !errors.Is(err, exchange.ErrUnsupported) {
		t.Fatalf("a lookup on a route without a record: %v", err)
	}
}

func TestALookupTheProviderRefusesIsAnErrorItsClassJudges(t *testing.T) {
	for _, tc := range []struct {
		b    providertest.Behavior
		want evidence.Class
	}{
		{providertest.Unavailable(nil), evidence.Throttled},
		{providertest.Status(http.StatusNotFound, nil, `{"error":{"message":"no such route","type":"invalid_request_error"}}`), evidence.Rejected},
		{providertest.Status(http.StatusOK, nil, `not json`), evidence.EmptyResponse},
		{providertest.ServerError(http.StatusInternalServerError), evidence.UpstreamError},
	} {
		h := newHarness(t)
		t.Setenv("RECORD_TEST_KEY", "k")
		h.p.Script(func(providertest.Request) (providertest.Behavior, bool) { return tc.b, true })
		_, err, c := h.find(h.recordRoute(), "a")
		if err == nil || c.Class != tc.want {
			t.Errorf("%s: err %v, class %s, want %s", tc.b, err, c.Class, tc.want)
		}
		if tc.want != evidence.EmptyResponse && !errors.Is(err, exchange.ErrLookupFailed) {
			t.Errorf("%s: %v does not wrap ErrLookupFailed", tc.b, err)
		}
	}
}

func TestALookupOverHTTP1(t *testing.T) {
	h := newHarness(t)
	t.Setenv("RECORD_TEST_KEY", "k")
	route := h.recordRoute()
	route.BaseURL, route.HTTPVersion = h.p.HTTP1URL()+"/v1", "1.1"
	h.p.Push(providertest.Answer("over http/1.1"))
	a := recovery.NewAttempt(recovery.Spec{AttemptID: "h1-1", Route: route.Name, ManualCommit: true, DeferEvent: true})
	if _, err := exchange.CallOpenAI(recovery.WithAttempt(context.Background(), a), h.e, exchange.Call{Route: route, Request: chat(false), Record: exchange.RecordIDs{AttemptID: "h1-1", ActionRef: "act"}}); err != nil {
		t.Fatal(err)
	}
	f, err, c := h.find(route, "h1-1")
	if err != nil || c.Class != evidence.Completed || len(f.Completions) != 1 || f.Completions[0].Response.Text != "over http/1.1" {
		t.Fatalf("%+v %v %s", f, err, c.Class)
	}
}
