package recovery

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/durallm/durallm/evidence"
	"golang.org/x/net/http2"
)

// The ALPN offers of an HTTP/2 dial: auto also offers http/1.1, so that a
// server that speaks only HTTP/1.1 can say so.
var (
	alpnH2   = []string{http2.NextProtoTLS}
	alpnAuto = []string{http2.NextProtoTLS, "http/1.1"}
)

// roundTripHTTP2 sends out once over one of the pool's HTTP/2 connections
// (ALPN may hand it to roundTripHTTP1 instead), with one ClientConn.RoundTrip
// per connection picked (docs/contract.md section 1.1).
func (e *Engine) roundTripHTTP2(ctx context.Context, a *Attempt, out *http.Request, version HTTPVersion, scheme, authority string, auto bool) (*http.Response, error) {
	alpn := alpnAuto
	if version == HTTPVersion2 {
		alpn = alpnH2
	}

	e.obs.track(a.spec.AttemptID, &a.tracker)
	var resp *http.Response
	for pick := 1; ; pick++ {
		pc, dialed, err := e.pool.get(ctx, scheme, authority, alpn, a.spec.Avoid, a.spec.FreshConnection)
		if err != nil {
			// Only here: errors.As makes its target escape, and this is
			// every request's path.
			var neg errNegotiatedHTTP1
			if errors.As(err, &neg) {
				// ALPN chose HTTP/1.1 for an auto request: the connection
				// is good, for the other protocol.
				e.obs.Untrack(a.spec.AttemptID)
				e.learnHTTP1(scheme, authority)
				return e.roundTripHTTP1(ctx, a, out, scheme, authority, auto, neg.c)
			}
			if errors.Is(err, ErrNoHTTP2) {
				a.mismatch(evidence.MismatchHTTP11)
			}
			a.dialFailed(ctx)
			a.settle(ctx, nil, auto)
			return nil, &AttemptError{AttemptID: a.spec.AttemptID, Err: err}
		}
		a.useConn(pc, dialed)
		resp, err = pc.cc.RoundTrip(out)
		if err == nil {
			break
		}
		never, maybe := e.neverLeft(ctx, out, a.spec.AttemptID, pc)
		if pick < maxPicks && ctx.Err() == nil && never && !pc.usable() && rewind(out) {
			// The connection went away (GOAWAY, close) between the pick and
			// the first byte of HEADERS: the request never left, so choosing
			// another connection is not a retry of it.
			e.pool.release(pc)
			continue
		}
		if maybe {
			a.maybeSent()
			e.stats.maybeSent.Add(1)
		}
		a.settle(ctx, err, auto)
		e.pool.release(pc)
		m := a.Evidence().ProtocolMismatch
		if m != "" && version == HTTPVersionAuto {
			// Not HTTP/2: over http:// the one other protocol is HTTP/1.1.
			// (A server that closed silently may have answered in
			// HTTP/1.1 just before: its reset can destroy the answer.)
			e.learnHTTP1(scheme, authority)
		}
		switch m {
		case evidence.MismatchHTTP11:
			err = fmt.Errorf("%w (%w)", ErrSpeaksHTTP1, err)
		case evidence.MismatchNotHTTP2:
			err = fmt.Errorf("%w (%w)", ErrNotHTTP2, err)
		}
		return nil, &AttemptError{AttemptID: a.spec.AttemptID, Err: err}
	}
	pc := a.connUsed()
	if resp.StatusCode == http.StatusMisdirectedRequest {
		// Quarantine before anyone else can pick the connection: the server
		// said this connection cannot serve this authority.
		if !pc.quarantined.Swap(true) {
			e.stats.quarantines.Add(1)
		}
		pc.draining.Store(true)
		e.pool.wakeAuthority(authority)
	}
	a.response(resp)
	resp.Body = &body{rc: resp.Body, a: a, ctx: ctx, auto: auto, pool: e.pool, pc: pc}
	return resp, nil
}

// maxPicks bounds how often one request may be given another connection
// because the picked one became unusable before the request left.
const maxPicks = 3

