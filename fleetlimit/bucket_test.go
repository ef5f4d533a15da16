package fleetlimit

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func TestWaitFor(t *testing.T) {
	for _, c := range []struct {
		name                   string
		level, need, perMinute float64
		want                   time.Duration
	}{
		{"no limit", -100, 5, 0, 0},
		{"fits", 5, 5, 60, 0},
		{"short by one at one a second", 0, 1, 60, time.Second},
		{"in debt waits for the debt too", -2, 1, 60, 3 * time.Second},
		{"a need above the limit waits for a full bucket", 30, 100, 60, 30 * time.Second},
		{"tokens: 200 short at 1000 a minute", 400, 600, 1000, 12 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := waitFor(c.level, c.need, c.perMinute); got != c.want {
				t.Fatalf("waitFor(%v, %v, %v) = %v, want %v", c.level, c.need, c.perMinute, got, c.want)
			}
		})
	}
}

func TestStateTake(t *testing.T) {
	l := Limits{RequestsPerMinute: 60, TokensPerMinute: 6000, MaxConcurrent: 2}
	for _, c := range []struct {
		name  string
		start state
		ask   Ask
		at    time.Duration // after t0
		want  Taken
		after state // levels after, Refilled at t0+at
	}{
		{
			name:  "room in a full bucket: taken with no wait, and the arrival lag charged",
			start: newState(l, t0), ask: Ask{Requests: 1, Tokens: 100},
			want:  Taken{},
			after: state{Requests: 58, Tokens: 5800},
		},
		{
			name:  "extras come out of what is left, whole",
			start: state{Requests: 10.5, Tokens: 1000.5, Refilled: t0}, ask: Ask{Requests: 1, Tokens: 100, ExtraRequests: 20, ExtraTokens: 300},
			want:  Taken{ExtraRequests: 9, ExtraTokens: 300},
			after: state{Requests: 0.5, Tokens: 600.5},
		},
		{
			name:  "a wait goes into debt, and takes no extras",
			start: state{Requests: 0, Tokens: 6000, Refilled: t0}, ask: Ask{Requests: 1, Tokens: 100, ExtraRequests: 5, MaxWait: time.Minute},
			want:  Taken{Wait: time.Second, Limit: LimitRequests},
			after: state{Requests: -1, Tokens: 5800},
		},
		{
			name:  "the longer wait names the limit",
			start: state{Requests: 0, Tokens: 0, Refilled: t0}, ask: Ask{Requests: 1, Tokens: 500, MaxWait: time.Minute},
			want:  Taken{Wait: 5 * time.Second, Limit: LimitTokens},
			after: state{Requests: -1, Tokens: -500},
		},
		{
			name:  "a wait past MaxWait takes nothing",
			start: state{Requests: 0, Tokens: 6000, Refilled: t0}, ask: Ask{Requests: 1, Tokens: 100, MaxWait: 500 * time.Millisecond},
			want:  Taken{Wait: time.Second, Limit: LimitRequests, Refused: true},
			after: state{Requests: 0, Tokens: 6000},
		},
		{
			name:  "the levels refill with time, never above a minute's worth",
			start: state{Requests: 0, Tokens: 5990, Refilled: t0}, ask: Ask{Requests: 1, Tokens: 100}, at: 2 * time.Second,
			want:  Taken{},
			after: state{Requests: 1, Tokens: 5800},
		},
		{
			name:  "a slot when there is one",
			start: state{Requests: 30, Tokens: 6000, Held: 1, Refilled: t0}, ask: Ask{Requests: 1, Slot: true},
			want:  Taken{Slot: true},
			after: state{Requests: 29, Tokens: 6000, Held: 2},
		},
		{
			name:  "no slot: nothing is taken",
			start: state{Requests: 60, Tokens: 6000, Held: 2, Refilled: t0}, ask: Ask{Requests: 1, Slot: true, MaxWait: time.Hour},
			want:  Taken{Limit: LimitConcurrency, Refused: true},
			after: state{Requests: 60, Tokens: 6000, Held: 2},
		},
		{
			name:  "a provider's Retry-After holds every take",
			start: state{Requests: 30, Tokens: 6000, Refilled: t0, BlockedUntil: t0.Add(30 * time.Second)}, ask: Ask{Requests: 1, MaxWait: time.Minute},
			want:  Taken{Wait: 30 * time.Second, Limit: LimitPushback},
			after: state{Requests: 29, Tokens: 6000},
		},
		{
			name:  "a Retry-After that has passed holds nothing",
			start: state{Requests: 30, Tokens: 6000, Refilled: t0, BlockedUntil: t0.Add(-time.Second)}, ask: Ask{Requests: 1, ExtraRequests: 2},
			want:  Taken{ExtraRequests: 2},
			after: state{Requests: 27, Tokens: 6000},
		},
		{
			name:  "extras alone leaving a full bucket are charged the lag too",
			start: newState(l, t0), ask: Ask{ExtraRequests: 10},
			want:  Taken{ExtraRequests: 10},
			after: state{Requests: 49, Tokens: 6000},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := c.start
			now := t0.Add(c.at)
			got := s.take(l, c.ask, now)
			// The waits per bucket and the mark: TestTakenMoved.
			got.RequestsWait, got.TokensWait, got.Mark = 0, 0, Mark{}
			if got != c.want {
				t.Fatalf("take = %+v, want %+v", got, c.want)
			}
			c.after.Refilled, c.after.BlockedUntil = now, c.start.BlockedUntil
			if c.at == 0 {
				c.after.Refilled = c.start.Refilled
			}
			if s != c.after {
				t.Fatalf("state after = %+v, want %+v", s, c.after)
			}
		})
	}
}

