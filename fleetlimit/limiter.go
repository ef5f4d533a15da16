package fleetlimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/durallm/durallm/providers/routes"
)

// ErrNoRoom is wrapped by the *NoRoomError Acquire returns.
var ErrNoRoom = errors.New("fleetlimit: no room before the attempt's deadline")

// NoRoomError says that a route's limit had no room for an attempt
// within the wait it could afford. Nothing was taken.
type NoRoomError struct {
	Route string
	// Limit is the limit that had no room (LimitRequests, LimitTokens,
	// LimitConcurrency, LimitPushback).
	Limit string
	// In is how long until it expects room; zero when it cannot tell
	// (a place among the requests in flight frees when one ends).
	In time.Duration
}

func (e *NoRoomError) Error() string {
	if e.In > 0 {
		return fmt.Sprintf("fleetlimit: route %s: no room in its %s limit for %s, more than the attempt can wait", e.Route, e.Limit, e.In.Round(time.Millisecond))
	}
	return fmt.Sprintf("fleetlimit: route %s: no room in its %s limit within the wait the attempt can afford", e.Route, e.Limit)
}

func (e *NoRoomError) Unwrap() error { return ErrNoRoom }

// Observer is told what a limiter does that no attempt's evidence shows.
// Its methods must be fast and safe for concurrent use.
type Observer interface {
	// Tightened: a provider's pushback was applied to route's limits.
	Tightened(route string)
	// StoreFailed: the shared store could not be reached for op (take,
	// give, tighten, renew, mark); a take fell back to this process's own
	// buckets.
	StoreFailed(route, op string)
}

// Options configure a Limiter.
type Options struct {
	// Store is what the fleet shares. Nil means a Memory of the
	// limiter's own: the limits are this process's alone.
	Store Store
	// Routes are the limits by route name; a route not named has none.
	Routes map[string]routes.Limits
	// Scope distinguishes the routes of one task queue from another's of
	// the same name in a shared store: a route's buckets are named
	// Scope + "/" + route. Empty means "durallm".
	Scope string
	// Observer, when set, is told of tightenings and store failures.
	Observer Observer
	// Logger receives what the limiter cannot do (never content). Nil
	// means slog.Default().
	Logger *slog.Logger
}

// How much of a route's limits a limiter on a shared store keeps on hand,
// and for how long it keeps what it does not use. On hand, an attempt with
// room is granted without a round trip; what sits idle is given back.
const (
	// OnHand is the share of a minute's worth kept on hand: a quarter
	// of a second of the route's rate.
	OnHand = 250 * time.Millisecond
	// KeepIdle is how long requests and tokens on hand stay unused before
	// they are given back. What attempts give back beyond what the hand
	// keeps goes back at once (within a tick).
	KeepIdle = 2 * time.Second
	// KeepSlots is how long a place among the requests in flight stays
	// on hand, unused, before it is given back: long enough for the next
	// attempt of a busy worker, short enough for another worker's.
	KeepSlots = 200 * time.Millisecond
	// slotPoll is how often a wait for a place asks the store again.
	slotPoll = 100 * time.Millisecond
	// tick is how often the limiter gives back and renews.
	tick = 100 * time.Millisecond
	// storeTimeout bounds the limiter's own store calls.
	storeTimeout = 5 * time.Second
	// abandonTimeout bounds the give of a wait cut short, which the
	// attempt's report waits for.
	abandonTimeout = time.Second
)

// Limiter is one process's side of the routes' fleet-wide limits. It is
// safe for concurrent use; Close it when the process stops taking
// attempts.
type Limiter struct {
	store    Store
	fallback *Memory
	holder   string
	routes   map[string]*route
	obs      Observer
	log      *slog.Logger
	lease    time.Duration

	stop     chan struct{}
	done     chan struct{}
	closed   sync.Once
	warnedMu sync.Mutex
	warned   time.Time
}

