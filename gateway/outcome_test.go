package gateway

import (
	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/gateway/chat"
	"github.com/durallm/durallm/gateway/openaiwire"

	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/workflows"
)

// errorOf decodes an answer's OpenAI error object.
func errorOf(t *testing.T, body []byte) map[string]any {
	t.Helper()
	var e struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil {
		t.Fatalf("not an OpenAI error body: %s (%v)", body, err)
	}
	return e.Error
}

func attemptWith(ev evidence.Evidence) []workflows.AttemptRecord {
	return []workflows.AttemptRecord{{N: 1, Route: "r", Evidence: ev}}
}

// Each row of the outcome table (docs/contract.md section 6.5): an ended
// action's answer to a non-streamed request, status, error type and code,
// x-should-retry and the other headers.
func TestOutcomeTable(t *testing.T) {
	text := &providers.Response{Text: "hello", FinishReason: "stop", Usage: providers.Usage{PromptTokens: 1, CompletionTokens: 1, TotalTokens: 2}}
	partial := &providers.Response{Text: "hel", Partial: true, Incomplete: "idle_timeout"}
	provErr := func(typ, code, msg string) *providers.Response {
		return &providers.Response{Error: &providers.APIError{Type: typ, Code: code, Message: msg, Param: "messages"}}
	}
	res := func(s workflows.State, outcome, reason string) workflows.ActionResult {
		return workflows.ActionResult{Status: workflows.Status{ActionRef: "gw-1", State: s, Outcome: outcome, Reason: reason}}
	}
	with := func(r workflows.ActionResult, f func(*workflows.ActionResult)) workflows.ActionResult {
		f(&r)
		return r
	}
	for _, tc := range []struct {
		name       string
		res        workflows.ActionResult
		status     int
		errType    string
		code       string
		retryAfter string
		incomplete string
		text       string
	}{
		{name: "completed", res: with(res(workflows.StateCompleted, "completed", "ok"), func(r *workflows.ActionResult) { r.Response = text }), status: 200, text: "hello"},
		{name: "reconciled", res: with(res(workflows.StateReconciled, "completed", "verdict"), func(r *workflows.ActionResult) { r.Response = text }), status: 200, text: "hello"},
		{name: "completed_partial", res: with(res(workflows.StateCompletedPartial, "committed_partial", "stream_failed_after_content"), func(r *workflows.ActionResult) { r.Response = partial }),
			status: 200, incomplete: "idle_timeout", text: "hel"},
		{name: "rejected 400, the provider's error object", res: with(res(workflows.StateRejected, "rejected", "http_400"), func(r *workflows.ActionResult) {
			r.Response, r.Attempts = provErr("invalid_request_error", "bad_thing", "the provider says no"), attemptWith(evidence.Evidence{Status: 400})
		}), status: 400, errType: "invalid_request_error", code: "bad_thing"},
		{name: "rejected 404", res: with(res(workflows.StateRejected, "rejected", "http_404"), func(r *workflows.ActionResult) { r.Attempts = attemptWith(evidence.Evidence{Status: 404}) }),
			status: 404, errType: openaiwire.TypeInvalidRequest, code: "http_404"},
		{name: "rejected 413", res: with(res(workflows.StateRejected, "rejected", "http_413"), func(r *workflows.ActionResult) { r.Attempts = attemptWith(evidence.Evidence{Status: 413}) }),
			status: 413, errType: openaiwire.TypeInvalidRequest, code: "http_413"},
		{name: "rejected 422", res: with(res(workflows.StateRejected, "rejected", "http_422"), func(r *workflows.ActionResult) { r.Attempts = attemptWith(evidence.Evidence{Status: 422}) }),
			status: 422, errType: openaiwire.TypeInvalidRequest, code: "http_422"},
		{name: "rejected other 4xx as 400", res: with(res(workflows.StateRejected, "rejected", "http_418"), func(r *workflows.ActionResult) { r.Attempts = attemptWith(evidence.Evidence{Status: 418}) }),
			status: 400, errType: openaiwire.TypeInvalidRequest, code: "http_418"},
		{name: "rejected before sending", res: res(workflows.StateRejected, "rejected", "invalid_request"), status: 400, errType: openaiwire.TypeInvalidRequest, code: "invalid_request"},
		{name: "content filter", res: with(res(workflows.StateRejected, "content_filtered", "content_filter"), func(r *workflows.ActionResult) {
			r.Response, r.Attempts = provErr("invalid_request_error", "content_policy_violation", "filtered"), attemptWith(evidence.Evidence{Status: 400})
		}), status: 400, errType: openaiwire.TypeInvalidRequest, code: openaiwire.CodeContentFilter},
		{name: "provider 401 is the route's key", res: with(res(workflows.StateRejected, "rejected", "http_401"), func(r *workflows.ActionResult) {
			r.Response, r.Attempts = provErr("invalid_request_error", "invalid_api_key", "Incorrect API key provided: sk-abc"), attemptWith(evidence.Evidence{Status: 401})
		}), status: 502, errType: openaiwire.TypeUpstreamAuth, code: "401"},
		{name: "provider 403", res: with(res(workflows.StateRejected, "rejected", "http_403"), func(r *workflows.ActionResult) { r.Attempts = attemptWith(evidence.Evidence{Status: 403}) }),
			status: 502, errType: openaiwire.TypeUpstreamAuth, code: "403"},
		{name: "failed", res: res(workflows.StateFailed, "upstream_error", "budget_exhausted"), status: 502, errType: openaiwire.TypeFailed, code: "budget_exhausted"},
		{name: "failed after throttling", res: with(res(workflows.StateFailed, "throttled", "budget_exhausted"), func(r *workflows.ActionResult) {
			r.Attempts = attemptWith(evidence.Evidence{Status: 429, RetryAfter: 2500 * time.Millisecond})
		}), status: 502, errType: openaiwire.TypeFailed, code: "budget_exhausted", retryAfter: "3"},
		{name: "awaiting_reconciliation", res: with(res(workflows.StateAwaitingReconciliation, "ambiguous", ""), func(r *workflows.ActionResult) { r.AwaitingAttempt = 1 }),
			status: 403, errType: openaiwire.TypeAwaiting, code: openaiwire.CodeAwaitingReconcilation},
		{name: "indeterminate", res: res(workflows.StateIndeterminate, "ambiguous", "reconcile_timeout"), status: 403, errType: openaiwire.TypeIndeterminate, code: "reconcile_timeout"},
		{name: "spend_exhausted: the action's budget, never a provider failure", res: res(workflows.StateSpendExhausted, "upstream_error", "token_budget_exhausted"),
			status: 429, errType: openaiwire.TypeInsufficientQuota, code: openaiwire.TypeInsufficientQuota},
		{name: "canceled while connected", res: with(res(workflows.StateCanceled, "canceled", "operator_stop"), func(r *workflows.ActionResult) { r.Origin = workflows.OriginOperatorStop }),
			status: 403, errType: openaiwire.TypeCanceled, code: "operator_stop"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &Gateway{log: slog.New(slog.DiscardHandler)}
			rec := httptest.NewRecorder()
			s := &session{who: answer.Identity{ID: "gw-1", Created: 1700000000, Model: "demo"}, surface: chat.Surface{}}
			g.answerJSON(rec, s, waitDone{res: tc.res})
			h := rec.Header()
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			if h.Get("X-Durallm-State") != string(tc.res.State) {
				t.Fatalf("x-durallm-state %q, want %q", h.Get("X-Durallm-State"), tc.res.State)
			}
			if h.Get("Retry-After") != tc.retryAfter {
				t.Fatalf("Retry-After %q, want %q", h.Get("Retry-After"), tc.retryAfter)
			}
			if rec.Code == 200 {
				if _, ok := h["X-Should-Retry"]; ok {
					t.Fatal("a 2xx carries x-should-retry (openai-go reads it even on a 200)")
				}
				if h.Get("X-Durallm-Incomplete") != tc.incomplete {
					t.Fatalf("x-durallm-incomplete %q, want %q", h.Get("X-Durallm-Incomplete"), tc.incomplete)
				}
				var c struct {
					ID      string `json:"id"`
					Object  string `json:"object"`
					Model   string `json:"model"`
					Choices []struct {
						Message      struct{ Content string } `json:"message"`
						FinishReason string                   `json:"finish_reason"`
					} `json:"choices"`
				}
				if err := json.Unmarshal(rec.Body.Bytes(), &c); err != nil || c.ID != "gw-1" || c.Object != "chat.completion" || c.Model != "demo" ||
					len(c.Choices) != 1 || c.Choices[0].Message.Content != tc.text {
					t.Fatalf("completion %s: %v", rec.Body, err)
				}
				if want := map[bool]string{true: "length", false: "stop"}[tc.incomplete != ""]; c.Choices[0].FinishReason != want {
					t.Fatalf("finish_reason %q, want %q", c.Choices[0].FinishReason, want)
				}
				return
			}
			if h.Get("X-Should-Retry") != "false" {
				t.Fatalf("x-should-retry %q, want false", h.Get("X-Should-Retry"))
			}
			e := errorOf(t, rec.Body.Bytes())
			if e["type"] != tc.errType || e["code"] != tc.code {
				t.Fatalf("type %v code %v, want %s %s", e["type"], e["code"], tc.errType, tc.code)
			}
			if tc.status == 502 && strings.Contains(rec.Body.String(), "sk-abc") {
				t.Fatal("the route's key problem passes the provider's message (which may quote the key) to the caller")
			}
		})
	}
}

