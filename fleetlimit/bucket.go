package fleetlimit

import (
	"math"
	"time"
)

// Limits are one route's limits as the store applies them. A zero field
// sets no limit of its kind.
type Limits struct {
	RequestsPerMinute float64
	TokensPerMinute   float64
	MaxConcurrent     int
}

// The limits a take may wait for, or be refused by (Taken.Limit).
const (
	LimitRequests    = "requests"
	LimitTokens      = "tokens"
	LimitConcurrency = "concurrency"
	// LimitPushback is a provider's Retry-After, held for the fleet.
	LimitPushback = "pushback"
)

// Ask is what a take asks of a route's buckets.
type Ask struct {
	// Requests and Tokens are what the attempt needs: taken, with the
	// wait until they fit, unless that wait is longer than MaxWait.
	Requests, Tokens float64
	// ExtraRequests and ExtraTokens are asked on top, for the limiter
	// to keep on hand: granted only out of what is free now, after
	// Requests and Tokens, and never while anyone waits.
	ExtraRequests, ExtraTokens float64
	// Slot asks for a place among the requests in flight. When there is
	// none, nothing is taken (Taken.Slot false).
	Slot bool
	// MaxWait is the longest wait the caller accepts.
	MaxWait time.Duration
}

// Taken is what a take got.
type Taken struct {
	// Wait is how long the caller must wait before sending: zero when
	// everything it asked for was free.
	Wait time.Duration
	// Limit is the limit that made it wait (or refused it): LimitRequests,
	// LimitTokens, LimitConcurrency or LimitPushback; empty when nothing
	// did.
	Limit string
	// Refused reports that nothing was taken: the wait would pass MaxWait
	// (Wait says how long it would be), or no slot was free (Limit is
	// LimitConcurrency).
	Refused bool
	// ExtraRequests and ExtraTokens are the extras granted.
	ExtraRequests, ExtraTokens float64
	// Slot reports that a place among the requests in flight was taken.
	Slot bool
	// RequestsWait and TokensWait are the waits for each bucket (Wait is
	// the longest of them and the provider's hold), and Mark what had
	// been given back when the take was made: with a later Mark, a waiter
	// finds its time moved by what was given back since (Moved).
	RequestsWait, TokensWait time.Duration
	Mark                     Mark
}

// Mark is how much room has been given back to a route's buckets since
// they were made (the room attempts did not use, less what they used
// beyond what they took, less what a provider's pushback took away), and
// the provider's hold. Room given back while a taker waits is owed to it
// and to everyone before it in line: its time comes that much sooner.
type Mark struct {
	GivenRequests, GivenTokens float64
	BlockedUntil               time.Time
}

// Moved is when a take made at `at` may be sent, now that m has been
// given back (m later than t.Mark): each bucket's wait less what was
// given back to it since, at its rate, and never before the provider's
// hold.
func (t Taken) Moved(l Limits, at time.Time, m Mark) time.Time {
	when := at
	for _, b := range []struct {
		wait        time.Duration
		given, rate float64
	}{
		{t.RequestsWait, m.GivenRequests - t.Mark.GivenRequests, l.RequestsPerMinute / 60},
		{t.TokensWait, m.GivenTokens - t.Mark.GivenTokens, l.TokensPerMinute / 60},
	} {
		if b.rate <= 0 {
			continue
		}
		w := b.wait - time.Duration(b.given/b.rate*float64(time.Second))
		if w > 0 && at.Add(w).After(when) {
			when = at.Add(w)
		}
	}
	if m.BlockedUntil.After(when) {
		when = m.BlockedUntil
	}
	return when
}

// state is one route's buckets: the one model of the arithmetic, which
// Memory runs in Go and Postgres in SQL (fleet_take and its peers in
// internal/pgdb), and which storeSuite holds both to.
type state struct {
	// Requests and Tokens are the buckets' levels at Refilled; below zero
	// while takers wait for what they were granted.
	Requests, Tokens float64
	Refilled         time.Time
	// Held is how many requests are in flight.
	Held int
	// BlockedUntil is the end of the last Retry-After a provider sent.
	BlockedUntil time.Time
	// GivenRequests and GivenTokens count the room given back (Mark).
	GivenRequests, GivenTokens float64
}

// mark is s's Mark.
func (s *state) mark() Mark {
	return Mark{GivenRequests: s.GivenRequests, GivenTokens: s.GivenTokens, BlockedUntil: s.BlockedUntil}
}

// newState is a route's buckets before any take: full.
func newState(l Limits, now time.Time) state {
	return state{Requests: l.RequestsPerMinute, Tokens: l.TokensPerMinute, Refilled: now}
}

// refill brings the levels to now: a minute's worth per minute, never
// above a minute's worth.
func (s *state) refill(l Limits, now time.Time) {
	if e := now.Sub(s.Refilled).Seconds(); e > 0 {
		s.Requests = math.Min(l.RequestsPerMinute, s.Requests+l.RequestsPerMinute/60*e)
		s.Tokens = math.Min(l.TokensPerMinute, s.Tokens+l.TokensPerMinute/60*e)
		s.Refilled = now
	}
}