// neverLeft is called after pc.cc.RoundTrip(out) failed. never reports
// that it is proven no HEADERS of the attempt left on pc; maybe, that the
// request was in x/net's hands when its context ended and that cannot be
// proven (Evidence.MaybeSent). Neither is set when the observer already
// saw the HEADERS, or lost the framing (the evidence says so itself).
//
// A failed RoundTrip does not mean x/net has stopped writing the request:
// when the context ends, ClientConn.RoundTrip aborts the stream and
// returns without waiting for its writeRequest goroutine, which may be
// inside encodeAndWriteHeaders still writing the header block. The
// observer binds the attempt only at END_HEADERS, so "no stream yet" is
// not proof. Two facts of golang.org/x/net/http2 (transport.go, v0.60.0)
// make it one:
//
//   - Only a context or Request.Cancel ending lets internalRoundTrip return
//     an error before the writeRequest goroutine is done: every other
//     error path waits for cs.donec (waitDone), closed last in
//     cleanupWriteRequest. So when the context is still live after
//     RoundTrip (and out.Cancel has not fired), the observer's facts are
//     final.
//   - Otherwise, the write barrier: every write x/net makes to the
//     connection after setup happens inside a cc.wmu section, and each
//     section flushes what it framed before releasing wmu. A header block
//     is one section, which checks cs.abort (closed by abortStream before
//     RoundTrip returns) under wmu before writing anything. So once the
//     observer sees a PING written after RoundTrip returned, every header
//     section of this attempt either finished before that PING's section
//     (its END_HEADERS observed and bound) or will find cs.abort closed
//     and write nothing. cc.Ping forces such a section. A connection
//     whose writes already failed writes no PING (x/net's error is
//     sticky) and cannot pass; nor can one past the bound.
//
// No wait happens on the success path, nor when no connection was picked.
func (e *Engine) neverLeft(ctx context.Context, out *http.Request, attemptID string, pc *pooledConn) (never, maybe bool) {
	f := e.obs.Stream(attemptID, pc.oc)
	if f.Streams > 0 || f.MappingLost {
		return false, false
	}
	if ctx.Err() == nil && !fired(out.Cancel) {
		return true, false
	}
	if !e.writeBarrier(pc) {
		return false, true
	}
	f = e.obs.Stream(attemptID, pc.oc)
	return f.Streams == 0 && !f.MappingLost, false
}

// maxBarrierWait bounds the write barrier; DialTimeout bounds it further.
const maxBarrierWait = 2 * time.Second

// writeBarrier sends a PING on pc and reports whether the observer saw an
// outgoing PING after the call began (see neverLeft for what that
// proves). Any PING counts, x/net's own included: each is written inside
// a wmu section.
func (e *Engine) writeBarrier(pc *pooledConn) bool {
	mark, changed := pc.oc.writeMark()
	ctx, cancel := context.WithTimeout(context.Background(), min(e.cfg.DialTimeout, maxBarrierWait))
	defer cancel()
	// Only the observer's count matters, not the ACK: Ping's result is
	// ignored, and cancel ends it once the barrier is decided.
	go func() { _ = pc.cc.Ping(ctx) }()
	for {
		select {
		case <-changed:
		case <-ctx.Done():
			pinged, _, _ := pc.oc.pingedSince(mark)
			return pinged
		}
		pinged, final, next := pc.oc.pingedSince(mark)
		switch {
		case pinged:
			return true
		case final:
			return false
		}
		changed = next
	}
}

// fired reports whether a Request.Cancel channel has been closed.
func fired(cancel <-chan struct{}) bool {
	select {
	case <-cancel:
		return true
	default:
		return false
	}
}

// rewind gives out a fresh body for another send, reporting false when the
// body cannot be replayed from the start.
func rewind(out *http.Request) bool {
	if out.Body == nil || out.Body == http.NoBody {
		return true
	}
	if out.GetBody == nil {
		return false
	}
	b, err := out.GetBody()
	if err != nil {
		return false
	}
	out.Body = b
	return true
}

// dial opens and wraps one connection.
func (e *Engine) dial(ctx context.Context, scheme, authority string, alpn []string, wake func()) (*pooledConn, error) {
	dctx, cancel := context.WithTimeout(ctx, e.cfg.DialTimeout)
	defer cancel()
	raw, err := e.cfg.DialContext(dctx, "tcp", authority)
	if err != nil {
		return nil, fmt.Errorf("recovery: dial %s: %w", authority, err)
	}
	conn := raw
	if scheme == "https" {
		tc := tls.Client(raw, e.tlsConfig(authority, alpn))
		if err := tc.HandshakeContext(dctx); err != nil {
			raw.Close()
			return nil, fmt.Errorf("recovery: TLS handshake with %s: %w", authority, err)
		}
		if tc.ConnectionState().NegotiatedProtocol != http2.NextProtoTLS {
			if len(alpn) > 1 {
				// Offered both: the server chose HTTP/1.1 (or, saying
				// nothing, implied it).
				return nil, errNegotiatedHTTP1{c: e.newH1Conn(raw, tc, authority)}
			}
			raw.Close()
			return nil, fmt.Errorf("%w: %s", ErrNoHTTP2, authority)
		}
		conn = tc
	}
	pc := &pooledConn{ref: e.proc + "-c" + strconv.FormatUint(e.seq.Add(1), 10), authority: authority, h2c: scheme == "http"}
	oc, outer := e.obs.wrap(conn, pc.ref, ConnHooks{
		GoAway: func(g evidence.GoAway) {
			pc.draining.Store(true)
			e.stats.goAway(g.Code)
			wake()
		},
		Lost: func() {
			pc.draining.Store(true)
			e.stats.observerLost.Add(1)
			wake()
		},
		Closed: wake,
		Dropped: func(frames int) {
			e.stats.dropped.Add(int64(frames))
		},
	})
	pc.oc = oc
	cc, err := e.h2.NewClientConn(outer)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("recovery: HTTP/2 setup with %s: %w", authority, err)
	}
	pc.cc = cc
	e.stats.connsOpened.Add(1)
	return pc, nil
}
