package chat

import (
	"net/http"
	"testing"

	"github.com/durallm/durallm/gateway/answer"
)

// clientPolicy is a client library's default decision to send a request
// again after an HTTP answer, as its source says (docs/gateway.md has the
// table, with the versions read).
type clientPolicy struct {
	name    string
	retries func(status int, h http.Header) bool
}

// stainless is the rule of the clients Stainless generates: openai-node
// 6.49.0 and 7.59.0 (client.js shouldRetry), openai-python
// (_base_client.py _should_retry), openai-go v3.99.0
// (internal/requestconfig shouldRetry), @anthropic-ai/sdk 1.15.0 and
// anthropic-sdk-go v2.15.0: x-should-retry first, then 408, 409, 429 and
// 5xx.
func stainless(status int, h http.Header) bool {
	switch h.Get("X-Should-Retry") {
	case "true":
		return true
	case "false":
		return false
	}
	return status == 408 || status == 409 || status == 429 || status >= 500
}

// clients are the common clients' default policies.
var clients = []clientPolicy{
	{"openai-node, openai-python, openai-go, the Anthropic SDKs", stainless},
	// ai 6.0.326 and 7.0.173 retry an APICallError whose isRetryable is
	// true; @ai-sdk/provider 3.0.19 and 4.0.38 default it from the status
	// alone, and @ai-sdk/openai-compatible 3.0.92 sets no other. No
	// x-should-retry.
	{"the AI SDK", func(status int, _ http.Header) bool {
		return status == 408 || status == 409 || status == 429 || status >= 500
	}},
	// @langchain/core 1.4.0 AsyncCaller (defaultFailedAttemptHandler),
	// which @langchain/openai 1.6.0 uses over an OpenAI client with
	// maxRetries 0: every status but these (429 after its own rules).
	{"LangChain", func(status int, _ http.Header) bool {
		switch status {
		case 400, 401, 402, 403, 404, 405, 406, 407, 409, 413:
			return false
		}
		return true
	}},
}

// No answer to a request whose action may have run is one that a common
// client sends again by default: without a key, a resend runs the model
// again. Only the refusals that started nothing invite one, to the
// clients that read x-should-retry.
func TestNoAnswerThatMayHaveRunIsRetriedByAClientsDefaultPolicy(t *testing.T) {
	kinds := []answer.Kind{answer.InvalidRequest, answer.Unauthorized, answer.Forbidden, answer.NotFound, answer.ModelNotFound,
		answer.MethodNotAllowed, answer.UnsupportedMediaType, answer.TooLarge, answer.KeyReused, answer.CallerLimit,
		answer.UnavailableNothingStarted, answer.MaybeStarted, answer.Rejected, answer.ContentFiltered, answer.UpstreamAuth,
		answer.Failed, answer.SpendExhausted, answer.RequestTimeout, answer.AwaitingVerdict, answer.Indeterminate, answer.Canceled, answer.InProgress, answer.Conflict, answer.Internal}
	for _, k := range kinds {
		r := Surface{}.Problem(answer.Problem{Kind: k, ProviderStatus: 500})
		for _, c := range clients {
			if k.MayHaveRun() && c.retries(r.Status, r.Header) {
				t.Errorf("%s: %s resends a %d, and the action may have run", k, c.name, r.Status)
			}
		}
		if got, want := r.Header.Get("X-Should-Retry"), map[bool]string{true: "true", false: "false"}[k.Resendable()]; got != want {
			t.Errorf("%s: x-should-retry %q, want %q", k, got, want)
		}
	}
}