// route is one route's limits and what the limiter has on hand of them.
type route struct {
	name, key string
	limits    Limits
	// chunkRequests and chunkTokens are what a take asks on top to keep
	// on hand (zero on an unshared store).
	chunkRequests, chunkTokens float64

	mu sync.Mutex
	// requests and tokens are on hand: taken from the store while they
	// were free, not yet used.
	requests, tokens float64
	// returnRequests and returnTokens are what attempts gave back (what
	// they took and did not use; negative tokens: what they used beyond
	// it), for the store at the next tick. Never spent here: the store
	// owes it to whoever waits first, and moves every waiter by it
	// (Taken.Moved); spent here, it would go to the back of the line.
	returnRequests, returnTokens float64
	used                         time.Time // when the on-hand was last touched
	// spare slots are held in the store and unused since spareSince;
	// inUse are held by attempts.
	spare, inUse int
	spareSince   time.Time
	renewed      time.Time
	fetching     bool
	// waiters are the attempts waiting here for a time the store gave
	// them; mark is the store's last Mark, read each tick while there
	// are any, which moves their times (Taken.Moved).
	waiters int
	mark    Mark
	marked  bool
	// freed is closed, and replaced, when a slot is freed here.
	freed chan struct{}
}

// New returns a limiter for the routes in o.Routes with limits. It starts
// a goroutine that gives back what sits idle and renews the slots held;
// Close stops it.
func New(o Options) *Limiter {
	l := &Limiter{
		store: o.Store, fallback: &Memory{}, routes: map[string]*route{}, obs: o.Observer, log: o.Logger,
		stop: make(chan struct{}), done: make(chan struct{}), lease: DefaultLease,
	}
	if l.store == nil {
		l.store = l.fallback
	}
	if l.log == nil {
		l.log = slog.Default()
	}
	if p, ok := l.store.(*Postgres); ok && p.Lease > 0 {
		l.lease = p.Lease
	}
	host, _ := os.Hostname()
	var b [6]byte
	_, _ = rand.Read(b[:])
	l.holder = fmt.Sprintf("%d@%s-%s", os.Getpid(), host, hex.EncodeToString(b[:]))
	scope := o.Scope
	if scope == "" {
		scope = "durallm"
	}
	for name, rl := range o.Routes {
		lim := Limits{RequestsPerMinute: float64(rl.RequestsPerMinute), TokensPerMinute: float64(rl.TokensPerMinute), MaxConcurrent: rl.MaxConcurrentRequests}
		if lim == (Limits{}) {
			continue
		}
		r := &route{name: name, key: scope + "/" + name, limits: lim, freed: make(chan struct{})}
		if l.store.Shared() {
			r.chunkRequests = math.Floor(lim.RequestsPerMinute * OnHand.Minutes())
			r.chunkTokens = math.Floor(lim.TokensPerMinute * OnHand.Minutes())
		}
		l.routes[name] = r
	}
	go l.run()
	return l
}

// Shared reports whether the limits are kept with other processes (false:
// this process keeps them alone).
func (l *Limiter) Shared() bool { return l.store.Shared() }

// Limited reports whether route has limits.
func (l *Limiter) Limited(name string) bool {
	if l == nil {
		return false
	}
	_, ok := l.routes[name]
	return ok
}

// Grant is the room an attempt was given. Release it once the attempt has
// ended.
type Grant struct {
	// Waited is how long Acquire took: the check alone when there was
	// room, or the wait for it.
	Waited time.Duration
	// Limit is the limit the attempt waited for, empty when it had room
	// at once.
	Limit string

	l        *Limiter
	r        *route
	tokens   float64
	slot     bool
	released bool
}

