package fleetlimit

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/durallm/durallm/recovery"
)

// Pushback is what a provider's 429 said about its limits, read from its
// headers by ReadPushback. A field that was not sent, or did not parse,
// is unknown (Known* false): only what the provider said is applied.
type Pushback struct {
	// RetryAfter is Retry-After (or retry-after-ms): no request should be
	// sent on the route before it has passed.
	RetryAfter      time.Duration
	KnownRetryAfter bool
	// RemainingRequests and RemainingTokens are what the provider says
	// is left in its buckets (x-ratelimit-remaining-requests and -tokens;
	// anthropic-ratelimit-requests-remaining and -tokens-remaining, or
	// the lower of its input and output tokens).
	RemainingRequests, RemainingTokens           float64
	KnownRemainingRequests, KnownRemainingTokens bool
}

// Known reports whether the pushback says anything that can be applied.
func (p Pushback) Known() bool {
	return p.KnownRetryAfter || p.KnownRemainingRequests || p.KnownRemainingTokens
}

// ReadPushback reads a 429's headers at now. Retry-After is read as the
// recovery engine reads it (recovery.ParseRetryAfter: retry-after-ms
// first, then delta-seconds or an HTTP-date). A remaining count must be
// a non-negative number; anything else is unknown, never an error, so a
// garbled header changes nothing.
func ReadPushback(h http.Header, now time.Time) Pushback {
	var p Pushback
	p.RetryAfter, p.KnownRetryAfter = recovery.ParseRetryAfter(h, now)
	p.RemainingRequests, p.KnownRemainingRequests = firstCount(h, "X-Ratelimit-Remaining-Requests", "Anthropic-Ratelimit-Requests-Remaining")
	p.RemainingTokens, p.KnownRemainingTokens = firstCount(h, "X-Ratelimit-Remaining-Tokens", "Anthropic-Ratelimit-Tokens-Remaining")
	if !p.KnownRemainingTokens {
		// Anthropic counts input and output tokens in buckets of their
		// own; the route's one bucket must not pass the fuller of them.
		in, inOK := count(h.Get("Anthropic-Ratelimit-Input-Tokens-Remaining"))
		out, outOK := count(h.Get("Anthropic-Ratelimit-Output-Tokens-Remaining"))
		switch {
		case inOK && outOK:
			p.RemainingTokens, p.KnownRemainingTokens = min(in, out), true
		case inOK:
			p.RemainingTokens, p.KnownRemainingTokens = in, true
		case outOK:
			p.RemainingTokens, p.KnownRemainingTokens = out, true
		}
	}
	return p
}

// firstCount reads the first of names that holds a count.
func firstCount(h http.Header, names ...string) (float64, bool) {
	for _, name := range names {
		if n, ok := count(h.Get(name)); ok {
			return n, true
		}
	}
	return 0, false
}

// count reads a non-negative count ("59", "149984", "0").
func count(v string) (float64, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	n, err := strconv.ParseFloat(v, 64)
	if err != nil || n < 0 || n != n || n > 1e15 {
		return 0, false
	}
	return n, true
}
