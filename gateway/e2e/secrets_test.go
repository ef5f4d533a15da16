package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3/option"

	"github.com/durallm/durallm/testsuite/providertest"
)

// Nothing of a prompt, an answer, a token, an Idempotency-Key or a route's
// API key reaches the logs, at Debug, of the gateway, the worker and the
// Temporal SDK, whatever the request did (answered, streamed, replayed,
// rejected with the prompt in the provider's error, refused).
func TestGatewayDebugLogsHoldNoContentTokenOrKey(t *testing.T) {
	const prompt, answer, idemKey, apiKey = "PROMPT-CANARY-5150", "ANSWER-CANARY-8086", "IDEMKEY-CANARY-6502", "sk-APIKEY-CANARY-1984"
	t.Setenv("DURALLM_GW_CANARY_KEY", apiKey)
	s := newGateway(t, func(o *stackOptions) { o.apiKeyEnv = "DURALLM_GW_CANARY_KEY" })
	s.p.SetDefault(providertest.Answer(answer))
	ctx := testCtx(t)
	c := s.client(tokenA, option.WithHeader("Idempotency-Key", idemKey))
	if _, err := c.Chat.Completions.New(ctx, chatParams("demo", prompt)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Chat.Completions.New(ctx, chatParams("demo", prompt)); err != nil { // replayed
		t.Fatal(err)
	}
	stream := s.client(tokenA).Chat.Completions.NewStreaming(ctx, chatParams("demo", prompt))
	for stream.Next() {
	}
	if stream.Err() != nil {
		t.Fatal(stream.Err())
	}
	s.p.Push(providertest.Status(400, nil, `{"error":{"type":"invalid_request_error","message":"bad: `+prompt+`"}}`))
	if _, err := s.client(tokenA).Chat.Completions.New(ctx, chatParams("demo", prompt)); err == nil {
		t.Fatal("a 400 succeeded")
	}
	// Refused: another body under the key, an unknown token.
	if r, _ := s.do(ctx, http.MethodPost, "/v1/chat/completions", tokenA, `{"model":"demo","messages":[{"role":"user","content":"other `+prompt+`"}]}`,
		map[string]string{"Idempotency-Key": idemKey}); r.StatusCode != 422 {
		t.Fatalf("reuse: %d", r.StatusCode)
	}
	if r, _ := s.do(ctx, http.MethodPost, "/v1/chat/completions", "TOKEN-CANARY-7777", chatBody, nil); r.StatusCode != 401 {
		t.Fatalf("unknown token: %d", r.StatusCode)
	}
	logs := s.logs.String()
	if !strings.Contains(logs, "gateway request") || !strings.Contains(logs, "llm.attempt") {
		t.Fatalf("the gateway's and the worker's debug lines were not captured:\n%.2000s", logs)
	}
	for _, canary := range []string{prompt, answer, idemKey, apiKey, tokenA, "TOKEN-CANARY-7777"} {
		if strings.Contains(logs, canary) {
			t.Errorf("the logs hold %q", canary)
		}
	}
}

// Tokens rotate without a restart: a new token works and the old one is
// refused once the file changes.
func TestGatewayTokensRotateWithoutRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.yaml")
	write := func(tok string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(fmt.Sprintf("tokens:\n  - id: a\n    sha256: %s\n", sum(tok))), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("tok-before")
	s := newGateway(t, func(o *stackOptions) { o.tokensFile = path })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tk := s.tokens()
	go tk.Watch(ctx, 10*time.Millisecond, nil)
	if r, b := s.do(testCtx(t), http.MethodPost, "/v1/chat/completions", "tok-before", chatBody, map[string]string{"Idempotency-Key": "rot"}); r.StatusCode != 200 {
		t.Fatalf("%d %s", r.StatusCode, b)
	}
	write("tok-after-rotation")
	if !eventually(func() bool {
		r, _ := s.do(testCtx(t), http.MethodGet, "/v1/models", "tok-after-rotation", "", nil)
		return r.StatusCode == 200
	}) {
		t.Fatal("the new token was never accepted")
	}
	if r, _ := s.do(testCtx(t), http.MethodGet, "/v1/models", "tok-before", "", nil); r.StatusCode != 401 {
		t.Fatalf("the old token: %d", r.StatusCode)
	}
	// The caller id is the same, so the same key finds the same action.
	r, _ := s.do(testCtx(t), http.MethodPost, "/v1/chat/completions", "tok-after-rotation", chatBody, map[string]string{"Idempotency-Key": "rot"})
	if r.StatusCode != 200 || r.Header.Get("X-Durallm-Replayed") != "true" || s.executed() != 1 {
		t.Fatalf("after rotation: %d %v executed %d", r.StatusCode, r.Header, s.executed())
	}
}