// Acquire waits until route has room for one request of tokens tokens
// (and a place among the requests in flight), for at most maxWait, and
// returns the grant; a route without limits gets a nil grant at once.
// waiting, when not nil, is called with the limit once the attempt has
// to wait for it. When the wait would be longer than maxWait, it returns
// a *NoRoomError at once (for a place in flight, once maxWait has
// passed) and nothing is taken. When ctx ends first it returns ctx's
// error, and gives back what it took.
func (l *Limiter) Acquire(ctx context.Context, name string, tokens float64, maxWait time.Duration, waiting func(limit string)) (*Grant, error) {
	r := l.routes[name]
	if r == nil {
		return nil, nil
	}
	start := time.Now()
	deadline := start.Add(max(0, maxWait))
	g := &Grant{l: l, r: r, tokens: tokens}
	told := ""
	tell := func(limit string) {
		if waiting != nil && limit != told {
			told = limit
			waiting(limit)
		}
	}
	lim := r.limits
	for {
		r.mu.Lock()
		haveReq := lim.RequestsPerMinute <= 0 || r.requests >= 1
		haveTok := lim.TokensPerMinute <= 0 || r.tokens >= tokens
		haveSlot := lim.MaxConcurrent <= 0 || r.spare > 0
		if haveReq && haveTok && haveSlot {
			// Room on hand: no round trip.
			r.takeOnHand(g, true, true, true)
			fetch := r.wantsFetch()
			r.mu.Unlock()
			if fetch {
				go l.fetch(r)
			}
			g.Waited = time.Since(start)
			return g, nil
		}
		// Use what is on hand, and ask the store for the rest, with
		// something on top to keep.
		a, fromHand := r.askBeyondHand(tokens, haveReq, haveTok, haveSlot)
		a.MaxWait = max(0, time.Until(deadline))
		freed := r.freed
		r.mu.Unlock()
		t, err := l.take(ctx, r, a)
		r.mu.Lock()
		if err != nil || t.Refused {
			// Nothing was taken.
			r.putBack(fromHand)
			r.mu.Unlock()
			switch {
			case err != nil:
				return nil, err
			case t.Limit != LimitConcurrency:
				return nil, &NoRoomError{Route: name, Limit: t.Limit, In: t.Wait}
			}
			// No place in flight: wait for one to be freed here, or ask
			// again shortly, until the wait allowed has passed.
			left := time.Until(deadline)
			if left <= 0 {
				return nil, &NoRoomError{Route: name, Limit: LimitConcurrency}
			}
			tell(LimitConcurrency)
			g.Limit = LimitConcurrency
			poll := time.NewTimer(min(left, slotPoll/2+mrand.N(slotPoll)))
			select {
			case <-ctx.Done():
				poll.Stop()
				return nil, ctx.Err()
			case <-freed:
			case <-poll.C:
			}
			poll.Stop()
			continue
		}
		r.requests += t.ExtraRequests
		r.tokens += t.ExtraTokens
		r.used = time.Now()
		if t.Slot {
			r.inUse++
		}
		g.slot = lim.MaxConcurrent > 0
		r.mu.Unlock()
		if t.Wait > 0 {
			tell(t.Limit)
			g.Limit = t.Limit
			if err := r.await(ctx, t, time.Now()); err != nil {
				l.abandon(g)
				return nil, err
			}
		}
		g.Waited = time.Since(start)
		return g, nil
	}
}

// handTake is what an attempt took from its route's hand while it asks
// the store for the rest.
type handTake struct {
	req, slot bool
	tok       float64
}

// askBeyondHand takes from the hand what it holds of what an attempt of
// tokens needs (haveReq, haveTok and haveSlot say what it holds enough
// of; what it holds of tokens counts toward them in any case), and
// returns the Ask for the rest, with the chunks to keep on hand on top.
// r.mu is held.
func (r *route) askBeyondHand(tokens float64, haveReq, haveTok, haveSlot bool) (Ask, handTake) {
	var a Ask
	var h handTake
	lim := r.limits
	if lim.RequestsPerMinute > 0 {
		if haveReq {
			r.requests--
			h.req = true
		} else {
			a.Requests = 1
		}
		a.ExtraRequests = r.chunkRequests
	}
	if lim.TokensPerMinute > 0 {
		if haveTok {
			r.tokens -= tokens
			h.tok = tokens
		} else {
			a.Tokens = tokens - r.tokens
			h.tok = r.tokens
			r.tokens = 0
		}
		a.ExtraTokens = r.chunkTokens
	}
	if lim.MaxConcurrent > 0 {
		if haveSlot {
			r.spare--
			r.inUse++
			h.slot = true
		} else {
			a.Slot = true
		}
	}
	return a, h
}

// putBack returns to the hand what h took from it, for a take that got
// nothing. r.mu is held.
func (r *route) putBack(h handTake) {
	if h.req {
		r.requests++
	}
	r.tokens += h.tok
	if h.slot {
		r.inUse--
		r.addSpare(1)
	}
}

// markPoll is how often a waiter looks at the store's last Mark.
const markPoll = 100 * time.Millisecond

// await waits until the time t gave a take made at `at`, moved by what
// the fleet gives back meanwhile (Taken.Moved), or until ctx ends.
func (r *route) await(ctx context.Context, t Taken, at time.Time) error {
	r.mu.Lock()
	r.waiters++
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.waiters--
		if r.waiters == 0 {
			r.marked = false
		}
		r.mu.Unlock()
	}()
	wake := at.Add(t.Wait)
	for {
		d := time.Until(wake)
		if d <= 0 {
			return nil
		}
		timer := time.NewTimer(min(d, markPoll))
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
		r.mu.Lock()
		m, ok := r.mark, r.marked
		r.mu.Unlock()
		if ok {
			wake = t.Moved(r.limits, at, m)
		}
	}
}