// waitFor is how long until need fits in a bucket at level, with a limit
// of perMinute (zero: none). A need above the limit waits for a full
// bucket, and then takes it into debt: it can never fit whole.
func waitFor(level, need, perMinute float64) time.Duration {
	if perMinute <= 0 {
		return 0
	}
	short := math.Min(need, perMinute) - level
	if short <= 0 {
		return 0
	}
	return time.Duration(short / (perMinute / 60) * float64(time.Second))
}

// ArrivalLag is how much later than its take a request may reach the
// provider (a connection to dial, a TLS handshake). A bucket leaving a
// minute's worth starts to refill that much later than the take: the
// provider's starts when the request arrives, and a refill counted from
// the take would grant what the provider's has not refilled yet.
const ArrivalLag = time.Second

// lag is the refill a bucket that a take leaves full must not count yet
// (ArrivalLag): charged after the take, so the take itself sees the full
// bucket.
func lag(wasFull bool, perMinute float64) float64 {
	if wasFull {
		return perMinute / 60 * ArrivalLag.Seconds()
	}
	return 0
}

// take applies a to s at now (see Ask and Taken).
func (s *state) take(l Limits, a Ask, now time.Time) Taken {
	s.refill(l, now)
	if a.Slot && l.MaxConcurrent > 0 && s.Held >= l.MaxConcurrent {
		return Taken{Limit: LimitConcurrency, Refused: true}
	}
	t := Taken{
		RequestsWait: waitFor(s.Requests, a.Requests, l.RequestsPerMinute),
		TokensWait:   waitFor(s.Tokens, a.Tokens, l.TokensPerMinute),
		Mark:         s.mark(),
	}
	for _, w := range []struct {
		limit string
		d     time.Duration
	}{
		{LimitRequests, t.RequestsWait},
		{LimitTokens, t.TokensWait},
		{LimitPushback, s.BlockedUntil.Sub(now)},
	} {
		if w.d > t.Wait {
			t.Wait, t.Limit = w.d, w.limit
		}
	}
	if t.Wait > a.MaxWait {
		t.Refused = true
		return t
	}
	t.ExtraRequests = debit(&s.Requests, l.RequestsPerMinute, a.Requests, a.ExtraRequests, t.Wait == 0)
	t.ExtraTokens = debit(&s.Tokens, l.TokensPerMinute, a.Tokens, a.ExtraTokens, t.Wait == 0)
	if a.Slot && l.MaxConcurrent > 0 {
		s.Held++
		t.Slot = true
	}
	return t
}

// debit takes need from a bucket of perMinute (none when zero) at level,
// and, when the take need not wait, extra out of what is left, whole; it
// charges the arrival lag to a bucket it leaves full, and returns the
// extra taken.
func debit(level *float64, perMinute, need, extra float64, noWait bool) float64 {
	if perMinute <= 0 {
		return 0
	}
	full := *level >= perMinute
	*level -= need
	got := 0.0
	if noWait {
		got = math.Max(0, math.Min(extra, math.Floor(*level)))
		*level -= got
	}
	*level -= lag(full && need+got > 0, perMinute)
	return got
}

// adjust sets a bucket of perMinute (none when zero) to to(level) and
// counts the change as room given back (Mark).
func adjust(level, given *float64, perMinute float64, to func(float64) float64) {
	if perMinute <= 0 {
		return
	}
	was := *level
	*level = to(was)
	*given += *level - was
}

// give returns what a taker did not use: requests and tokens back to the
// buckets (never above a minute's worth; negative tokens charge what an
// attempt used beyond what it took), and slots it no longer holds.
func (s *state) give(l Limits, requests, tokens float64, slots int, now time.Time) {
	s.refill(l, now)
	adjust(&s.Requests, &s.GivenRequests, l.RequestsPerMinute, func(v float64) float64 { return math.Min(l.RequestsPerMinute, v+requests) })
	adjust(&s.Tokens, &s.GivenTokens, l.TokensPerMinute, func(v float64) float64 { return math.Min(l.TokensPerMinute, v+tokens) })
	s.Held = max(0, s.Held-slots)
}

// tighten applies a provider's pushback: its Retry-After holds every take
// until it has passed, and what it says is left lowers the buckets to it.
func (s *state) tighten(l Limits, p Pushback, now time.Time) {
	s.refill(l, now)
	if p.KnownRetryAfter {
		if until := now.Add(p.RetryAfter); until.After(s.BlockedUntil) {
			s.BlockedUntil = until
		}
	}
	// What the pushback takes away delays every waiter as a charge does.
	if p.KnownRemainingRequests {
		adjust(&s.Requests, &s.GivenRequests, l.RequestsPerMinute, func(v float64) float64 { return math.Min(v, p.RemainingRequests) })
	}
	if p.KnownRemainingTokens {
		adjust(&s.Tokens, &s.GivenTokens, l.TokensPerMinute, func(v float64) float64 { return math.Min(v, p.RemainingTokens) })
	}
}
