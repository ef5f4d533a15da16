package providertest

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// A provider's own rate limits, so every test has a provider that bites:
// requests per minute, tokens per minute and requests in progress at
// once. A request over a limit is answered 429 before it executes, with
// the headers OpenAI sends (Retry-After, retry-after-ms and
// x-ratelimit-limit-, -remaining- and -reset-requests/-tokens), and
// counted ([Provider.RateLimited]).

// WithRequestsPerMinute limits the requests the provider executes to n
// per minute: a bucket of n requests, refilled continuously (n per
// minute), as OpenAI's limiter works. n must be at least 1. Default: no
// limit.
func WithRequestsPerMinute(n int) Option {
	return func(o *options) { o.rpm, o.rpmSet = n, true }
}

// WithTokensPerMinute limits the tokens the provider admits to n per
// minute, in a bucket like [WithRequestsPerMinute]'s. A request counts
// the prompt tokens its usage reports (a quarter of its body's bytes)
// plus its max_tokens or max_completion_tokens (the larger) times its
// n, as OpenAI counts a request against its limit before it runs; one
// that needs more than n tokens is never admitted. n must be at least 1.
// Default: no limit.
func WithTokensPerMinute(n int) Option {
	return func(o *options) { o.tpm, o.tpmSet = n, true }
}

// WithMaxConcurrentRequests limits the requests in progress at once, on
// every listener together, to n: from the moment a request is given its
// behaviour until the behaviour has ended (a held or stalled stream
// holds its place). n must be at least 1. Default: no limit.
func WithMaxConcurrentRequests(n int) Option {
	return func(o *options) { o.concurrent, o.concurrentSet = n, true }
}

// The limits a request may be refused by, as [Record.Behavior] names
// them: "RateLimited(requests)", "RateLimited(tokens)",
// "RateLimited(concurrency)".
const (
	LimitRequests    = "requests"
	LimitTokens      = "tokens"
	LimitConcurrency = "concurrency"
)

// RateLimitCounts are the 429s the provider's own limits answered, by
// limit.
type RateLimitCounts struct {
	Requests, Tokens, Concurrency int
}

// Total is every 429 the limits answered.
func (c RateLimitCounts) Total() int { return c.Requests + c.Tokens + c.Concurrency }

// RequestsInProgress returns how many requests have been given their
// behaviour and not finished it, what [WithMaxConcurrentRequests] limits.
// A client may have read a whole answer a moment before its request
// stops counting here: tests poll it to see a place freed.
func (p *Provider) RequestsInProgress() int {
	p.limits.mu.Lock()
	defer p.limits.mu.Unlock()
	return p.limits.inFlight
}

// RateLimited returns how many requests each of the provider's limits
// refused since it started. [Provider.Reset] does not clear it.
func (p *Provider) RateLimited() RateLimitCounts {
	p.limits.mu.Lock()
	defer p.limits.mu.Unlock()
	return p.limits.refused
}

// checkLimits refuses with an error naming the option when a limit is
// set below 1.
func (o options) checkLimits() error {
	var errs []error
	for _, l := range []struct {
		name string
		set  bool
		n    int
	}{{"WithRequestsPerMinute", o.rpmSet, o.rpm}, {"WithTokensPerMinute", o.tpmSet, o.tpm}, {"WithMaxConcurrentRequests", o.concurrentSet, o.concurrent}} {
		if l.set && l.n < 1 {
			errs = append(errs, fmt.Errorf("providertest: %s: must be at least 1 (leave it out for no limit)", l.name))
		}
	}
	return errors.Join(errs...)
}

// limiter holds the provider's limits and their state.
type limiter struct {
	mu               sync.Mutex
	requests, tokens *bucket // nil: no limit
	maxConcurrent    int     // 0: no limit
	inFlight         int
	refused          RateLimitCounts
	now              func() time.Time
}

func newLimiter(o options) *limiter {
	l := &limiter{now: time.Now}
	if o.rpmSet {
		l.requests = newBucket(o.rpm, l.now())
	}
	if o.tpmSet {
		l.tokens = newBucket(o.tpm, l.now())
	}
	if o.concurrentSet {
		l.maxConcurrent = o.concurrent
	}
	return l
}

// bucket is a token bucket holding a minute's worth, refilled
// continuously.
type bucket struct {
	limit float64
	level float64
	last  time.Time
}

func newBucket(perMinute int, now time.Time) *bucket {
	return &bucket{limit: float64(perMinute), level: float64(perMinute), last: now}
}

func (b *bucket) refill(now time.Time) {
	if d := now.Sub(b.last); d > 0 {
		b.level = math.Min(b.limit, b.level+b.limit*d.Minutes())
		b.last = now
	}
}