// abandon gives back what a grant cut short in its wait took. Its room
// was not free now but owed from the future, so it goes back to the
// store, which owes it to the next in line; its place in flight, free
// now, goes on hand.
func (l *Limiter) abandon(g *Grant) {
	r := g.r
	r.mu.Lock()
	g.released = true
	if g.slot {
		r.inUse--
		r.addSpare(1)
	}
	r.mu.Unlock()
	var req, tok float64
	if r.limits.RequestsPerMinute > 0 {
		req = 1
	}
	if r.limits.TokensPerMinute > 0 {
		tok = g.tokens
	}
	if req == 0 && tok == 0 {
		return
	}
	// Before Acquire returns, so the next in line finds it; bounded, as
	// the attempt's report waits for it.
	ctx, cancel := context.WithTimeout(context.Background(), abandonTimeout)
	defer cancel()
	if err := l.store.Give(ctx, r.key, l.holder, r.limits, req, tok, 0); err != nil {
		l.storeFailed(r, "give", err)
	}
}

// takeOnHand takes what g needs from the hand. r.mu is held.
func (r *route) takeOnHand(g *Grant, req, tok, slot bool) {
	if req && r.limits.RequestsPerMinute > 0 {
		r.requests--
	}
	if tok && r.limits.TokensPerMinute > 0 {
		r.tokens -= g.tokens
	}
	if slot && r.limits.MaxConcurrent > 0 {
		r.spare--
		r.inUse++
		g.slot = true
	}
	r.used = time.Now()
}

// wantsFetch reports whether the hand is low enough to ask the store for
// more in the background, and marks the fetch begun. r.mu is held.
func (r *route) wantsFetch() bool {
	if r.fetching || (r.chunkRequests == 0 && r.chunkTokens == 0) {
		return false
	}
	low := (r.limits.RequestsPerMinute > 0 && r.requests < r.chunkRequests/2) ||
		(r.limits.TokensPerMinute > 0 && r.tokens < r.chunkTokens/2)
	r.fetching = low
	return low
}

// addSpare puts n slots on hand. r.mu is held.
func (r *route) addSpare(n int) {
	if r.spare == 0 {
		r.spareSince = time.Now()
	}
	r.spare += n
	close(r.freed)
	r.freed = make(chan struct{})
}

// fetch asks the store for what is free now, to keep on hand.
func (l *Limiter) fetch(r *route) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	t, err := l.store.Take(ctx, r.key, l.holder, r.limits, Ask{ExtraRequests: r.chunkRequests, ExtraTokens: r.chunkTokens})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fetching = false
	if err != nil {
		l.storeFailed(r, "take", err)
		return
	}
	r.requests += t.ExtraRequests
	r.tokens += t.ExtraTokens
	r.used = time.Now()
}

// take asks the store, or this process's own buckets when the store
// cannot be reached (the limits are then kept per process until it
// answers again).
func (l *Limiter) take(ctx context.Context, r *route, a Ask) (Taken, error) {
	t, err := l.store.Take(ctx, r.key, l.holder, r.limits, a)
	if err == nil || ctx.Err() != nil || l.store == Store(l.fallback) {
		return t, err
	}
	l.storeFailed(r, "take", err)
	return l.fallback.Take(ctx, r.key, l.holder, r.limits, a)
}

// storeFailed logs (at most every 10s) and counts a failed store call.
func (l *Limiter) storeFailed(r *route, op string, err error) {
	if l.obs != nil {
		l.obs.StoreFailed(r.name, op)
	}
	l.warnedMu.Lock()
	warn := time.Since(l.warned) > 10*time.Second
	if warn {
		l.warned = time.Now()
	}
	l.warnedMu.Unlock()
	if warn {
		l.log.Warn("fleet limits: the shared store failed; this process keeps the limits by itself until it answers", "route", r.name, "op", op, "error", err)
	}
}

// Release ends the grant: sent says whether the request may have
// reached the provider (false gives everything back), used is the tokens
// the attempt counts when usage says so (usedKnown); otherwise it keeps
// the tokens it took. Its place in flight is freed. Later calls do
// nothing.
func (g *Grant) Release(sent bool, used float64, usedKnown bool) {
	if g == nil {
		return
	}
	g.give(sent, used, usedKnown)
}

