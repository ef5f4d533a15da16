package gateway

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/durallm/durallm/internal/syncbuf"
)

// A tokens file whose entry holds the SHA-256 of the empty token (what
// `printf %s "$TOKEN" | sha256sum` gives when the variable is unset) is
// refused: it would let in every request whose token reads as empty.
func TestATokensFileRefusesTheDigestOfTheEmptyToken(t *testing.T) {
	_, err := ParseTokens([]byte("tokens:\n  - id: a\n    sha256: " + hashOf("") + "\n"))
	if err == nil || !strings.Contains(err.Error(), "empty token") {
		t.Fatalf("error %v, want one naming the empty token", err)
	}
}

// A bearer token is read as RFC 9110 says: the scheme, one or more
// spaces, the token, nothing else; a token that is empty or holds
// anything but visible ASCII (a no-break space that a lax trim would
// remove) is no token.
func TestABearerTokenIsReadStrictly(t *testing.T) {
	// NewTokens takes its callers as given: here even one whose token is
	// empty, which must still never match.
	g, err := New(Options{Client: unreachableClient(t), Models: ModelsFromRoutes([]string{"demo"}), Secret: bytes.Repeat([]byte("s"), 32),
		Tokens: NewTokens([]Caller{{ID: "a", Hash: sumOf("tok-a")}, {ID: "empty", Hash: sumOf("")}}), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		header string
		ok     bool
	}{
		{"Bearer tok-a", true},
		{"bearer tok-a", true},
		{"Bearer   tok-a", true},
		{"Bearer tok-a ", true},
		{"Bearer\u00a0tok-a", false},
		{"Bearer \u00a0tok-a", false},
		{"Bearer tok-a\u00a0", false},
		{"Bearer ", false},
		{"Bearer \u00a0", false},
		{"Bearer", false},
		{"Basic tok-a", false},
		{"tok-a", false},
	} {
		req := httptest.NewRequest(http.MethodGet, "/v1/models", nil)
		req.Header.Set("Authorization", tc.header)
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		if got := rec.Code == http.StatusOK; got != tc.ok {
			t.Errorf("Authorization %q: status %d, want ok %v", tc.header, rec.Code, tc.ok)
		}
	}
}

// A gateway without tokens answers only what a local program sends: a
// loopback Host (a DNS-rebinding page names its own), no Origin (a
// browser names the page's) and JSON bodies (a cross-site form or
// text/plain POST is not).
func TestAGatewayWithoutTokensRefusesWebPages(t *testing.T) {
	g, err := New(Options{Client: unreachableClient(t), Models: ModelsFromRoutes([]string{"demo"}), Secret: bytes.Repeat([]byte("s"), 32),
		Logger: slog.New(slog.DiscardHandler), StartTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"demo","messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name, method, path, host, origin, ctype, body string
		status                                        int
	}{
		{"a local program", http.MethodGet, "/v1/models", "127.0.0.1:9093", "", "", "", 200},
		{"localhost", http.MethodGet, "/v1/models", "localhost:9093", "", "", "", 200},
		{"IPv6 loopback", http.MethodGet, "/v1/models", "[::1]:9093", "", "", "", 200},
		{"a rebound name", http.MethodGet, "/v1/actions?state=completed", "evil.example:9093", "", "", "", 403},
		{"a page's fetch", http.MethodGet, "/v1/models", "127.0.0.1:9093", "https://evil.example", "", "", 403},
		{"a cross-site text/plain POST", http.MethodPost, "/v1/chat/completions", "127.0.0.1:9093", "", "text/plain", body, 415},
		{"a form POST", http.MethodPost, "/v1/chat/completions", "127.0.0.1:9093", "", "application/x-www-form-urlencoded", body, 415},
		// 0: the start's own answer (reachedTheStart).
		{"a JSON POST reaches the start", http.MethodPost, "/v1/chat/completions", "127.0.0.1:9093", "", "application/json; charset=utf-8", body, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, "http://"+tc.host+tc.path, strings.NewReader(tc.body))
			req.Host = tc.host
			if tc.origin != "" {
				req.Header.Set("Origin", tc.origin)
			}
			if tc.ctype != "" {
				req.Header.Set("Content-Type", tc.ctype)
			}
			rec := httptest.NewRecorder()
			g.ServeHTTP(rec, req)
			if tc.status == 0 {
				if !reachedTheStart(rec) {
					t.Fatalf("status %d, want the start's answer: %s", rec.Code, rec.Body)
				}
				return
			}
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
		})
	}
}

