package messages

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/gateway/answer/answertest"
	"github.com/durallm/durallm/providers"
)

// Each kind's answer: status, Anthropic's type, durallm's error code and
// whether the SDKs may send it again.
func TestRender(t *testing.T) {
	cases := []struct {
		p      answer.Problem
		status int
		typ    string
		code   string
		retry  bool
	}{
		{answer.Problem{Kind: answer.InvalidRequest, Param: "messages.0.role", Message: "must be user"}, 400, "invalid_request_error", "", false},
		{answer.Problem{Kind: answer.Unauthorized, Message: "no key"}, 401, "authentication_error", "", false},
		{answer.Problem{Kind: answer.Forbidden, Code: "operator_only", Message: "no"}, 403, "permission_error", "operator_only", false},
		{answer.Problem{Kind: answer.NotFound, Message: "no such action"}, 404, "not_found_error", "", false},
		{answer.Problem{Kind: answer.ModelNotFound, Param: "model", Message: "no such model"}, 404, "not_found_error", "", false},
		{answer.Problem{Kind: answer.MethodNotAllowed, Allow: "POST", Message: "use POST"}, 405, "invalid_request_error", "", false},
		{answer.Problem{Kind: answer.NotImplemented, Message: "not served"}, 501, "api_error", CodeNotImplemented, false},
		{answer.Problem{Kind: answer.TooLarge, Message: "too large"}, 413, "request_too_large", "", false},
		{answer.Problem{Kind: answer.RequestTimeout, Message: "late"}, 408, "invalid_request_error", CodeRequestTimeout, true},
		{answer.Problem{Kind: answer.KeyReused, Message: "reused"}, 422, "invalid_request_error", CodeKeyReused, false},
		{answer.Problem{Kind: answer.CallerLimit, RetryAfter: time.Second, Message: "limit"}, 429, "rate_limit_error", CodeCallerLimit, true},
		{answer.Problem{Kind: answer.UnavailableNothingStarted, RetryAfter: time.Second, Message: "down"}, 529, "overloaded_error", CodeUnavailable, true},
		{answer.Problem{Kind: answer.Rejected, Code: "provider_rejected", ProviderStatus: 400,
			ProviderError: &providers.APIError{Type: "invalid_request_error", Message: "messages: bad"}}, 400, "invalid_request_error", "provider_rejected", false},
		{answer.Problem{Kind: answer.Rejected, Code: "provider_rejected", ProviderStatus: 404,
			ProviderError: &providers.APIError{Type: "invalid_request_error", Code: "model_not_found", Message: "no model"}}, 404, "invalid_request_error", "model_not_found", false},
		{answer.Problem{Kind: answer.Rejected, Code: "provider_rejected", ProviderStatus: 413, Message: "rejected"}, 413, "request_too_large", "provider_rejected", false},
		{answer.Problem{Kind: answer.Rejected, Code: "provider_rejected", ProviderStatus: 422, Message: "rejected"}, 422, "invalid_request_error", "provider_rejected", false},
		{answer.Problem{Kind: answer.Rejected, Code: "provider_rejected", ProviderStatus: 418,
			ProviderError: &providers.APIError{Type: "teapot", Message: "short and stout"}}, 400, "invalid_request_error", "provider_rejected", false},
		{answer.Problem{Kind: answer.ContentFiltered, Message: "filtered"}, 400, "invalid_request_error", CodeContentFilter, false},
		{answer.Problem{Kind: answer.UpstreamAuth, Code: "401", Message: "the route's key"}, 502, "api_error", "401", false},
		{answer.Problem{Kind: answer.Failed, Code: "budget_exhausted", RetryAfter: 3 * time.Second, Message: "failed"}, 502, "api_error", "budget_exhausted", false},
		{answer.Problem{Kind: answer.SpendExhausted, Code: "token_budget_exhausted", Message: "spent"}, 402, "billing_error", "token_budget_exhausted", false},
		{answer.Problem{Kind: answer.AwaitingVerdict, Message: "awaiting"}, 403, "conflict_error", CodeAwaitingReconciliation, false},
		{answer.Problem{Kind: answer.MaybeStarted, Message: "maybe"}, 403, "conflict_error", CodeMaybeStarted, false},
		{answer.Problem{Kind: answer.Indeterminate, Code: "reconcile_timeout", Message: "indeterminate"}, 403, "conflict_error", "reconcile_timeout", false},
		{answer.Problem{Kind: answer.Canceled, Code: "user_stop", Message: "canceled"}, 403, "conflict_error", "user_stop", false},
		{answer.Problem{Kind: answer.InProgress, Message: "running"}, 403, "conflict_error", CodeInProgress, false},
		{answer.Problem{Kind: answer.Conflict, Code: "action_ended", Message: "ended"}, 409, "conflict_error", "action_ended", false},
		{answer.Problem{Kind: answer.Internal, Message: "broken"}, 500, "api_error", "", false},
	}
	for _, tc := range cases {
		t.Run(string(tc.p.Kind), func(t *testing.T) {
			r := render(tc.p)
			if r.Status != tc.status || r.Header.Get("X-Should-Retry") != map[bool]string{true: "true", false: "false"}[tc.retry] ||
				r.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("answer %d %v", r.Status, r.Header)
			}
			if (tc.p.RetryAfter > 0) != (r.Header.Get("Retry-After") != "") {
				t.Fatalf("Retry-After %q", r.Header.Get("Retry-After"))
			}
			if tc.p.Allow != "" && r.Header.Get("Allow") != tc.p.Allow {
				t.Fatalf("Allow %q", r.Header.Get("Allow"))
			}
			var body struct {
				Type  string `json:"type"`
				Error struct {
					Type    string `json:"type"`
					Message string `json:"message"`
					Details *struct {
						ErrorCode string `json:"error_code"`
					} `json:"details"`
				} `json:"error"`
			}
			if err := json.Unmarshal(r.Body, &body); err != nil || body.Type != "error" || body.Error.Type != tc.typ || body.Error.Message == "" {
				t.Fatalf("body %s", r.Body)
			}
			if (body.Error.Details == nil) != (tc.code == "") || (body.Error.Details != nil && body.Error.Details.ErrorCode != tc.code) {
				t.Fatalf("details in %s", r.Body)
			}
		})
	}
}