// unreachableClient is a durallm client whose Temporal is not there.
func unreachableClient(t *testing.T) *durallm.Client {
	t.Helper()
	tc, err := client.NewLazyClient(client.Options{HostPort: "127.0.0.1:1", Logger: quietSDK{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tc.Close)
	return durallm.NewClient(tc, "")
}

// The refusals before any start: each row's status, type, param,
// x-should-retry (true only for 429 and 503) and Retry-After.
func TestRefusalsBeforeAnyStart(t *testing.T) {
	tokens := NewTokens([]Caller{
		{ID: "a", Hash: sumOf("tok-a"), MaxInFlight: 1},
		{ID: "limited", Hash: sumOf("tok-l"), Models: []string{"other"}},
	})
	g, err := New(Options{Client: unreachableClient(t), Models: ModelsFromRoutes([]string{"demo", "other"}), Secret: bytes.Repeat([]byte("s"), 32),
		Tokens: tokens, Logger: slog.New(slog.DiscardHandler), MaxBody: 1 << 10, StartTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	good := `{"model":"demo","messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name       string
		method     string
		path       string
		token      string
		body       string
		header     map[string]string
		hold       bool // the caller already has max_in_flight requests
		status     int
		errType    string
		code       string
		param      string
		retry      string
		retryAfter string
	}{
		{name: "no token", token: "", body: good, status: 401, errType: openaiwire.TypeInvalidRequest, code: openaiwire.CodeInvalidAPIKey},
		{name: "unknown token", token: "nope", body: good, status: 401, errType: openaiwire.TypeInvalidRequest, code: openaiwire.CodeInvalidAPIKey},
		{name: "body not JSON", token: "tok-a", body: `{`, status: 400, errType: openaiwire.TypeInvalidRequest, code: openaiwire.CodeInvalidValue},
		{name: "n of 3", token: "tok-a", body: `{"model":"demo","n":3,"messages":[{"role":"user","content":"hi"}]}`, status: 400, errType: openaiwire.TypeInvalidRequest, code: openaiwire.CodeInvalidValue, param: "n"},
		{name: "bad Idempotency-Key", token: "tok-a", body: good, header: map[string]string{"Idempotency-Key": "tab\tinside"}, status: 400, errType: openaiwire.TypeInvalidRequest, code: openaiwire.CodeInvalidValue, param: IdempotencyHeader},
		{name: "unknown model", token: "tok-a", body: `{"model":"gpt-9","messages":[{"role":"user","content":"hi"}]}`, status: 404, errType: openaiwire.TypeInvalidRequest, code: openaiwire.CodeModelNotFound, param: "model"},
		{name: "a model the caller may not use", token: "tok-l", body: good, status: 404, errType: openaiwire.TypeInvalidRequest, code: openaiwire.CodeModelNotFound, param: "model"},
		{name: "body over the bound", token: "tok-a", body: `{"model":"demo","messages":[{"role":"user","content":"` + strings.Repeat("x", 2<<10) + `"}]}`, status: 413, errType: openaiwire.TypeInvalidRequest, code: openaiwire.CodeRequestTooLarge},
		{name: "caller limit", token: "tok-a", body: good, hold: true, status: 429, errType: openaiwire.TypeRateLimit, code: openaiwire.CodeCallerLimit, retry: "true", retryAfter: "1"},
		{name: "Temporal unreachable", token: "tok-a", body: good, status: 503, errType: openaiwire.TypeUnavailable, code: openaiwire.CodeTemporalUnreachable, retry: "true", retryAfter: "1"},
		{name: "a chat body on the Responses API", token: "tok-a", path: "/v1/responses", body: good, status: 400, errType: openaiwire.TypeInvalidRequest, code: openaiwire.CodeInvalidValue, param: "messages"},
		{name: "wrong method", token: "tok-a", method: http.MethodGet, status: 405, errType: openaiwire.TypeInvalidRequest, code: openaiwire.CodeMethodNotAllowed},
		{name: "listing is for operators", token: "tok-a", method: http.MethodGet, path: "/v1/actions?state=failed", status: 403, errType: openaiwire.TypeInvalidRequest, code: "operator_only"},
		{name: "reconcile is for operators", token: "tok-a", path: "/v1/actions/gw-x/reconcile", body: `{}`, status: 404, errType: openaiwire.TypeInvalidRequest, code: openaiwire.CodeNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method, path := tc.method, tc.path
			if method == "" {
				method = http.MethodPost
			}
			if path == "" {
				path = "/v1/chat/completions"
			}
			req := httptest.NewRequest(method, path, strings.NewReader(tc.body))
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			for k, v := range tc.header {
				req.Header.Set(k, v)
			}
			if tc.hold {
				release, ok := g.acquire(Caller{ID: "a", MaxInFlight: 1})
				if !ok {
					t.Fatal("could not take the caller's place")
				}
				defer release()
			}
			rec := httptest.NewRecorder()
			g.ServeHTTP(rec, req)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			retry := tc.retry
			if retry == "" {
				retry = "false"
			}
			if got := rec.Header().Get("X-Should-Retry"); got != retry {
				t.Fatalf("x-should-retry %q, want %q", got, retry)
			}
			if got := rec.Header().Get("Retry-After"); got != tc.retryAfter {
				t.Fatalf("Retry-After %q, want %q", got, tc.retryAfter)
			}
			e := errorOf(t, rec.Body.Bytes())
			param, _ := e["param"].(string)
			if e["type"] != tc.errType || e["code"] != tc.code || param != tc.param {
				t.Fatalf("type %v code %v param %v, want %s %s %q", e["type"], e["code"], e["param"], tc.errType, tc.code, tc.param)
			}
			if strings.Contains(rec.Body.String(), "tab\tinside") || strings.Contains(rec.Body.String(), "tok-") {
				t.Fatalf("the answer quotes a key or token: %s", rec.Body)
			}
		})
	}
}

// quietSDK keeps the Temporal SDK's retries of the unreachable server out
// of the test's output.
type quietSDK struct{}

func (quietSDK) Debug(string, ...any) {}
func (quietSDK) Info(string, ...any)  {}
func (quietSDK) Warn(string, ...any)  {}
func (quietSDK) Error(string, ...any) {}
