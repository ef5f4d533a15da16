package activities

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/testsuite"
)

// CallModel outside Temporal (no heartbeats): one attempt through the real
// engine to the testsuite provider.
func newActs(t *testing.T) (*Activities, *testsuite.Provider) {
	t.Helper()
	p, err := testsuite.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	e := recovery.New(recovery.Config{TLSClientConfig: p.ClientTLSConfig(), Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { e.Close(); p.Close() })
	return &Activities{Engine: e, Routes: map[string]providers.Route{
		"openai":    {Name: "openai", Kind: providers.KindOpenAI, BaseURL: p.URL() + "/v1", Model: "m"},
		"anthropic": {Name: "anthropic", Kind: providers.KindAnthropic, BaseURL: p.URL() + "/v1", Model: "claude"},
	}}, p
}

func attempt(route string, req providers.Request) AttemptInput {
	return AttemptInput{ActionRef: "act", Attempt: 1, AttemptID: "act-1-" + route, IdempotencyKey: "act", Route: route, Request: req}
}

func hello() providers.Request {
	return providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hello")}}
}

func TestCallModelCompletes(t *testing.T) {
	a, p := newActs(t)
	out, err := a.CallModel(context.Background(), attempt("openai", hello()))
	if err != nil || out.Classification.Class != recovery.Completed || out.Response == nil || out.Response.Text != "ok" {
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
		want         recovery.Class
	}{{false, recovery.Refused}, {true, recovery.Ambiguous}} {
		a, p := newActs(t)
		r := a.Routes["openai"]
		r.Intermediary = tc.intermediary
		a.Routes["openai"] = r
		p.Push(testsuite.RefuseStream())
		out, err := a.CallModel(context.Background(), attempt("openai", hello()))
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
	out, err := a.CallModel(context.Background(), attempt("nope", hello()))
	if err != nil || out.Classification.Class != recovery.IncompatibleRoute || !out.Classification.Fallback {
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
	out, err := a.CallModel(context.Background(), attempt("anthropic", req))
	if err != nil || out.Classification.Class != recovery.IncompatibleRoute || out.Classification.SameRoute {
		t.Fatalf("outcome %+v err %v", out.Classification, err)
	}
	if n := len(p.Received()); n != 0 {
		t.Fatalf("provider received %d requests", n)
	}
}

func TestCallModelCanceledReturnsTheContextError(t *testing.T) {
	a, p := newActs(t)
	p.Push(testsuite.Hold())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var out Outcome
	go func() {
		var err error
		out, err = a.CallModel(ctx, attempt("openai", hello()))
		done <- err
	}()
	for p.AttemptExecutions("act-1-openai") == 0 {
		select {
		case err := <-done:
			t.Fatalf("returned before the provider held it: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	err := <-done
	if err == nil || !errors.Is(err, context.Canceled) || out.Classification.Class != recovery.Canceled {
		t.Fatalf("err %v outcome %+v", err, out.Classification)
	}
}

func TestCallModelStoresALargeResponseByReference(t *testing.T) {
	a, p := newActs(t)
	a.Results = resultstore.Dir{Path: t.TempDir()}
	a.LargeResponseBytes = 4096
	big := strings.Repeat("lorem ", 2000)
	p.Push(testsuite.Answer(big))
	out, err := a.CallModel(context.Background(), attempt("openai", hello()))
	if err != nil || out.Classification.Class != recovery.Completed || out.Response != nil || out.ResponseRef == "" {
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
	out, err = a.CallModel(context.Background(), AttemptInput{ActionRef: "act2", Attempt: 1, AttemptID: "act2-1", Route: "openai", Request: hello()})
	if err != nil || out.Response == nil || out.ResponseRef != "" {
		t.Fatalf("small answer: %+v ref %q", out.Response, out.ResponseRef)
	}
}