// wait is how long until n fits (zero when it fits now); for n above the
// limit, until the bucket is full.
func (b *bucket) wait(n float64) time.Duration {
	need := math.Min(n, b.limit) - b.level
	if need <= 0 {
		return 0
	}
	return time.Duration(need / b.limit * float64(time.Minute))
}

// reset is how long until the bucket is full again.
func (b *bucket) reset() time.Duration {
	return time.Duration((b.limit - b.level) / b.limit * float64(time.Minute))
}

// admit decides whether req may run now. When it may, it takes what the
// request costs and returns release, which gives back its place among
// those in progress. When it may not, it returns the 429 to answer.
func (l *limiter) admit(req Request) (refusal *Behavior, release func()) {
	cost := 0.0
	if l.tokens != nil {
		cost = float64(requestTokens(req.Body))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	for _, b := range []*bucket{l.requests, l.tokens} {
		if b != nil {
			b.refill(now)
		}
	}
	switch {
	case l.requests != nil && l.requests.wait(1) > 0:
		l.refused.Requests++
		return l.refusal(LimitRequests, l.requests.wait(1), fmt.Sprintf("Rate limit reached for requests per minute: Limit %d. Please try again in %s.", int(l.requests.limit), l.requests.wait(1).Round(time.Millisecond))), nil
	case l.tokens != nil && (l.tokens.wait(cost) > 0 || cost > l.tokens.limit):
		l.refused.Tokens++
		msg := fmt.Sprintf("Rate limit reached for tokens per minute: Limit %d, Requested %d. Please try again in %s.", int(l.tokens.limit), int(cost), l.tokens.wait(cost).Round(time.Millisecond))
		if cost > l.tokens.limit {
			msg = fmt.Sprintf("Request too large for tokens per minute: Limit %d, Requested %d.", int(l.tokens.limit), int(cost))
		}
		return l.refusal(LimitTokens, l.tokens.wait(cost), msg), nil
	case l.maxConcurrent > 0 && l.inFlight >= l.maxConcurrent:
		l.refused.Concurrency++
		return l.refusal(LimitConcurrency, time.Second, fmt.Sprintf("Too many concurrent requests: Limit %d.", l.maxConcurrent)), nil
	}
	if l.requests != nil {
		l.requests.level--
	}
	if l.tokens != nil {
		l.tokens.level -= cost
	}
	l.inFlight++
	var once sync.Once
	return nil, func() {
		once.Do(func() {
			l.mu.Lock()
			l.inFlight--
			l.mu.Unlock()
		})
	}
}

// refusal is the 429 for limit, with a wait before a retry can fit. l.mu
// is held.
func (l *limiter) refusal(limit string, wait time.Duration, message string) *Behavior {
	h := http.Header{}
	secs := max(1, int(math.Ceil(wait.Seconds())))
	h.Set("Retry-After", strconv.Itoa(secs))
	h.Set("Retry-After-Ms", strconv.FormatInt(max(1, wait.Milliseconds()), 10))
	for _, x := range []struct {
		name string
		b    *bucket
	}{{"requests", l.requests}, {"tokens", l.tokens}} {
		if x.b == nil {
			continue
		}
		h.Set("X-Ratelimit-Limit-"+x.name, strconv.Itoa(int(x.b.limit)))
		h.Set("X-Ratelimit-Remaining-"+x.name, strconv.Itoa(max(0, int(x.b.level))))
		h.Set("X-Ratelimit-Reset-"+x.name, x.b.reset().Round(time.Millisecond).String())
	}
	typ := "requests"
	if limit == LimitTokens {
		typ = "tokens"
	}
	b := Status(http.StatusTooManyRequests, h, errorBody(message, typ, "rate_limit_exceeded"))
	b.name = "RateLimited(" + limit + ")"
	return &b
}

// requestTokens is what a request counts against a tokens-per-minute
// limit: the prompt tokens its usage reports, plus its max_tokens or
// max_completion_tokens (the larger) for each of its n choices.
func requestTokens(body []byte) int {
	var in struct {
		MaxTokens           json.Number `json:"max_tokens"`
		MaxCompletionTokens json.Number `json:"max_completion_tokens"`
		N                   json.Number `json:"n"`
	}
	_ = json.Unmarshal(body, &in)
	out := 0
	for _, v := range []json.Number{in.MaxTokens, in.MaxCompletionTokens} {
		if n, err := v.Int64(); err == nil && int(n) > out {
			out = int(n)
		}
	}
	n := 1
	if v, err := in.N.Int64(); err == nil && v > 1 {
		n = int(v)
	}
	return promptTokens(body) + out*n
}
