// Package answertest holds what the tests of the gateway's surfaces
// share: the common clients' default policies for sending a request again
// after an answer, as their sources say (docs/gateway.md has the table,
// with the versions read), and the check that no answer to a request whose
// action may have run is one that a client resends by default.
package answertest

import (
	"net/http"
	"testing"

	"github.com/durallm/durallm/gateway/answer"
)

// Client is a client library's default decision to send a request again
// after an HTTP answer.
type Client struct {
	Name    string
	Resends func(status int, h http.Header) bool
}

// The common clients of the gateway's APIs.
var (
	// Stainless is the rule of the clients Stainless generates:
	// openai-node 6.49.0 and 7.59.0 (client.js shouldRetry),
	// openai-python (_base_client.py _should_retry), openai-go v3.99.0
	// (internal/requestconfig shouldRetry), @anthropic-ai/sdk 1.15.0
	// (client.js shouldRetry) and anthropic-sdk-go v2.15.0
	// (internal/requestconfig shouldRetry): x-should-retry first, then
	// 408, 409, 429 and 5xx.
	Stainless = Client{"the Stainless SDKs (OpenAI's and Anthropic's)", func(status int, h http.Header) bool {
		switch h.Get("X-Should-Retry") {
		case "true":
			return true
		case "false":
			return false
		}
		return retryableStatus(status)
	}}
	// AISDK is the AI SDK's: ai 6.0.326 and 7.0.173 retry an
	// APICallError whose isRetryable is true, which @ai-sdk/provider
	// 3.0.19 and 4.0.38 default from the status alone, and which neither
	// @ai-sdk/openai-compatible 3.0.92 nor @ai-sdk/anthropic 4.0.105 sets
	// otherwise. No x-should-retry.
	AISDK = Client{"the AI SDK", func(status int, _ http.Header) bool { return retryableStatus(status) }}
	// LangChain is @langchain/core 1.4.0's AsyncCaller
	// (defaultFailedAttemptHandler), which @langchain/openai 1.6.0 and
	// @langchain/anthropic 1.5.11 use over their SDK's client with
	// maxRetries 0: every status but these (429 after its own rules).
	LangChain = Client{"LangChain", func(status int, _ http.Header) bool {
		switch status {
		case 400, 401, 402, 403, 404, 405, 406, 407, 409, 413:
			return false
		}
		return true
	}}
	// Clients are all of them.
	Clients = []Client{Stainless, AISDK, LangChain}
)

func retryableStatus(status int) bool {
	return status == 408 || status == 409 || status == 429 || status >= 500
}

// Kinds are the kinds a surface renders as a status. StreamIncomplete is
// left out: it is only ever an in-band error, after a stream's 200.
var Kinds = []answer.Kind{answer.InvalidRequest, answer.Unauthorized, answer.Forbidden, answer.NotFound, answer.ModelNotFound,
	answer.MethodNotAllowed, answer.UnsupportedMediaType, answer.NotImplemented, answer.TooLarge, answer.RequestTimeout, answer.KeyReused, answer.CallerLimit,
	answer.UnavailableNothingStarted, answer.MaybeStarted, answer.Rejected, answer.ContentFiltered, answer.UpstreamAuth,
	answer.Failed, answer.SpendExhausted, answer.AwaitingVerdict, answer.Indeterminate, answer.Canceled, answer.InProgress, answer.Conflict, answer.Internal}

// NoResendOfWhatMayHaveRun checks the surface's answer to every kind: none
// whose action may have run (answer.Kind.MayHaveRun) has a status that one
// of the clients resends by default, since without a key a resend runs
// the model again; and x-should-retry says true exactly for the kinds
// whose request may be sent again whatever it carried
// (answer.Kind.Resendable).
func NoResendOfWhatMayHaveRun(t testing.TB, s answer.Surface, clients ...Client) {
	t.Helper()
	for _, k := range Kinds {
		r := s.Problem(answer.Problem{Kind: k, ProviderStatus: 500})
		for _, c := range clients {
			if k.MayHaveRun() && c.Resends(r.Status, r.Header) {
				t.Errorf("%s: %s resends a %d, and the action may have run", k, c.Name, r.Status)
			}
		}
		if got, want := r.Header.Get("X-Should-Retry"), map[bool]string{true: "true", false: "false"}[k.Resendable()]; got != want {
			t.Errorf("%s: x-should-retry %q, want %q", k, got, want)
		}
	}
}
