package fleetlimit

import (
	"net/http"
	"testing"
	"time"
)

func TestReadPushback(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		name    string
		headers map[string]string
		want    Pushback
	}{
		{"nothing", nil, Pushback{}},
		{"OpenAI's 429", map[string]string{
			"Retry-After": "2", "retry-after-ms": "1500",
			"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1s",
			"x-ratelimit-limit-tokens": "150000", "x-ratelimit-remaining-tokens": "149984", "x-ratelimit-reset-tokens": "6m0s",
		}, Pushback{RetryAfter: 1500 * time.Millisecond, KnownRetryAfter: true, KnownRemainingRequests: true, RemainingTokens: 149984, KnownRemainingTokens: true}},
		{"Anthropic's 429", map[string]string{
			"retry-after": "12", "anthropic-ratelimit-requests-remaining": "3",
			"anthropic-ratelimit-tokens-remaining": "1200", "anthropic-ratelimit-input-tokens-remaining": "9000",
		}, Pushback{RetryAfter: 12 * time.Second, KnownRetryAfter: true, RemainingRequests: 3, KnownRemainingRequests: true, RemainingTokens: 1200, KnownRemainingTokens: true}},
		{"Anthropic's input and output buckets: the lower", map[string]string{
			"anthropic-ratelimit-input-tokens-remaining": "9000", "anthropic-ratelimit-output-tokens-remaining": "700",
		}, Pushback{RemainingTokens: 700, KnownRemainingTokens: true}},
		{"Anthropic's output bucket alone", map[string]string{"anthropic-ratelimit-output-tokens-remaining": "50"},
			Pushback{RemainingTokens: 50, KnownRemainingTokens: true}},
		{"an HTTP-date Retry-After", map[string]string{"Retry-After": now.Add(90 * time.Second).Format(http.TimeFormat)},
			Pushback{RetryAfter: 90 * time.Second, KnownRetryAfter: true}},
		{"garbage is unknown, never an error", map[string]string{
			"Retry-After": "soon", "x-ratelimit-remaining-requests": "-3", "x-ratelimit-remaining-tokens": "NaN",
			"anthropic-ratelimit-output-tokens-remaining": "Inf",
		}, Pushback{}},
		{"a fractional count", map[string]string{"x-ratelimit-remaining-tokens": " 12.5 "}, Pushback{RemainingTokens: 12.5, KnownRemainingTokens: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range c.headers {
				h.Set(k, v)
			}
			got := ReadPushback(h, now)
			if got != c.want {
				t.Fatalf("ReadPushback = %+v, want %+v", got, c.want)
			}
			if got.Known() != (c.want != Pushback{}) {
				t.Fatalf("Known() = %v", got.Known())
			}
		})
	}
}
