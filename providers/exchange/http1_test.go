package exchange_test

import (
	"context"
	"errors"
	"testing"
	"time"

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
		o.want(t, recovery.Completed)
		if o.ev.HTTPVersion != "HTTP/1.1" || o.res.Response.Text != "ok" {
			t.Fatalf("stream %v: evidence %+v response %+v", stream, o.ev, o.res.Response)
		}
	}
	// "2" at the same HTTP/1.1 server is a configuration error, named.
	route.HTTPVersion = "2"
	o := h.call(context.Background(), route, chat(false), nil)
	o.want(t, recovery.Unsent)
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
	o.want(t, recovery.Ambiguous)
	if o.c.Reason != "timeout_after_send" || o.ev.HTTPVersion != "HTTP/1.1" {
		t.Fatalf("reason %s evidence %+v", o.c.Reason, o.ev)
	}
	if n := h.p.ExecutedCount("key-" + t.Name()); n != 1 {
		t.Fatalf("executed %d", n)
	}
}
