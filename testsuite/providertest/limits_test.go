package providertest

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// post sends body to base's chat completions over the protocol base
// speaks (HTTP/2 over TLS, or HTTP/1.1 in cleartext).
func post(t *testing.T, p *Provider, base, body string) (*http.Response, []byte) {
	t.Helper()
	resp, b, err := postWith(transportFor(t, p, base), testCtx(t), base, body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func transportFor(t *testing.T, p *Provider, base string) http.RoundTripper {
	if base == p.HTTP1URL() {
		return h1Client(p).Transport
	}
	return tlsTransport(t, p)
}

func postWith(tr http.RoundTripper, ctx context.Context, base, body string) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	return roundTrip(tr, req)
}

type limitError struct {
	Error struct {
		Type, Code, Message string
	}
}

func TestRequestsPerMinuteAnswers429WithOpenAIsHeaders(t *testing.T) {
	for _, proto := range []string{ProtoHTTP2, ProtoHTTP11} {
		t.Run(proto, func(t *testing.T) {
			p := newTestProvider(t, WithRequestsPerMinute(2))
			base := p.URL()
			if proto == ProtoHTTP11 {
				base = p.HTTP1URL()
			}
			p.Push(Answer("one"), Answer("two"), Answer("three"))
			for i := range 2 {
				if resp, b := post(t, p, base, `{"model":"m"}`); resp.StatusCode != 200 {
					t.Fatalf("request %d: %d %s", i+1, resp.StatusCode, b)
				}
			}
			resp, b := post(t, p, base, `{"model":"m"}`)
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("third request: %d %s, want 429", resp.StatusCode, b)
			}
			h := resp.Header
			if s, err := strconv.Atoi(h.Get("Retry-After")); err != nil || s < 1 || s > 60 {
				t.Fatalf("Retry-After %q: want whole seconds until a request fits", h.Get("Retry-After"))
			}
			if ms, err := strconv.Atoi(h.Get("Retry-After-Ms")); err != nil || ms < 1 || ms > 60_000 {
				t.Fatalf("retry-after-ms %q", h.Get("Retry-After-Ms"))
			}
			if h.Get("X-Ratelimit-Limit-Requests") != "2" || h.Get("X-Ratelimit-Remaining-Requests") != "0" {
				t.Fatalf("x-ratelimit-*-requests: %v", h)
			}
			if d, err := time.ParseDuration(h.Get("X-Ratelimit-Reset-Requests")); err != nil || d <= 0 || d > time.Minute {
				t.Fatalf("x-ratelimit-reset-requests %q", h.Get("X-Ratelimit-Reset-Requests"))
			}
			var e limitError
			if json.Unmarshal(b, &e) != nil || e.Error.Type != "requests" || e.Error.Code != "rate_limit_exceeded" {
				t.Fatalf("body %s", b)
			}
			if got := p.RateLimited(); got != (RateLimitCounts{Requests: 1}) {
				t.Fatalf("counted %+v", got)
			}
			recs := p.Received()
			if len(recs) != 3 || recs[2].Behavior != "RateLimited(requests)" || len(p.Processed()) != 2 {
				t.Fatalf("received %+v, processed %d: a refused request never executes", recs, len(p.Processed()))
			}
		})
	}
}

// A refused request takes nothing from the queue: the behaviour queued
// for it goes to the next request that is admitted.
func TestARefusedRequestLeavesTheQueueAlone(t *testing.T) {
	p := newTestProvider(t, WithTokensPerMinute(400))
	p.Push(Answer("first"), Answer("second"))
	if resp, b := post(t, p, p.URL(), `{"model":"m","max_tokens":5000}`); resp.StatusCode != 429 || !strings.Contains(string(b), "Request too large") {
		t.Fatalf("a request larger than the limit: %d %s", resp.StatusCode, b)
	}
	if resp, b := post(t, p, p.URL(), `{"model":"m","max_tokens":10}`); resp.StatusCode != 200 || !strings.Contains(string(b), "first") {
		t.Fatalf("the next request: %d %s, want the first queued answer", resp.StatusCode, b)
	}
}

