package fleetlimit

import (
	"context"
	"sync"
	"time"
)

// Store keeps the routes' buckets for every limiter that shares it. Each
// method is one change, applied whole or not at all. key names a route's
// buckets; holder names the limiter (the process) taking or giving, so a
// shared store can free the slots of a holder that stopped renewing them.
type Store interface {
	// Take asks key's buckets for a (see Ask and Taken).
	Take(ctx context.Context, key, holder string, l Limits, a Ask) (Taken, error)
	// Give returns what holder took and did not use: requests and tokens
	// (negative tokens charge what it used beyond what it took) and
	// slots.
	Give(ctx context.Context, key, holder string, l Limits, requests, tokens float64, slots int) error
	// Tighten applies a provider's pushback to key's buckets.
	Tighten(ctx context.Context, key string, l Limits, p Pushback) error
	// Renew tells the store that holder still holds slots of key's, so
	// a store that frees the slots of holders gone silent (Postgres,
	// after its lease) keeps them. A store that had already freed them
	// counts them as held again; otherwise the count is left to takes and
	// gives, which a renewal may race.
	Renew(ctx context.Context, key, holder string, l Limits, slots int) error
	// Mark reads how much room has been given back to key's buckets, and
	// the provider's hold (the zero Mark for buckets not made yet), for
	// the waiters of a take (Taken.Moved). It changes nothing.
	Mark(ctx context.Context, key string) (Mark, error)
	// Shared reports whether other processes share the store. A limiter
	// on a store of its own process keeps nothing on hand.
	Shared() bool
}

// Memory is a Store in this process alone: limits kept by one worker for
// itself, so N workers each keeping the same limits send up to N times
// them. It is what a worker without a shared database uses. The zero
// value is ready; it is safe for concurrent use.
type Memory struct {
	// Now is the clock; nil means time.Now. For tests.
	Now func() time.Time

	mu     sync.Mutex
	states map[string]*state
}

func (m *Memory) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// state returns key's buckets, full on first use. m.mu is held.
func (m *Memory) state(key string, l Limits, now time.Time) *state {
	if m.states == nil {
		m.states = map[string]*state{}
	}
	s, ok := m.states[key]
	if !ok {
		st := newState(l, now)
		s = &st
		m.states[key] = s
	}
	return s
}

// Take implements Store.
func (m *Memory) Take(_ context.Context, key, _ string, l Limits, a Ask) (Taken, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	return m.state(key, l, now).take(l, a, now), nil
}

// Give implements Store.
func (m *Memory) Give(_ context.Context, key, _ string, l Limits, requests, tokens float64, slots int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	m.state(key, l, now).give(l, requests, tokens, slots, now)
	return nil
}

// Tighten implements Store.
func (m *Memory) Tighten(_ context.Context, key string, l Limits, p Pushback) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	m.state(key, l, now).tighten(l, p, now)
	return nil
}

// Mark implements Store.
func (m *Memory) Mark(_ context.Context, key string) (Mark, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.states[key]; ok {
		return s.mark(), nil
	}
	return Mark{}, nil
}

// Renew implements Store: one process never loses its own slots.
func (m *Memory) Renew(context.Context, string, string, Limits, int) error { return nil }

// Shared implements Store: false.
func (m *Memory) Shared() bool { return false }
