package recovery

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// MaxRetryAfter bounds a provider's pushback hint. A larger value is
// clamped: it outlives any sensible deadline either way, and the clamp keeps
// arithmetic on it from overflowing.
const MaxRetryAfter = 24 * time.Hour

// ParseRetryAfter reads the provider's pushback from response headers:
// `retry-after-ms` (milliseconds, possibly fractional, as OpenAI sends it)
// first, then `Retry-After` as delta-seconds or an HTTP-date relative to now.
//
// ok is false when neither header holds a usable value. Garbage, negative,
// NaN or infinite values mean "no hint", never an error or a panic, in the
// spirit of grpc-go's pushback parsing: what cannot be read strictly is not
// trusted. A date in the past means "now" (0, true).
func ParseRetryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	// Canonical spelling, so Get does not allocate to canonicalize it.
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 && !math.IsInf(ms, 0) && !math.IsNaN(ms) {
			return clampRetryAfter(ms * float64(time.Millisecond)), true
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if isDigits(v) {
		secs, err := strconv.ParseFloat(v, 64) // digits only, so never negative; float avoids overflow
		if err != nil {
			return 0, false
		}
		return clampRetryAfter(secs * float64(time.Second)), true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	if !t.After(now) {
		return 0, true
	}
	return clampRetryAfter(float64(t.Sub(now))), true
}

func clampRetryAfter(ns float64) time.Duration {
	if ns >= float64(MaxRetryAfter) {
		return MaxRetryAfter
	}
	return time.Duration(ns)
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
