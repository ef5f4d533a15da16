package exchange

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

type ctxKey struct{}

// The middleware an official client sends through: the request goes on
// once, with the exchange's context and URL when they are set (the
// client's own request left as it was); the client gets an empty body and
// the exchange the real response; with no response, the transport's error
// wins over what the client made of it.
func TestAnswerTaker(t *testing.T) {
	exchangeCtx := context.WithValue(context.Background(), ctxKey{}, "exchange")
	clientCtx, cancelClient := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "client"))
	endpoint, _ := url.Parse("http://127.0.0.1:1/anthropic/v1/messages?tenant=a")
	transportErr := errors.New("transport: connection reset")
	clientErr := errors.New("client: context canceled")
	cases := []struct {
		name      string
		taker     answerTaker
		answer    bool
		clientErr error
		wantCtx   string
		wantURL   string
		wantErr   error
	}{
		{"as the client built it", answerTaker{}, true, nil, "client", "http://127.0.0.1:9/v1/messages", nil},
		{"the exchange's context", answerTaker{ctx: exchangeCtx}, true, nil, "exchange", "http://127.0.0.1:9/v1/messages", nil},
		{"the route's URL", answerTaker{url: endpoint}, true, nil, "client", endpoint.String(), nil},
		{"both", answerTaker{ctx: exchangeCtx, url: endpoint}, true, nil, "exchange", endpoint.String(), nil},
		{"an error status the client turned into an error", answerTaker{}, true, errors.New("client: 404"), "client", "http://127.0.0.1:9/v1/messages", nil},
		{"no answer: the transport's error", answerTaker{}, false, clientErr, "client", "http://127.0.0.1:9/v1/messages", transportErr},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(clientCtx, http.MethodPost, "http://127.0.0.1:9/v1/messages", strings.NewReader("{}"))
			req.Host = "127.0.0.1:9"
			var sent []*http.Request
			next := func(r *http.Request) (*http.Response, error) {
				sent = append(sent, r)
				if !tc.answer {
					return nil, transportErr
				}
				return &http.Response{StatusCode: 404, Body: io.NopCloser(strings.NewReader("real body"))}, nil
			}
			ta := tc.taker
			given, _ := ta.take(req, next)
			if len(sent) != 1 || sent[0].Context().Value(ctxKey{}) != tc.wantCtx || sent[0].URL.String() != tc.wantURL {
				t.Fatalf("sent %d, context %v, URL %s", len(sent), sent[0].Context().Value(ctxKey{}), sent[0].URL)
			}
			if req.URL.String() != "http://127.0.0.1:9/v1/messages" || req.Context() != clientCtx {
				t.Fatal("the client's own request was changed")
			}
			if tc.taker.url != nil && (sent[0].Host != "" || sent[0].URL == endpoint) {
				t.Fatalf("host %q, URL shared with the taker: %v", sent[0].Host, sent[0].URL == endpoint)
			}
			resp, err := ta.outcome(tc.clientErr)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if !tc.answer {
				return
			}
			if b, _ := io.ReadAll(given.Body); len(b) != 0 {
				t.Fatalf("the client was given %q", b)
			}
			if b, _ := io.ReadAll(resp.Body); string(b) != "real body" || resp.StatusCode != 404 {
				t.Fatalf("the exchange got %d %q", resp.StatusCode, b)
			}
		})
	}
	cancelClient()
	// A client that reports no error and no response is still an error.
	if _, err := (&answerTaker{}).outcome(nil); err == nil {
		t.Fatal("no response and no error came back as success")
	}
}
