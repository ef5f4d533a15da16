package exchange

import (
	"context"
	"encoding/json"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// BenchmarkSend measures what sending through the official OpenAI client
// costs per request over posting the same bytes with rt.RoundTrip (the
// baseline), both against a transport that answers at once, so the figure
// is the client's own CPU and allocations. Run:
//
//	go test -run '^$' -bench BenchmarkSend -benchmem ./providers/exchange/
func BenchmarkSend(b *testing.B) {
	rt := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		_, _ = io.Copy(io.Discard, req.Body)
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(`{}`)), Request: req}, nil
	})
	route := routes.Route{Name: "r", Kind: routes.KindOpenAI, BaseURL: "http://127.0.0.1:1/v1", Model: "m"}
	req := providers.Request{
		Messages: []providers.Message{providers.TextMessage("system", "be brief"), providers.TextMessage("user", strings.Repeat("word ", 200))},
		Params:   map[string]json.RawMessage{"temperature": json.RawMessage(`0.2`)},
	}
	o := outgoing{route: route, key: "sk-bench", url: "http://127.0.0.1:1/v1/chat/completions", request: req}
	direct := postJSON(func(model string, r providers.Request) ([]byte, error) {
		p, err := chatParams(model, r)
		if err != nil {
			return nil, err
		}
		return json.Marshal(p)
	}, func(h http.Header, key string) { h.Set("Authorization", "Bearer "+key) })
	for _, bc := range []struct {
		name string
		send func(context.Context, http.RoundTripper, outgoing) (*http.Response, error)
	}{
		{"baseline=post", direct},
		{"openai-go", sendChatCompletion},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				resp, err := bc.send(context.Background(), rt, o)
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
			}
		})
	}
}