func (g *Grant) give(sent bool, used float64, usedKnown bool) {
	r := g.r
	r.mu.Lock()
	defer func() {
		if !g.l.store.Shared() && (r.returnRequests != 0 || r.returnTokens != 0) {
			// A store of this process's own costs no round trip: at once.
			_ = g.l.store.Give(context.Background(), r.key, g.l.holder, r.limits, r.returnRequests, r.returnTokens, 0)
			r.returnRequests, r.returnTokens = 0, 0
		}
		r.mu.Unlock()
	}()
	if g.released {
		return
	}
	g.released = true
	switch {
	case !sent:
		if r.limits.RequestsPerMinute > 0 {
			r.returnRequests++
		}
		if r.limits.TokensPerMinute > 0 {
			r.returnTokens += g.tokens
		}
	case usedKnown && r.limits.TokensPerMinute > 0:
		r.returnTokens += g.tokens - used
	}
	r.used = time.Now()
	if g.slot {
		r.inUse--
		r.addSpare(1)
	}
}

// Pushback applies a provider's 429 to route's shared limits: every
// limiter's next take waits out its Retry-After, and the buckets are
// lowered to what it says is left. A route without limits, or a
// pushback that says nothing, changes nothing.
func (l *Limiter) Pushback(ctx context.Context, name string, p Pushback) {
	r := l.routes[name]
	if r == nil || !p.Known() {
		return
	}
	if p.KnownRemainingRequests || p.KnownRemainingTokens {
		// What is on hand is counted as the provider's too.
		r.mu.Lock()
		if p.KnownRemainingRequests {
			p.RemainingRequests = math.Max(0, p.RemainingRequests-math.Max(0, r.requests))
		}
		if p.KnownRemainingTokens {
			p.RemainingTokens = math.Max(0, p.RemainingTokens-math.Max(0, r.tokens))
		}
		r.mu.Unlock()
	}
	if err := l.store.Tighten(ctx, r.key, r.limits, p); err != nil {
		l.storeFailed(r, "tighten", err)
		_ = l.fallback.Tighten(ctx, r.key, r.limits, p)
		return
	}
	if l.obs != nil {
		l.obs.Tightened(name)
	}
}

// run gives back what sits idle and renews the slots held, until Close.
func (l *Limiter) run() {
	defer close(l.done)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			l.giveBack(true)
			return
		case <-t.C:
			l.giveBack(false)
		}
	}
}

// giveBack returns idle requests, tokens and slots to the store (all of
// them when final), and renews the leases of the slots still held.
func (l *Limiter) giveBack(final bool) {
	now := time.Now()
	for _, r := range l.routes {
		r.mu.Lock()
		var slots, held int
		req, tok := r.returnRequests, r.returnTokens
		r.returnRequests, r.returnTokens = 0, 0
		if !r.fetching && (final || now.Sub(r.used) > KeepIdle) {
			req, tok = req+r.requests, tok+r.tokens
			r.requests, r.tokens = 0, 0
		}
		if r.spare > 0 && (final || now.Sub(r.spareSince) > KeepSlots) {
			slots = r.spare
			r.spare = 0
		}
		renew := r.limits.MaxConcurrent > 0 && !final && now.Sub(r.renewed) > l.lease/3
		if renew {
			r.renewed = now
			held = r.inUse + r.spare
		}
		mark := r.waiters > 0 && !final
		r.mu.Unlock()
		if req == 0 && tok == 0 && slots == 0 && !renew && !mark {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		if req != 0 || tok != 0 || slots != 0 {
			if err := l.store.Give(ctx, r.key, l.holder, r.limits, req, tok, slots); err != nil {
				l.storeFailed(r, "give", err)
			}
		}
		if mark {
			// After the give, so this worker's own room moves its waiters.
			if m, err := l.store.Mark(ctx, r.key); err != nil {
				l.storeFailed(r, "mark", err)
			} else {
				r.mu.Lock()
				r.mark, r.marked = m, true
				r.mu.Unlock()
			}
		}
		if renew && (held > 0 || slots > 0) {
			if err := l.store.Renew(ctx, r.key, l.holder, r.limits, held); err != nil {
				l.storeFailed(r, "renew", err)
			}
		}
		cancel()
	}
}

// Close gives back everything on hand and stops the limiter. Attempts
// still holding grants keep their places until their leases run out. A
// nil Limiter closes nothing.
func (l *Limiter) Close() {
	if l == nil {
		return
	}
	l.closed.Do(func() {
		close(l.stop)
		<-l.done
	})
}
