package messages_test

import (
	"testing"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/gateway/chat"
	"github.com/durallm/durallm/gateway/messages"
	"github.com/durallm/durallm/providers"
)

// BenchmarkReadAndRender is a surface's own work on a request: reading its
// body into the envelope and rendering the answer, for the same short
// request on the Messages and the chat-completions surfaces (the gateway
// benchmarks of internal/e2e measure the whole request; docs/performance.md).
//
//	go test -run '^$' -bench ReadAndRender -benchmem ./gateway/messages/
func BenchmarkReadAndRender(b *testing.B) {
	r := &providers.Response{Text: "ok", FinishReason: "stop", Usage: providers.Usage{PromptTokens: 3, CompletionTokens: 1, TotalTokens: 4}}
	for _, tc := range []struct {
		name string
		s    answer.Surface
		body string
	}{
		{"messages", messages.Surface{}, `{"model":"r","max_tokens":256,"messages":[{"role":"user","content":"hi"}]}`},
		{"chat", chat.Surface{}, `{"model":"r","messages":[{"role":"user","content":"hi"}]}`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			body := []byte(tc.body)
			for range b.N {
				if _, p := tc.s.Parse(body); p != nil {
					b.Fatal(p)
				}
				tc.s.Answer(answer.Answer{Identity: who, Response: r})
			}
		})
	}
}
