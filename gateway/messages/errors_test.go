package messages

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// Each kind's answer: status, Anthropic's type, durallm's error code and
// whether the SDKs may send it again.
func TestErrorFor(t *testing.T) {
	cases := []struct {
		p      Problem
		status int
		typ    string
		code   string
		retry  bool
	}{
		{Problem{Kind: KindInvalidRequest, Param: "messages.0.role", Message: "must be user"}, 400, "invalid_request_error", "", false},
		{Problem{Kind: KindUnauthenticated}, 401, "authentication_error", "", false},
		{Problem{Kind: KindForbidden}, 403, "permission_error", "", false},
		{Problem{Kind: KindNotFound}, 404, "not_found_error", "", false},
		{Problem{Kind: KindTooLarge}, 413, "request_too_large", "", false},
		{Problem{Kind: KindKeyReused}, 422, "invalid_request_error", CodeKeyReused, false},
		{Problem{Kind: KindCallerLimit, RetryAfter: time.Second}, 429, "rate_limit_error", CodeCallerLimit, true},
		{Problem{Kind: KindUnavailable, RetryAfter: time.Second}, 529, "overloaded_error", CodeUnavailable, true},
		{Problem{Kind: KindNotImplemented}, 501, "api_error", CodeNotImplemented, false},
		{Problem{Kind: KindRejected, Status: 400, Reason: "provider_rejected", ProviderType: "invalid_request_error", Message: "messages: bad"}, 400, "invalid_request_error", "provider_rejected", false},
		{Problem{Kind: KindRejected, Status: 404, Reason: "provider_rejected", ProviderType: "model_not_found"}, 404, "not_found_error", "provider_rejected", false},
		{Problem{Kind: KindRejected, Status: 413, Reason: "provider_rejected"}, 413, "request_too_large", "provider_rejected", false},
		{Problem{Kind: KindRejected, Status: 422, Reason: "provider_rejected"}, 422, "invalid_request_error", "provider_rejected", false},
		{Problem{Kind: KindRejected, Status: 418, Reason: "provider_rejected", ProviderType: "teapot"}, 400, "invalid_request_error", "provider_rejected", false},
		{Problem{Kind: KindContentFiltered}, 400, "invalid_request_error", CodeContentFilter, false},
		{Problem{Kind: KindUpstreamAuth, Reason: "401"}, 502, "api_error", CodeUpstreamAuth, false},
		{Problem{Kind: KindFailed, Reason: "budget_exhausted", RetryAfter: 3 * time.Second}, 502, "api_error", CodeFailed, false},
		{Problem{Kind: KindAwaitingVerdict, ActionID: "act-1", Attempt: 2}, 409, "conflict_error", CodeAwaitingReconciliation, false},
		{Problem{Kind: KindMaybeStarted, Reason: "still_running", ActionID: "act-1"}, 409, "conflict_error", CodeMaybeStarted, false},
		{Problem{Kind: KindIndeterminate, Reason: "reconcile_timeout"}, 409, "conflict_error", CodeIndeterminate, false},
		{Problem{Kind: KindCanceled, Reason: "user_stop"}, 409, "conflict_error", CodeCanceled, false},
		{Problem{Kind: KindInternal}, 500, "api_error", "", false},
	}
	for _, tc := range cases {
		t.Run(string(tc.p.Kind), func(t *testing.T) {
			e := ErrorFor(tc.p)
			if e.Status != tc.status || e.Type != tc.typ || e.Code != tc.code || e.Retry != tc.retry || e.Message == "" {
				t.Fatalf("%+v", e)
			}
			w := httptest.NewRecorder()
			e.Write(w)
			if w.Code != tc.status || w.Header().Get("X-Should-Retry") != map[bool]string{true: "true", false: "false"}[tc.retry] ||
				w.Header().Get("Content-Type") != "application/json" {
				t.Fatalf("answer %d %v", w.Code, w.Header())
			}
			if tc.p.RetryAfter > 0 && w.Header().Get("Retry-After") == "" {
				t.Fatal("no Retry-After")
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
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body.Type != "error" || body.Error.Type != tc.typ || body.Error.Message != e.Message {
				t.Fatalf("body %s", w.Body)
			}
			if (body.Error.Details == nil) != (tc.code == "") || (body.Error.Details != nil && body.Error.Details.ErrorCode != tc.code) {
				t.Fatalf("details in %s", w.Body)
			}
		})
	}
}

// The words of each message that a caller acts on.
func TestErrorMessages(t *testing.T) {
	for _, tc := range []struct {
		p    Problem
		want []string
	}{
		{Problem{Kind: KindInvalidRequest, Param: "messages.0.role", Message: "must be user"}, []string{"messages.0.role: must be user"}},
		{Problem{Kind: KindAwaitingVerdict, ActionID: "act-9", Attempt: 2}, []string{"attempt 2 of action act-9", "/v1/actions/act-9/reconcile", "--attempt 2"}},
		{Problem{Kind: KindIncomplete, Reason: "idle_timeout"}, []string{"(idle_timeout)", "no second answer"}},
		{Problem{Kind: KindRejected, Status: 400, Message: "prompt is too long"}, []string{"prompt is too long"}},
		{Problem{Kind: KindCanceled, Reason: "user_stop"}, []string{"canceled (user_stop)"}},
	} {
		e := ErrorFor(tc.p)
		for _, w := range tc.want {
			if !strings.Contains(e.Message, w) {
				t.Errorf("%s: %q lacks %q", tc.p.Kind, e.Message, w)
			}
		}
	}
}

// An in-band error is one event with its event: line.
func TestErrorEvent(t *testing.T) {
	got := string(ErrorFor(Problem{Kind: KindIncomplete, Reason: "reset"}).Event())
	want := "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"the answer was cut after it started (reset): what arrived is all there is, and no second answer follows\",\"details\":{\"error_code\":\"durallm_stream_incomplete\"}}}\n\n"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}
