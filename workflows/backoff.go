package workflows

import "time"

// Backoff is exponential backoff with full jitter and a cap, raised to the
// provider's Retry-After and never past a deadline. The zero value uses the
// defaults documented on each field. It is a pure value: Delay takes its
// randomness as an argument, so workflow code can pass a deterministic one.
type Backoff struct {
	// Initial is the ceiling of the first wait. Zero means 500ms.
	Initial time.Duration `json:"initial,omitempty"`
	// Max caps the ceiling as it doubles. Zero means 30s.
	Max time.Duration `json:"max,omitempty"`
}

const (
	defaultBackoffInitial = 500 * time.Millisecond
	defaultBackoffMax     = 30 * time.Second
)

// Delay returns how long to wait before the next attempt.
//
// retry counts the waits so far plus one (1 for the first retry). jitter is
// a uniform random number in [0, 1); values outside are clamped. retryAfter
// is the provider's hint (zero when none). remaining is the time left until
// the overall deadline.
//
// The wait is a uniformly random fraction (full jitter) of
// min(Max, Initial·2^(retry-1)), raised to retryAfter. ok is false when
// that wait would reach the deadline: the caller must not sleep past it and
// should fall back or stop instead; d is then the time remaining.
func (b Backoff) Delay(retry int, jitter float64, retryAfter, remaining time.Duration) (d time.Duration, ok bool) {
	initial, ceiling := b.Initial, b.Max
	if initial <= 0 {
		initial = defaultBackoffInitial
	}
	if ceiling <= 0 {
		ceiling = defaultBackoffMax
	}
	if ceiling < initial {
		ceiling = initial
	}
	window := initial
	for i := 1; i < retry && window < ceiling; i++ {
		window *= 2 // stops at the ceiling, so it never overflows
	}
	if window > ceiling {
		window = ceiling
	}
	switch {
	case jitter < 0 || jitter != jitter: // NaN
		jitter = 0
	case jitter >= 1:
		jitter = 0.999999
	}
	d = time.Duration(jitter * float64(window))
	if retryAfter > d {
		d = retryAfter
	}
	if remaining <= 0 || d >= remaining {
		if remaining < 0 {
			remaining = 0
		}
		return remaining, false
	}
	return d, true
}