func TestStateGive(t *testing.T) {
	l := Limits{RequestsPerMinute: 60, TokensPerMinute: 6000, MaxConcurrent: 2}
	s := state{Requests: 50, Tokens: 100, Held: 1, Refilled: t0}
	s.give(l, 20, -300, 3, t0)
	if want := (state{Requests: 60, Tokens: -200, Held: 0, Refilled: t0, GivenRequests: 10, GivenTokens: -300}); s != want {
		t.Fatalf("after give %+v, want %+v (requests capped at a minute's worth and counted given as such, negative tokens charged, held never below zero)", s, want)
	}
}

func TestStateTighten(t *testing.T) {
	l := Limits{RequestsPerMinute: 60, TokensPerMinute: 6000}
	for _, c := range []struct {
		name  string
		start state
		p     Pushback
		want  state
	}{
		{"nothing known changes nothing", state{Requests: 30, Tokens: 3000}, Pushback{}, state{Requests: 30, Tokens: 3000}},
		{"Retry-After holds the route", state{Requests: 30, Tokens: 3000}, Pushback{RetryAfter: 20 * time.Second, KnownRetryAfter: true},
			state{Requests: 30, Tokens: 3000, BlockedUntil: t0.Add(20 * time.Second)}},
		{"a shorter Retry-After does not shorten a longer hold", state{Requests: 30, Tokens: 3000, BlockedUntil: t0.Add(time.Minute)},
			Pushback{RetryAfter: time.Second, KnownRetryAfter: true}, state{Requests: 30, Tokens: 3000, BlockedUntil: t0.Add(time.Minute)}},
		{"what is left lowers the buckets, delaying every waiter", state{Requests: 30, Tokens: 3000},
			Pushback{RemainingRequests: 2, KnownRemainingRequests: true, RemainingTokens: 0, KnownRemainingTokens: true}, state{Requests: 2, Tokens: 0, GivenRequests: -28, GivenTokens: -3000}},
		{"what is left never raises them", state{Requests: 1, Tokens: -50},
			Pushback{RemainingRequests: 40, KnownRemainingRequests: true, RemainingTokens: 4000, KnownRemainingTokens: true}, state{Requests: 1, Tokens: -50}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := c.start
			s.Refilled = t0
			s.tighten(l, c.p, t0)
			c.want.Refilled = t0
			if s != c.want {
				t.Fatalf("after tighten %+v, want %+v", s, c.want)
			}
		})
	}
}

// Room given back while a take waits moves its time sooner, at the
// bucket's rate; room taken away (a charge, a pushback) moves it later;
// the provider's hold is never passed.
func TestTakenMoved(t *testing.T) {
	l := Limits{RequestsPerMinute: 60, TokensPerMinute: 6000}
	s := state{Requests: 0, Tokens: 0, Refilled: t0}
	taken := s.take(l, Ask{Requests: 1, Tokens: 500, MaxWait: time.Hour}, t0) // 1s for requests, 5s for tokens
	if taken.Wait != 5*time.Second || taken.RequestsWait != time.Second || taken.TokensWait != 5*time.Second {
		t.Fatalf("take %+v", taken)
	}
	for _, c := range []struct {
		name string
		give func(*state)
		want time.Duration // after t0
	}{
		{"nothing given back", func(*state) {}, 5 * time.Second},
		{"200 tokens given back: 2s sooner", func(s *state) { s.give(l, 0, 200, 0, t0) }, 3 * time.Second},
		{"more given back than it waits for: the requests bucket's wait remains", func(s *state) { s.give(l, 0, 10000, 0, t0) }, time.Second},
		{"both given back: at once", func(s *state) { s.give(l, 5, 10000, 0, t0) }, 0},
		{"a charge of 100 tokens: 1s later", func(s *state) { s.give(l, 0, -100, 0, t0) }, 6 * time.Second},
		{"a provider's hold beyond it", func(s *state) {
			s.tighten(l, Pushback{RetryAfter: 20 * time.Second, KnownRetryAfter: true}, t0)
		}, 20 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			after := s
			c.give(&after)
			if got := taken.Moved(l, t0, after.mark()); got != t0.Add(c.want) {
				t.Fatalf("moved to %v after t0, want %v", got.Sub(t0), c.want)
			}
		})
	}
}