// The {id} of a path is caller input: it is logged only once it names an
// action the caller may see, never before authentication.
func TestTheIDOfAPathIsNotLoggedBeforeAuthentication(t *testing.T) {
	var logs syncbuf.Buffer
	g, err := New(Options{Client: unreachableClient(t), Models: ModelsFromRoutes([]string{"demo"}), Secret: bytes.Repeat([]byte("s"), 32),
		Tokens: NewTokens([]Caller{{ID: "a", Hash: sumOf("tok-a")}}), Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	const canary = "PATH-CANARY-4004"
	for _, path := range []string{"/v1/actions/" + canary, "/v1/actions/" + canary + "/cancel", "/v1/chat/completions/" + canary} {
		method := http.MethodGet
		if strings.HasSuffix(path, "/cancel") {
			method = http.MethodPost
		}
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		if rec.Code != http.StatusUnauthorized {
			t.Fatalf("%s: %d", path, rec.Code)
		}
	}
	if strings.Contains(logs.String(), canary) {
		t.Fatalf("the logs hold the path's id:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), fmt.Sprintf("path=%s", "/v1/actions/{id}")) {
		t.Fatalf("the request lines were not logged:\n%s", logs.String())
	}
}

// A caller's metadata goes upstream as it is, beside durallm's own keys
// (durallm_attempt_id, durallm_action_id, by which a provider's record is
// searched): a key of durallm's prefix is refused before anything starts.
func TestACallersMetadataMayNotUseDurallmsKeys(t *testing.T) {
	g, err := New(Options{Client: unreachableClient(t), Models: ModelsFromRoutes([]string{"demo"}), Secret: bytes.Repeat([]byte("s"), 32),
		Tokens: NewTokens([]Caller{{ID: "a", Hash: sumOf("tok-a")}}), Logger: slog.New(slog.DiscardHandler), StartTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		metadata string
		status   int
	}{
		{`{"durallm_action_id":"gw-someone-elses"}`, 400},
		{`{"durallm_attempt_id":"x","team":"a"}`, 400},
		{`{"durallm_anything":"x"}`, 400},
		{`"not an object"`, 400},
		{`{"team":"a","durallm":"x"}`, 0},
		{`null`, 0},
	} {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
			strings.NewReader(`{"model":"demo","metadata":`+tc.metadata+`,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer tok-a")
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		if tc.status == 0 {
			if !reachedTheStart(rec) {
				t.Errorf("metadata %s: status %d, want the start's answer: %s", tc.metadata, rec.Code, rec.Body)
			}
			continue
		}
		if rec.Code != tc.status {
			t.Errorf("metadata %s: status %d, want %d: %s", tc.metadata, rec.Code, tc.status, rec.Body)
		}
		if tc.status == 400 && !strings.Contains(rec.Body.String(), `"param":"metadata"`) {
			t.Errorf("metadata %s: %s", tc.metadata, rec.Body)
		}
	}
}

// reachedTheStart says a request got past every check before the start
// to the start itself, which these tests' unreachable Temporal answers:
// 503 when every try was refused, 403 maybe_started when one ran out of
// time on a busy machine; either way with the code temporal_unreachable.
func reachedTheStart(rec *httptest.ResponseRecorder) bool {
	return strings.Contains(rec.Body.String(), `"code":"temporal_unreachable"`)
}
