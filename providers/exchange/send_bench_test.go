package exchange

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
)

// BenchmarkSend measures what sending through an official client costs per
// request over posting the same bytes with rt.RoundTrip (the baseline),
// both against a transport that answers at once, so the figure is the
// client's own CPU and allocations. Run:
//
//	go test -run '^$' -bench BenchmarkSend -benchmem ./providers/exchange/
func BenchmarkSend(b *testing.B) {
	rt := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		_, _ = io.Copy(io.Discard, req.Body)
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(`{}`)), Request: req}, nil
	})
	req := providers.Request{
		Messages: []providers.Message{providers.TextMessage("system", "be brief"), providers.TextMessage("user", strings.Repeat("word ", 200))},
		Params:   map[string]json.RawMessage{"temperature": json.RawMessage(`0.2`)},
	}
	chat := outgoing{route: routes.Route{Name: "r", Kind: routes.KindOpenAI, BaseURL: "http://127.0.0.1:1/v1", Model: "m"},
		key: "sk-bench", url: "http://127.0.0.1:1/v1/chat/completions", request: req}
	messages := outgoing{route: routes.Route{Name: "r", Kind: routes.KindAnthropic, BaseURL: "http://127.0.0.1:1/v1", Model: "m"}.WithDefaults(),
		key: "sk-bench", url: "http://127.0.0.1:1/v1/messages", request: req}
	chatBody := func(model string, r providers.Request) ([]byte, error) {
		p, err := chatParams(model, r)
		if err != nil {
			return nil, err
		}
		return json.Marshal(p)
	}
	for _, bc := range []struct {
		name string
		o    outgoing
		send func(context.Context, http.RoundTripper, outgoing) (*http.Response, error)
	}{
		{"chat/baseline=post", chat, postJSON(chatBody, func(h http.Header, key string) { h.Set("Authorization", "Bearer "+key) })},
		{"chat/openai-go", chat, sendChatCompletion},
		{"messages/baseline=post", messages, postJSON(anthropicRequestBody, func(h http.Header, key string) {
			h.Set("anthropic-version", AnthropicVersion)
			h.Set("x-api-key", key)
		})},
		{"messages/anthropic-sdk-go", messages, sendAnthropicMessage},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				resp, err := bc.send(context.Background(), rt, bc.o)
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
			}
		})
	}
}

// postJSON is the baseline send: one POST of body(model, request) to the
// endpoint URL with rt.RoundTrip, the headers set by auth.
func postJSON(body func(model string, r providers.Request) ([]byte, error), auth func(h http.Header, key string)) func(context.Context, http.RoundTripper, outgoing) (*http.Response, error) {
	return func(ctx context.Context, rt http.RoundTripper, o outgoing) (*http.Response, error) {
		b, err := body(o.route.Model, o.request)
		if err != nil {
			return nil, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.url, bytes.NewReader(b))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", acceptFor(o.request))
		auth(req.Header, o.key)
		return rt.RoundTrip(req)
	}
}
