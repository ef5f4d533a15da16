package exchange

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// sendAnthropic sends r once through sendAnthropicMessage to a transport
// that answers with status and body, and returns every request it got.
func sendAnthropic(t *testing.T, route routes.Route, key string, r providers.Request, status int, body string) ([]*http.Request, *http.Response) {
	t.Helper()
	var sent []*http.Request
	rt := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		sent = append(sent, req)
		_, _ = io.Copy(io.Discard, req.Body)
		h := http.Header{"Content-Type": {"application/json"}}
		if status/100 == 3 {
			h.Set("Location", "http://127.0.0.1:2/v1/messages")
		}
		return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader(body)), Request: req}, nil
	})
	route = route.WithDefaults()
	url, err := route.Endpoint("messages")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := sendAnthropicMessage(context.Background(), rt, outgoing{route: route, key: key, url: url, request: r})
	if err != nil {
		t.Fatal(err)
	}
	return sent, resp
}

// The official client sends, and nothing of the SDK's environment gets in:
// not its key, token, base URL, custom headers or profile, nor a trace
// context; the key goes in x-api-key, the version is the adapter's, and
// the URL is the route's endpoint with its base URL's query.
func TestAnthropicSendsThroughTheOfficialClientOnly(t *testing.T) {
	t.Setenv("ANTHROPIC_API_KEY", "sk-from-env")
	t.Setenv("ANTHROPIC_AUTH_TOKEN", "tok-from-env")
	t.Setenv("ANTHROPIC_BASE_URL", "http://127.0.0.2:9/elsewhere")
	t.Setenv("ANTHROPIC_CUSTOM_HEADERS", "X-From-Env: 1")
	t.Setenv("ANTHROPIC_PROFILE", "from-env")
	t.Setenv("ANTHROPIC_OPEN_TELEMETRY_TRACES_CONTENT_MODE", "content")
	// An application embedding the worker may register a tracer provider and
	// a propagator: the client's spans would then carry the prompt (the
	// environment asks for content) and its trace headers would go upstream.
	spans := tracetest.NewSpanRecorder()
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)))
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTracerProvider(prevTP); otel.SetTextMapPropagator(prevProp) })
	route := routes.Route{Name: "claude", Kind: routes.KindAnthropic, BaseURL: "http://127.0.0.1:1/anthropic/v1?tenant=a", Model: "m"}
	for _, stream := range []bool{false, true} {
		r := providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hi")}, Stream: stream}
		sent, resp := sendAnthropic(t, route, "sk-route", r, 200, `{"content":[{"type":"text","text":"x"}]}`)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if len(sent) != 1 || string(b) != `{"content":[{"type":"text","text":"x"}]}` {
			t.Fatalf("stream=%v: sent %d times, body %q (want once, unread by the client)", stream, len(sent), b)
		}
		req, h := sent[0], sent[0].Header
		if req.URL.String() != "http://127.0.0.1:1/anthropic/v1/messages?tenant=a" || req.Method != http.MethodPost {
			t.Fatalf("stream=%v: sent %s %s", stream, req.Method, req.URL)
		}
		if h.Get("X-Api-Key") != "sk-route" || h.Get("Authorization") != "" || h.Get("Anthropic-Version") != AnthropicVersion ||
			h.Get("X-From-Env") != "" || h.Get("Traceparent") != "" {
			t.Fatalf("stream=%v: the environment or the SDK's defaults leaked in: %v", stream, redact(h))
		}
		if !strings.HasPrefix(h.Get("User-Agent"), "Anthropic/Go ") || h.Get("X-Stainless-Retry-Count") != "0" {
			t.Fatalf("stream=%v: not sent by the official client: %v", stream, redact(h))
		}
		if want := acceptFor(r); h.Get("Accept") != want {
			t.Fatalf("stream=%v: Accept %q, want %q", stream, h.Get("Accept"), want)
		}
	}
	if n := len(spans.Started()); n != 0 {
		t.Fatalf("the client started %d spans", n)
	}
	// No key source: no key header, and nothing from the environment.
	sent, resp := sendAnthropic(t, route, "", providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hi")}}, 200, `{}`)
	resp.Body.Close()
	if h := sent[0].Header; h.Get("X-Api-Key") != "" || h.Get("Authorization") != "" {
		t.Fatalf("a key was sent without a key source: %v", redact(h))
	}
}