func TestTokensPerMinuteCountsThePromptAndMaxTokens(t *testing.T) {
	p := newTestProvider(t, WithTokensPerMinute(1000))
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":600}`
	cost := promptTokens([]byte(body)) + 600
	if resp, b := post(t, p, p.URL(), body); resp.StatusCode != 200 {
		t.Fatalf("first: %d %s", resp.StatusCode, b)
	}
	resp, b := post(t, p, p.URL(), body)
	if resp.StatusCode != 429 {
		t.Fatalf("second: %d %s, want 429 (%d of 1000 tokens taken)", resp.StatusCode, b, cost)
	}
	remaining, err := strconv.Atoi(resp.Header.Get("X-Ratelimit-Remaining-Tokens"))
	if err != nil || remaining >= cost || remaining < 1000-cost-1 {
		t.Fatalf("x-ratelimit-remaining-tokens %q after %d of 1000", resp.Header.Get("X-Ratelimit-Remaining-Tokens"), cost)
	}
	if resp.Header.Get("X-Ratelimit-Limit-Tokens") != "1000" || resp.Header.Get("X-Ratelimit-Limit-Requests") != "" {
		t.Fatalf("headers %v", resp.Header)
	}
	var e limitError
	if json.Unmarshal(b, &e) != nil || e.Error.Type != "tokens" {
		t.Fatalf("body %s", b)
	}
	if p.RateLimited() != (RateLimitCounts{Tokens: 1}) {
		t.Fatalf("counted %+v", p.RateLimited())
	}
}

// A request holds its place among those in progress until its behaviour
// ends; one more meanwhile is refused, and once it ends the place is
// free again.
func TestMaxConcurrentRequestsHoldsAPlaceUntilTheBehaviourEnds(t *testing.T) {
	for _, proto := range []string{ProtoHTTP2, ProtoHTTP11} {
		t.Run(proto, func(t *testing.T) {
			p := newTestProvider(t, WithMaxConcurrentRequests(1))
			base := p.URL()
			if proto == ProtoHTTP11 {
				base = p.HTTP1URL()
			}
			gate := make(chan struct{})
			p.Push(Answer("slow").WaitFor(gate), Answer("after"))
			first := make(chan int, 1)
			tr, ctx := transportFor(t, p, base), testCtx(t)
			go func() {
				resp, _, err := postWith(tr, ctx, base, `{"model":"m"}`)
				if err != nil {
					first <- 0
					return
				}
				first <- resp.StatusCode
			}()
			waitFor(t, "the first request to be in progress", func() bool { return len(p.Processed()) == 1 })
			if resp, b := post(t, p, base, `{"model":"m"}`); resp.StatusCode != 429 || p.RateLimited().Concurrency != 1 {
				t.Fatalf("a second request while the first runs: %d %s, counted %+v", resp.StatusCode, b, p.RateLimited())
			}
			if n := p.RequestsInProgress(); n != 1 {
				t.Fatalf("%d requests in progress, want the first", n)
			}
			close(gate)
			if code := <-first; code != 200 {
				t.Fatalf("the first request: %d", code)
			}
			waitFor(t, "the first request's place to be freed", func() bool { return p.RequestsInProgress() == 0 })
			if resp, b := post(t, p, base, `{"model":"m"}`); resp.StatusCode != 200 || !strings.Contains(string(b), "after") {
				t.Fatalf("a request after the first ended: %d %s", resp.StatusCode, b)
			}
		})
	}
}

func TestALimitBelowOneIsRefused(t *testing.T) {
	for _, opt := range []struct {
		name string
		o    Option
	}{{"WithRequestsPerMinute", WithRequestsPerMinute(0)}, {"WithTokensPerMinute", WithTokensPerMinute(-5)}, {"WithMaxConcurrentRequests", WithMaxConcurrentRequests(0)}} {
		p, err := NewProvider(opt.o)
		if err == nil {
			p.Close()
			t.Fatalf("%s accepted a limit below 1", opt.name)
		}
		if !strings.Contains(err.Error(), opt.name+": must be at least 1") {
			t.Fatalf("error %v does not name %s", err, opt.name)
		}
	}
}

func TestWithUsageReportsTheGivenUsage(t *testing.T) {
	p := newTestProvider(t)
	u := Usage{PromptTokens: 1200, CachedTokens: 1024, CompletionTokens: 7}
	p.Push(Answer("json answer").WithUsage(u), Answer("streamed answer").WithUsage(u))
	want := `"usage":{"prompt_tokens":1200,"completion_tokens":7,"total_tokens":1207,"prompt_tokens_details":{"cached_tokens":1024}}`
	if resp, b := post(t, p, p.URL(), `{"model":"m"}`); resp.StatusCode != 200 || !strings.Contains(string(b), want) {
		t.Fatalf("JSON: %d %s", resp.StatusCode, b)
	}
	if resp, b := post(t, p, p.HTTP1URL(), `{"model":"m","stream":true}`); resp.StatusCode != 200 || !strings.Contains(string(b), want) {
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
}
