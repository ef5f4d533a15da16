package exchange_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers/exchange"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/testsuite/providertest"
)

// The route's http_version reaches the engine: a route at the provider's
// HTTP/1.1 listener answers over HTTP/1.1, streaming and not.
func TestRouteHTTPVersionReachesTheEngine(t *testing.T) {
	h := newHarness(t)
	route := h.route()
	route.BaseURL, route.HTTPVersion = h.p.HTTP1URL()+"/v1", "1.1"
	for _, stream := range []bool{false, true} {
		o := h.call(context.Background(), route, chat(stream), &recSink{})
		o.want(t, evidence.Completed)
		if o.ev.HTTPVersion != "HTTP/1.1" || o.res.Response.Text != "ok" {
			t.Fatalf("stream %v: evidence %+v response %+v", stream, o.ev, o.res.Response)
		}
	}
	// "2" at the same HTTP/1.1 server is a configuration error, named.
	route.HTTPVersion = "2"
	o := h.call(context.Background(), route, chat(false), nil)
	o.want(t, evidence.Unsent)
	if !errors.Is(o.err, recovery.ErrSpeaksHTTP1) {
		t.Fatalf("err %v", o.err)
	}
}

// Fault: a slow first byte over HTTP/1.1. The first-byte timer ends the
// wait after the request was written: ambiguous, executed once.
func TestHTTP1SlowFirstByteHitsTheFirstByteTimeout(t *testing.T) {
	h := newHarness(t)
	h.p.Push(providertest.Answer("late").After(time.Hour))
	route := h.route()
	route.BaseURL, route.HTTPVersion, route.FirstByteTimeout = h.p.HTTP1URL()+"/v1", "1.1", short
	o := h.call(context.Background(), route, chat(true), &recSink{})
	if !errors.Is(o.err, exchange.ErrFirstByteTimeout) {
		t.Fatalf("err = %v, want ErrFirstByteTimeout", o.err)
	}
	o.want(t, evidence.Ambiguous)
	if o.c.Reason != "timeout_after_send" || o.ev.HTTPVersion != "HTTP/1.1" {
		t.Fatalf("reason %s evidence %+v", o.c.Reason, o.ev)
	}
	if n := h.p.ExecutedCount("key-" + t.Name()); n != 1 {
		t.Fatalf("executed %d", n)
	}
}

// A stream read to [DONE] from a server that keeps the body open after it
// (keep-alive comments, never ending) is completed, over HTTP/1.1 as over
// HTTP/2. Closing the HTTP/1.1 body used to read the rest, holding the
// attempt until its timer, which then made it committed_partial. The
// attempt timeout is long, so a close that waits shows as that class.
func TestAStreamReadToDoneFromAServerThatKeepsTheBodyOpenIsCompleted(t *testing.T) {
	h := newHarness(t)
	for _, version := range []string{"1.1", "2"} {
		t.Run("http_version="+version, func(t *testing.T) {
			h.p.Push(providertest.AnswerThenKeepOpen("the whole answer"))
			route := h.route()
			if version == "1.1" {
				route.BaseURL = h.p.HTTP1URL() + "/v1"
			}
			route.HTTPVersion, route.AttemptTimeout = version, 10*time.Second
			o := h.call(context.Background(), route, chat(true), &recSink{})
			o.want(t, evidence.Completed)
			if o.err != nil || o.res.Response.Text != "the whole answer" || o.res.Response.Partial || o.ev.TimedOut {
				t.Fatalf("err %v response %+v evidence %+v", o.err, o.res.Response, o.ev)
			}
		})
	}
}

// A non-streamed 200 past MaxResponseBytes whose server keeps sending is
// empty_response, as the size bound says. The close that followed the
// bound read the rest until the attempt timer, and the attempt became
// ambiguous.
func TestAnOverSizeBodyFromAServerThatKeepsSendingIsEmptyResponse(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		chunk := []byte(strings.Repeat("x", 1<<20))
		// Past the bound, then on until the client goes.
		for r.Context().Err() == nil {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	h := newHarness(t)
	h.manual = true
	route := h.route()
	route.BaseURL, route.HTTPVersion, route.AttemptTimeout = srv.URL+"/v1", "1.1", 10*time.Second
	o := h.call(context.Background(), route, chat(false), nil)
	if !errors.Is(o.err, exchange.ErrResponseTooLarge) {
		t.Fatalf("err = %v, want ErrResponseTooLarge", o.err)
	}
	o.want(t, evidence.EmptyResponse)
	if o.ev.TimedOut {
		t.Fatalf("the attempt waited for its timer: %+v", o.ev)
	}
}