// redact drops the key headers from h, for a failure message.
func redact(h http.Header) http.Header {
	c := h.Clone()
	c.Del("X-Api-Key")
	c.Del("Authorization")
	return c
}

// An answer the client would retry or follow by default (a redirect, an
// overloaded or failing server, a conflict) is sent once and comes back as
// it is, its body unread by the client.
func TestAnthropicClientNeverRetriesNorFollows(t *testing.T) {
	route := routes.Route{Name: "claude", Kind: routes.KindAnthropic, BaseURL: "http://127.0.0.1:1/v1", Model: "m"}
	for _, status := range []int{http.StatusTemporaryRedirect, http.StatusConflict, http.StatusTooManyRequests, http.StatusInternalServerError, 529} {
		for _, stream := range []bool{false, true} {
			body := `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`
			r := providers.Request{Messages: []providers.Message{providers.TextMessage("user", "hi")}, Stream: stream}
			sent, resp := sendAnthropic(t, route, "k", r, status, body)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if len(sent) != 1 || resp.StatusCode != status || string(b) != body {
				t.Fatalf("status %d stream=%v: sent %d times, got %d %q", status, stream, len(sent), resp.StatusCode, b)
			}
		}
	}
}

// The client refuses, before sending, a non-streamed request whose typed
// max_tokens it expects to take over ten minutes. The adapter's attempt
// timeout is what bounds an attempt, and the client only sees the body as
// JSON, so such a request is sent.
func TestAnthropicLargeMaxTokensWithoutStreamingIsSent(t *testing.T) {
	route := routes.Route{Name: "claude", Kind: routes.KindAnthropic, BaseURL: "http://127.0.0.1:1/v1", Model: "claude-opus-4-0"}
	r := providers.Request{Messages: []providers.Message{providers.TextMessage("user", "write a book")},
		Params: map[string]json.RawMessage{"max_tokens": json.RawMessage(`64000`)}}
	sent, resp := sendAnthropic(t, route, "k", r, 200, `{}`)
	resp.Body.Close()
	if len(sent) != 1 {
		t.Fatalf("sent %d times", len(sent))
	}
}

// Why the adapter encodes the Messages body itself and hands the client its
// JSON (docs/providers.md): the SDK's typed params have no sampling
// members, write extra fields in map order, and have no string content.
// When an SDK release changes this, the decision is worth revisiting.
func TestWhyTheAnthropicBodyIsTheAdaptersOwn(t *testing.T) {
	bodies := map[string]bool{}
	for range 100 {
		p := anthropic.MessageNewParams{Model: "m", MaxTokens: 8, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}
		p.SetExtraFields(map[string]any{"temperature": 0.2, "top_p": 0.9, "top_k": 40, "stream": true})
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		bodies[string(b)] = true
	}
	var typed anthropic.MessageNewParams
	if err := json.Unmarshal([]byte(`{"model":"m","max_tokens":8,"system":"s","messages":[{"role":"user","content":"hi"}],"temperature":0.5}`), &typed); err != nil {
		t.Fatal(err)
	}
	again, _ := json.Marshal(typed)
	if len(bodies) == 1 && strings.Contains(string(again), `"temperature"`) && strings.Contains(string(again), `"content":"hi"`) {
		t.Fatalf("the SDK's params now keep the body as the adapter writes it: %s", again)
	}
	t.Logf("%d distinct bodies from one request's params in 100 marshals; the params read back: %s", len(bodies), again)
}