// The words of each message that a caller acts on: the member at fault
// before the message, and the provider's own message for a rejection.
func TestErrorMessages(t *testing.T) {
	for _, tc := range []struct {
		p    answer.Problem
		want string
	}{
		{answer.Problem{Kind: answer.InvalidRequest, Param: "messages.0.role", Message: "must be user"}, "messages.0.role: must be user"},
		{answer.Problem{Kind: answer.Rejected, ProviderStatus: 400, Message: "the provider rejected the request",
			ProviderError: &providers.APIError{Message: "prompt is too long"}}, "prompt is too long"},
		{answer.Problem{Kind: answer.ContentFiltered, Message: "filtered", ProviderError: &providers.APIError{Message: "flagged"}}, "flagged"},
		{answer.Problem{Kind: answer.Internal}, "internal"},
	} {
		if e := wireErrorOf(tc.p); e.message != tc.want {
			t.Errorf("%s: %q, want %q", tc.p.Kind, e.message, tc.want)
		}
	}
}

// An in-band error is one event with its event: line, not numbered.
func TestErrorEvent(t *testing.T) {
	ev := errorEvent(answer.Problem{Kind: answer.StreamIncomplete, Code: CodeStreamIncomplete, Message: "cut (reset)"})
	want := `{"type":"error","error":{"type":"api_error","message":"cut (reset)","details":{"error_code":"durallm_stream_incomplete"}}}`
	if ev.Name != "error" || ev.Numbered || string(ev.Data) != want {
		t.Fatalf("got %+v %s", ev, ev.Data)
	}
}

// No answer to a request whose action may have run is one that a common
// Messages client (the Anthropic SDKs, the AI SDK with @ai-sdk/anthropic,
// LangChain with @langchain/anthropic) sends again by default: without a
// key, a resend runs the model again. Only the refusals that started
// nothing invite one, to the clients that read x-should-retry.
func TestNoAnswerThatMayHaveRunIsRetriedByAMessagesClientsDefaultPolicy(t *testing.T) {
	answertest.NoResendOfWhatMayHaveRun(t, Surface{}, answertest.Clients...)
}

// The answers to a request that parsed carry x-should-retry: false, and
// name the members set aside.
func TestParsedRequestsHeaders(t *testing.T) {
	req, p := Surface{}.Parse([]byte(`{"model":"m","max_tokens":8,"service_tier":"auto","messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}]}`))
	if p != nil {
		t.Fatal(p)
	}
	if req.Header.Get("X-Should-Retry") != "false" || req.Header.Get(IgnoredHeader) != "cache_control, service_tier" {
		t.Fatalf("header %v", req.Header)
	}
	req, _ = Surface{}.Parse([]byte(`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`))
	if _, named := req.Header[IgnoredHeader]; named || !strings.EqualFold(req.Header.Get("X-Should-Retry"), "false") {
		t.Fatalf("header %v", req.Header)
	}
}
