package responses_test

import (
	"testing"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/gateway/chat"
	gwresponses "github.com/durallm/durallm/gateway/responses"
	"github.com/durallm/durallm/providers"
)

// BenchmarkReadAndRender is a surface's own work on a request: reading
// its body into the envelope and rendering the answer, for the same short
// request on the Responses and the chat-completions surfaces (the gateway
// benchmarks of internal/e2e measure the whole request;
// docs/performance.md).
//
//	go test -run '^$' -bench ReadAndRender -benchmem ./gateway/responses/
func BenchmarkReadAndRender(b *testing.B) {
	b.Run("responses", readAndRender(gwresponses.Surface{}, `{"model":"r","input":"hi"}`))
	b.Run("chat", readAndRender(chat.Surface{}, `{"model":"r","messages":[{"role":"user","content":"hi"}]}`))
}

func readAndRender(s answer.Surface, body string) func(*testing.B) {
	r := &providers.Response{Text: "ok", FinishReason: "stop", Usage: providers.Usage{PromptTokens: 3, CompletionTokens: 1, TotalTokens: 4}}
	in := []byte(body)
	return func(b *testing.B) {
		for range b.N {
			if _, p := s.Parse(in); p != nil {
				b.Fatal(p)
			}
			s.Answer(answer.Answer{Identity: who, Response: r})
		}
	}
}
