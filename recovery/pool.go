package recovery

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http2"
)

// pooledConn is one HTTP/2 connection the engine owns.
type pooledConn struct {
	ref       string
	authority string
	cc        *http2.ClientConn
	oc        *ObservedConn
	h2c       bool // cleartext with prior knowledge: nothing negotiated HTTP/2

	// draining is set, from the frame observer's read path, the moment a
	// GOAWAY arrives, a 421 quarantines the connection, or the framing is
	// lost: from then on no new stream goes to it.
	draining    atomic.Bool
	quarantined atomic.Bool
	// inflight counts the attempts the pool handed this connection that
	// have not been released yet.
	inflight atomic.Int32
	// ap is the authority's pool entry, set before the connection is
	// handed out, so release finds it without the pool's lock and map.
	ap *authPool
}

// usable reports whether the connection may take new streams. It reads
// only the engine's own state: x/net's ClientConn.State takes the
// connection's write lock, which a writer blocked on a peer that stopped
// reading holds indefinitely, and the pool asks under its one lock.
func (c *pooledConn) usable() bool { return !c.draining.Load() && !c.oc.isClosed() }

// pool keeps the engine's connections per authority.
//
// Its rules are the contract's: a connection that saw GOAWAY takes no new
// stream; a 421 quarantines the connection for its authority and the retry
// gets a fresh one; at most max live connections (plus dials in progress)
// per authority, and only one dial at a time unless a fresh connection is
// required, so a drain of many streams becomes one reconnect, not a storm.
type pool struct {
	max  int
	dial dialFunc

	mu     sync.Mutex // guards byAuth and each authPool's conns and dialing
	byAuth map[string]*authPool

	// wakeMu guards the wake channels only. It is a leaf lock: hooks called
	// from a connection's read path take it, and nothing is called while
	// it is held.
	wakeMu sync.Mutex
}

type authPool struct {
	conns   []*pooledConn
	dialing int
	wake    chan struct{} // closed and replaced when a slot may have opened
	// getters counts get calls in progress for the authority. A release
	// wakes only when it is above zero: a release with no get in
	// progress has no one to wake, and closing and replacing wake on
	// every release cost a channel allocation and both locks per request.
	// get registers before it first looks, so a release that reads zero
	// happened before any later get looked, and that get sees what the
	// release freed.
	getters atomic.Int32
}

// dialFunc dials a new connection. wake must be called (from any
// goroutine, never blocking) when the connection's state changes in a way
// that may free a slot: GOAWAY, lost framing, close.
// alpn is the TLS offer for an https dial.
type dialFunc func(ctx context.Context, scheme, authority string, alpn []string, wake func()) (*pooledConn, error)

func newPool(max int, dial dialFunc) *pool {
	return &pool{max: max, dial: dial, byAuth: make(map[string]*authPool)}
}

func (p *pool) authLocked(authority string) *authPool {
	ap := p.byAuth[authority]
	if ap == nil {
		ap = &authPool{wake: make(chan struct{})}
		p.byAuth[authority] = ap
	}
	return ap
}

// notify wakes everyone waiting for a connection to ap's authority. It
// takes only the leaf lock, so it is safe from any goroutine.
func (p *pool) notify(ap *authPool) {
	p.wakeMu.Lock()
	close(ap.wake)
	ap.wake = make(chan struct{})
	p.wakeMu.Unlock()
}

// get returns a connection for a new stream to authority, reserving a
// stream slot on it. avoid lists connection refs the attempt must not use;
// fresh demands a newly dialed connection. dialed reports that the
// connection was dialed for this call.
func (p *pool) get(ctx context.Context, scheme, authority string, alpn, avoid []string, fresh bool) (c *pooledConn, dialed bool, err error) {
	var ap *authPool
	defer func() { ap.getters.Add(-1) }()
	for {
		p.mu.Lock()
		if ap == nil {
			// Registered before the first look (see authPool.getters).
			ap = p.authLocked(authority)
			ap.getters.Add(1)
		}
		p.wakeMu.Lock()
		wake := ap.wake // taken before looking, so no wake-up is missed
		p.wakeMu.Unlock()

		stale := ap.pruneLocked()
		if !fresh {
			for _, pc := range ap.conns {
				if pc.usable() && !slices.Contains(avoid, pc.ref) && pc.cc.ReserveNewRequest() {
					pc.inflight.Add(1)
					p.mu.Unlock()
					closeAll(stale)
					return pc, false, nil
				}
			}
		}
		live := ap.dialing
		for _, pc := range ap.conns {
			if pc.usable() {
				live++
			}
		}
		if live < p.max && (fresh || ap.dialing == 0) {
			ap.dialing++
			p.mu.Unlock()
			closeAll(stale)
			wakeAP := ap // captured by the hooks: a copy, so get's own ap stays on the stack
			pc, err := p.dial(ctx, scheme, authority, alpn, func() { p.notify(wakeAP) })
			p.mu.Lock()
			ap.dialing--
			if err == nil {
				pc.ap = ap
				ap.conns = append(ap.conns, pc)
			}
			p.mu.Unlock()
			p.notify(ap)
			if err != nil {
				return nil, false, err
			}
			pc.cc.ReserveNewRequest() // a brand-new connection always has room
			pc.inflight.Add(1)
			return pc, true, nil
		}
		p.mu.Unlock()
		closeAll(stale)
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, false, context.Cause(ctx)
		}
	}
}

// pruneLocked drops closed connections and returns draining ones with no
// streams left, for the caller to close outside the lock.
func (ap *authPool) pruneLocked() (stale []*pooledConn) {
	kept := ap.conns[:0]
	for _, pc := range ap.conns {
		switch {
		case pc.oc.isClosed():
		case pc.draining.Load() && pc.inflight.Load() == 0:
			stale = append(stale, pc)
		default:
			kept = append(kept, pc)
		}
	}
	clear(ap.conns[len(kept):])
	ap.conns = kept
	return stale
}

func closeAll(cs []*pooledConn) {
	for _, pc := range cs {
		go pc.cc.Close() // a TLS close can block on an unresponsive peer
	}
}

// closeAllConns closes every connection; used by Engine.Close.
func (p *pool) closeAllConns() {
	p.mu.Lock()
	var all []*pooledConn
	for _, ap := range p.byAuth {
		all = append(all, ap.conns...)
		ap.conns = nil
	}
	p.mu.Unlock()
	for _, pc := range all {
		pc.cc.Close()
	}
}

// release returns the attempt's hold on pc, taken by get, and wakes the
// waiters of its authority, if a get is in progress there (see
// authPool.getters). Call it exactly once per successful get.
func (p *pool) release(pc *pooledConn) {
	pc.inflight.Add(-1)
	if pc.ap.getters.Load() > 0 {
		p.notify(pc.ap)
	}
}

// wakeAuthority wakes waiters for a connection to authority: a slot may
// have opened.
func (p *pool) wakeAuthority(authority string) {
	p.mu.Lock()
	ap := p.byAuth[authority]
	p.mu.Unlock()
	if ap != nil {
		p.notify(ap)
	}
}
