package recovery

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
)

// Config configures an Engine. The zero value is a TLS-only engine with the
// documented defaults.
type Config struct {
	// TLSClientConfig is used for https URLs. Nil means the system roots.
	// NextProtos is always replaced by what the request's HTTPVersion
	// asks for: ["h2", "http/1.1"] for auto, ["h2"] for 2, ["http/1.1"]
	// for 1.1. Verification stays on unless the config itself turns it
	// off.
	TLSClientConfig *tls.Config
	// AllowH2C makes an http URL sent as HTTPVersionAuto cleartext HTTP/2
	// with prior knowledge (RFC 9113 section 3.3) instead of HTTP/1.1. A
	// request that asks for HTTPVersion2 gets h2c whatever it says. Default
	// false: http URLs speak HTTP/1.1, as local model servers do.
	AllowH2C bool
	// HTTP1IdleTimeout closes an idle HTTP/1.1 connection after this long,
	// so that the engine, not the server, ends an idle keep-alive
	// connection: keep it below the server's keep-alive timeout. Zero
	// means DefaultHTTP1IdleTimeout (4s); negative disables keep-alive
	// (a new connection per request).
	HTTP1IdleTimeout time.Duration
	// MaxIdleHTTP1PerAuthority bounds the idle HTTP/1.1 connections kept
	// per scheme and host:port. HTTP/1.1 connections in use are not
	// bounded (each carries one request). Zero means 16.
	MaxIdleHTTP1PerAuthority int
	// MaxConnsPerAuthority bounds live connections (not draining) plus
	// dials in progress per host:port. Zero means 4.
	MaxConnsPerAuthority int
	// DialTimeout bounds TCP connect plus TLS handshake. Zero means 10s.
	DialTimeout time.Duration
	// ReadIdleTimeout sends a health-check PING after this long without a
	// frame. Zero means 30s; negative disables it.
	ReadIdleTimeout time.Duration
	// IdleConnTimeout closes a connection with no streams after this long.
	// Zero means 90s.
	IdleConnTimeout time.Duration
	// DialContext dials TCP. Nil means a net.Dialer.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// Logger receives one "llm.attempt" event per finished attempt. Nil
	// means slog.Default().
	Logger *slog.Logger
}

// ErrNoHTTP2 is returned when a TLS server does not negotiate h2 by ALPN
// for a request that asked for HTTPVersion2.
var ErrNoHTTP2 = errors.New(`recovery: server did not negotiate HTTP/2 (ALPN h2); it speaks HTTP/1.1: set the route's http_version to "1.1" or "auto"`)

// ErrSpeaksHTTP1 wraps the error of an HTTP/2 attempt whose server turned
// out to speak HTTP/1.1 (Evidence.ProtocolMismatch): a configuration
// error, named with its fix.
var ErrSpeaksHTTP1 = errors.New(`recovery: the server speaks HTTP/1.1, not HTTP/2: set the route's http_version to "1.1" (or "auto" without --allow-h2c)`)

// ErrNotHTTP2 wraps the error of an h2c attempt whose server closed the
// connection without a byte of HTTP/2.
var ErrNotHTTP2 = errors.New(`recovery: the server closed the connection without speaking HTTP/2: if it speaks HTTP/1.1, set the route's http_version to "1.1"`)

// ErrSpeaksOnlyHTTP2 wraps the error of an HTTP/1.1 attempt whose server
// answered with an HTTP/2 frame: an h2c-only server.
var ErrSpeaksOnlyHTTP2 = errors.New(`recovery: the server speaks only cleartext HTTP/2 (h2c): set the route's http_version to "2"`)

// ErrTimedOut marks a context cancellation as a timeout rather than the
// caller's scope ending. A caller's timer (first-byte, idle) cancels the
// request's context with a cause that wraps ErrTimedOut
// (context.WithCancelCause); a deadline counts as a timeout by itself. Any
// other cancellation is recorded as Evidence.Canceled.
var ErrTimedOut = errors.New("recovery: attempt timed out")

// ErrUnsendable is returned, before anything is sent, for a request the
// engine can never send as it is (an idempotency key or attempt id that is
// not a valid header value). Its evidence says Unsendable.
var ErrUnsendable = errors.New("recovery: request cannot be sent")

// validIdentity checks the two header values the engine adds, naming the
// first bad one (never its value, which may be anything).
func validIdentity(s Spec) (field string, ok bool) {
	switch {
	case !httpguts.ValidHeaderFieldValue(s.AttemptID):
		return "the attempt id", false
	case !httpguts.ValidHeaderFieldValue(s.IdempotencyKey):
		return "the idempotency key", false
	}
	return "", true
}

// ErrUnsupportedScheme is returned for a URL the engine cannot speak.
var ErrUnsupportedScheme = errors.New("recovery: unsupported URL scheme")

// Engine is an http.RoundTripper that sends each request exactly once over
// a pool of HTTP/2 connections it owns, and records the attempt's Evidence.
// It never retries: see the package doc.
//
// An Engine is safe for concurrent use. Close it to release connections.
type Engine struct {
	cfg  Config
	h2   *http2.Transport
	obs  *Observer
	pool *pool
	h1   *h1Pool
	// http1At remembers, per scheme and authority, that an auto request
	// found HTTP/1.1 there (ALPN chose it, or the server answered the h2c
	// preface in HTTP/1.1), so later auto requests go straight to it.
	// Keyed without building a string, since every request looks.
	http1Mu sync.RWMutex
	http1At map[[2]string]bool
	logger  *slog.Logger
	proc    string // random tag that makes connection refs unique across engines and processes (newProcTag)
	seq     atomic.Uint64
	stats   stats
}

// New returns an Engine for cfg.
func New(cfg Config) *Engine {
	if cfg.MaxConnsPerAuthority <= 0 {
		cfg.MaxConnsPerAuthority = 4
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	switch {
	case cfg.ReadIdleTimeout == 0:
		cfg.ReadIdleTimeout = 30 * time.Second
	case cfg.ReadIdleTimeout < 0:
		cfg.ReadIdleTimeout = 0
	}
	if cfg.IdleConnTimeout <= 0 {
		cfg.IdleConnTimeout = 90 * time.Second
	}
	if cfg.DialContext == nil {
		cfg.DialContext = (&net.Dialer{}).DialContext
	}
	if cfg.HTTP1IdleTimeout == 0 {
		cfg.HTTP1IdleTimeout = DefaultHTTP1IdleTimeout
	}
	if cfg.MaxIdleHTTP1PerAuthority <= 0 {
		cfg.MaxIdleHTTP1PerAuthority = 16
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	e := &Engine{
		cfg: cfg,
		// The Transport is only a factory for ClientConns here: the engine
		// never calls its RoundTrip, whose retry loop is the hidden replay.
		h2: &http2.Transport{
			ReadIdleTimeout:    cfg.ReadIdleTimeout,
			IdleConnTimeout:    cfg.IdleConnTimeout,
			AllowHTTP:          cfg.AllowH2C,
			DisableCompression: true,
		},
		obs:    NewObserver(),
		logger: logger,
		proc:   newProcTag(),
	}
	e.pool = newPool(cfg.MaxConnsPerAuthority, e.dial)
	e.h1 = &h1Pool{idleTimeout: cfg.HTTP1IdleTimeout, maxIdle: cfg.MaxIdleHTTP1PerAuthority, stats: &e.stats, idle: map[string][]*h1Conn{}}
	return e
}

// newProcTag returns the per-engine part of connection refs: 64 random
// bits as 16 hex digits, so refs such as "7f3a9c01d2e4b5a6-c12" stay
// unique across a fleet of workers (with 16 bits, a few hundred engines
// already share one). crypto/rand never fails on supported platforms.
func newProcTag() string {
	var tag [8]byte
	_, _ = rand.Read(tag[:])
	return hex.EncodeToString(tag[:])
}

// Close closes every connection. In-flight requests fail.
func (e *Engine) Close() error {
	e.pool.closeAllConns()
	e.h1.closeAll()
	return nil
}

// RoundTrip sends req once. The attempt it belongs to comes from the
// request's context (WithAttempt); a request without one gets an attempt of
// its own that is finished, classified and logged when its body ends.
//
// RoundTrip does not modify req: it sends a copy carrying HeaderAttemptID.
// A returned error wraps the transport's error with %w; the attempt's
// Evidence, not the error, says what happened.
func (e *Engine) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	a := AttemptFrom(ctx)
	auto := a == nil
	if auto {
		a = NewAttempt(Spec{})
	}
	scheme := req.URL.Scheme
	authority := authorityOf(req.URL.Scheme, req.URL.Host)
	if err := a.begin(e, authority); err != nil {
		return nil, err
	}
	if scheme != "https" && scheme != "http" {
		a.unsendable(UnsendableRoute)
		a.settle(ctx, nil, auto)
		return nil, fmt.Errorf("%w %q", ErrUnsupportedScheme, scheme)
	}
	if field, ok := validIdentity(a.spec); !ok {
		// x/net would refuse the header on every attempt, so retrying can
		// never help: the request is wrong.
		a.unsendable(UnsendableInvalid)
		a.settle(ctx, nil, auto)
		return nil, fmt.Errorf("%w: %s is not a valid HTTP header value", ErrUnsendable, field)
	}

	out := new(http.Request)
	*out = *req
	out.Header = sendHeader(req.Header, a.spec.AttemptID, a.spec.IdempotencyKey)

	version := versionFrom(ctx)
	if e.useHTTP1(version, scheme, authority) {
		return e.roundTripHTTP1(ctx, a, out, scheme, authority, auto, nil)
	}
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
				a.mismatch(MismatchHTTP11)
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
		case MismatchHTTP11:
			err = fmt.Errorf("%w (%w)", ErrSpeaksHTTP1, err)
		case MismatchNotHTTP2:
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

// sendHeader returns the header an attempt sends: a copy of h (which is
// not modified) with HeaderAttemptID set to attemptID and, when key is
// not empty and h carries no Idempotency-Key value, HeaderIdempotencyKey
// set to key. That is h.Clone() followed by Set, built with room for the
// two values: Clone sizes the map and the shared values array for h
// alone, so each Set then allocated again (a []string, and a bigger map
// when h's was full), on every request.
func sendHeader(h http.Header, attemptID, key string) http.Header {
	nv := 2
	for _, vv := range h {
		nv += len(vv)
	}
	sv := make([]string, nv) // shared backing array, as in Clone
	out := make(http.Header, len(h)+2)
	for k, vv := range h {
		if vv == nil {
			// Preserved as Clone does.
			out[k] = nil
			continue
		}
		n := copy(sv, vv)
		out[k] = sv[:n:n]
		sv = sv[n:]
	}
	// Both names are canonical, so indexing is what Set and Get do.
	sv[0] = attemptID
	out[HeaderAttemptID] = sv[0:1:1]
	if vv := out[HeaderIdempotencyKey]; key != "" && (len(vv) == 0 || vv[0] == "") {
		sv[1] = key
		out[HeaderIdempotencyKey] = sv[1:2:2]
	}
	return out
}

// useHTTP1 decides the protocol of a request before any connection is
// picked (Config.AllowH2C and HTTPVersion say how). An auto request over
// TLS goes to HTTP/2 first, where ALPN decides, unless this authority has
// already answered in HTTP/1.1.
func (e *Engine) useHTTP1(v HTTPVersion, scheme, authority string) bool {
	switch v {
	case HTTPVersion11:
		return true
	case HTTPVersion2:
		return false
	}
	e.http1Mu.RLock()
	learned := e.http1At[[2]string{scheme, authority}]
	e.http1Mu.RUnlock()
	return learned || (scheme == "http" && !e.cfg.AllowH2C)
}

// learnHTTP1 records that auto requests to authority speak HTTP/1.1.
func (e *Engine) learnHTTP1(scheme, authority string) {
	e.http1Mu.Lock()
	if e.http1At == nil {
		e.http1At = make(map[[2]string]bool)
	}
	e.http1At[[2]string{scheme, authority}] = true
	e.http1Mu.Unlock()
}

// unlearnHTTP1 takes it back: an auto request sent as HTTP/1.1 there was
// answered in HTTP/2, so the next one tries HTTP/2 again.
func (e *Engine) unlearnHTTP1(scheme, authority string) {
	e.http1Mu.Lock()
	delete(e.http1At, [2]string{scheme, authority})
	e.http1Mu.Unlock()
}

// The ALPN offers of an HTTP/2 dial: auto also offers http/1.1, so that a
// server that speaks only HTTP/1.1 can say so.
var (
	alpnH2   = []string{http2.NextProtoTLS}
	alpnAuto = []string{http2.NextProtoTLS, "http/1.1"}
)

// tlsConfig is the client TLS config for authority, offering protos.
func (e *Engine) tlsConfig(authority string, protos []string) *tls.Config {
	cfg := e.cfg.TLSClientConfig.Clone()
	if cfg == nil {
		cfg = &tls.Config{}
	}
	cfg.NextProtos = protos
	if cfg.ServerName == "" {
		host, _, _ := net.SplitHostPort(authority)
		cfg.ServerName = host
	}
	return cfg
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

// AttemptError is the error RoundTrip returns. It names the attempt and
// wraps the transport's error; classify by the attempt's Evidence, not by
// this error.
type AttemptError struct {
	AttemptID string
	Err       error
}

// Error describes the failure without GOAWAY debug data: x/net's
// GoAwayError prints the peer's debug bytes, which the contract keeps out
// of every error message (docs/contract.md section 7).
func (e *AttemptError) Error() string {
	var ga http2.GoAwayError
	if errors.As(e.Err, &ga) {
		return fmt.Sprintf("recovery: attempt %s: server sent GOAWAY (last stream %d, %s)", e.AttemptID, ga.LastStreamID, ErrCode(ga.ErrCode))
	}
	return "recovery: attempt " + e.AttemptID + ": " + e.Err.Error()
}

func (e *AttemptError) Unwrap() error { return e.Err }

func authorityOf(scheme, host string) string {
	if _, _, err := net.SplitHostPort(host); err == nil {
		return host
	}
	if scheme == "http" {
		return net.JoinHostPort(host, "80")
	}
	return net.JoinHostPort(host, "443")
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
		GoAway: func(g GoAway) {
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

// Spec identifies one attempt and says how it must be sent.
type Spec struct {
	// ActionRef names the user action the attempt belongs to.
	ActionRef string
	// Attempt is the attempt's number within its action, from 1.
	Attempt int
	// AttemptID is sent as HeaderAttemptID and maps the request to its
	// stream. Empty means a random id.
	AttemptID string
	// IdempotencyKey is the action's key, sent as HeaderIdempotencyKey
	// unless the request already carries one.
	IdempotencyKey string
	// Route names the configured route the attempt uses.
	Route string
	// Provider and Model name the provider kind and model behind the
	// route, for the attempt's event and metrics (never content).
	Provider, Model string
	// Avoid lists connection refs the attempt must not use (those of
	// earlier attempts that saw GOAWAY or 421).
	Avoid []string
	// FreshConnection demands a newly dialed connection (the retry of a
	// 421).
	FreshConnection bool
	// AfterMisdirected says an earlier attempt of the same action got a
	// 421, on any route, so this attempt's 421 is misdirected_repeated.
	AfterMisdirected bool
	// Intermediary says the route reaches the provider through a proxy or
	// gateway whose RST_STREAM(REFUSED_STREAM) does not prove the origin
	// never ran the request (haproxy sends it when the origin fails after
	// the request was forwarded), nor does a 502 it generated itself (Caddy
	// answers one when a reload cuts a request it already forwarded), so
	// Classify treats both as ambiguous. A GOAWAY's last-stream id still
	// proves non-processing: it is the intermediary's own promise about
	// streams it never forwarded.
	Intermediary bool
	// HonoursIdempotencyKey says the route's provider deduplicates
	// requests by Idempotency-Key (the route's honours_idempotency_key),
	// so an intermediary's 502 on it stays retryable: a second attempt
	// carries the same key.
	HonoursIdempotencyKey bool
	// DeferEvent says the caller emits the attempt's "llm.attempt" event
	// itself (with LogAttempt), once the attempt's record is final. The
	// workflow does, after it has decided what comes next, so the event
	// says exactly what history says. False means Finish emits it.
	DeferEvent bool
	// ManualCommit says the caller decides when content has started
	// (Attempt.Commit), for bodies whose first bytes are not content, such
	// as server-sent-event keep-alives. False means the first body byte of
	// a 2xx response commits.
	ManualCommit bool
}

// Attempt collects the evidence of one request sent through an Engine.
// Create it with NewAttempt, put it in the request's context with
// WithAttempt, send the request once, read or close the body, then call
// Finish. An Attempt is safe for concurrent use; it must not be used for
// more than one request.
type Attempt struct {
	spec  Spec
	start time.Time

	mu     sync.Mutex
	engine *Engine
	conn   *pooledConn
	http1  bool // sent over HTTP/1.1: the engine recorded the wire facts itself
	// h1 and h1Written0 are the HTTP/1.1 connection's counter and its
	// value when the attempt took the connection, so OnTheWire can read
	// the bytes written while the exchange runs.
	h1         *countConn
	h1Written0 int64
	ev         Evidence
	settled    bool
	finished   bool
	class      Classification

	// tracker is the observer's record of the attempt's streams, kept
	// here so tracking it allocates nothing (Observer.track); only the
	// observer touches it, under its own lock.
	tracker tracker
}

// NewAttempt returns an attempt for spec, giving it a random AttemptID when
// it has none.
func NewAttempt(spec Spec) *Attempt {
	if spec.AttemptID == "" {
		// Built in one allocation: the prefix (17 bytes) and a base-36
		// uint64 (at most 13) fit the stack buffer.
		var buf [32]byte
		id := strconv.AppendUint(append(buf[:0], attemptIDPrefix...), attemptSeq.Add(1), 36)
		spec.AttemptID = string(id)
	}
	spec.Avoid = append([]string(nil), spec.Avoid...)
	return &Attempt{spec: spec, ev: Evidence{
		ActionRef: spec.ActionRef, Attempt: spec.Attempt, AttemptID: spec.AttemptID,
		Route: spec.Route, Provider: spec.Provider, Model: spec.Model, AfterMisdirected: spec.AfterMisdirected, Intermediary: spec.Intermediary,
		HonoursIdempotencyKey: spec.HonoursIdempotencyKey,
	}}
}

// Generated attempt ids are a random per-process prefix and a counter:
// unique across processes without a random read per attempt.
var (
	attemptIDPrefix = func() string {
		var b [8]byte
		_, _ = rand.Read(b[:])
		return hex.EncodeToString(b[:]) + "-"
	}()
	attemptSeq atomic.Uint64
)

type attemptKey struct{}

// WithAttempt returns a context that makes the Engine record the request
// sent with it as attempt a.
func WithAttempt(ctx context.Context, a *Attempt) context.Context {
	return context.WithValue(ctx, attemptKey{}, a)
}

// AttemptFrom returns the attempt carried by ctx, or nil.
func AttemptFrom(ctx context.Context) *Attempt {
	a, _ := ctx.Value(attemptKey{}).(*Attempt)
	return a
}

// ErrAttemptReused is returned when one Attempt is sent twice.
var ErrAttemptReused = errors.New("recovery: an Attempt carries one request; create a new one per attempt")

// ID returns the attempt id sent as HeaderAttemptID.
func (a *Attempt) ID() string { return a.spec.AttemptID }

func (a *Attempt) begin(e *Engine, authority string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.engine != nil {
		return ErrAttemptReused
	}
	a.engine, a.start = e, time.Now()
	a.ev.Authority = authority
	return nil
}

func (a *Attempt) unsendable(u Unsendable) {
	a.mu.Lock()
	a.ev.Unsendable = u
	a.mu.Unlock()
}

func (a *Attempt) useConn(pc *pooledConn, dialed bool) {
	a.mu.Lock()
	a.conn = pc
	a.ev.ConnRef, a.ev.ConnFresh, a.ev.HTTPVersion = pc.ref, dialed, protoHTTP2
	a.mu.Unlock()
}

func (a *Attempt) connUsed() *pooledConn {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.conn
}

func (a *Attempt) dialFailed(ctx context.Context) {
	a.mu.Lock()
	// A dial abandoned because the scope ended is a cancellation, not a
	// connection failure: settle records which.
	if ctx.Err() == nil {
		a.ev.DialFailed = true
	}
	a.mu.Unlock()
}

// maybeSent records that the request may have left (Evidence.MaybeSent).
func (a *Attempt) maybeSent() {
	a.mu.Lock()
	a.ev.MaybeSent = true
	a.mu.Unlock()
}

func (a *Attempt) response(resp *http.Response) {
	var ra time.Duration
	var ok bool
	// ParseRetryAfter reports nothing for a response with neither header
	// (the canonical spellings are the ones it reads), so the common case
	// skips its lookups and the clock read.
	if len(resp.Header["Retry-After"]) > 0 || len(resp.Header["Retry-After-Ms"]) > 0 {
		ra, ok = ParseRetryAfter(resp.Header, time.Now())
	}
	a.mu.Lock()
	a.ev.Status = resp.StatusCode
	if ok {
		a.ev.RetryAfter = ra
	}
	a.mu.Unlock()
}

// delivered counts body bytes that reached the caller.
func (a *Attempt) delivered(n int) {
	a.mu.Lock()
	a.ev.ResponseBytes += int64(n)
	if !a.spec.ManualCommit {
		a.commitLocked()
	}
	a.mu.Unlock()
}

// Commit marks the commit boundary: content of a 2xx response has reached
// the caller, so the attempt can no longer be restarted invisibly. Only
// needed with Spec.ManualCommit. A nil Attempt ignores it, so provider code
// can call AttemptFrom(ctx).Commit() whether or not an attempt is tracked.
func (a *Attempt) Commit() {
	if a == nil {
		return
	}
	a.mu.Lock()
	a.commitLocked()
	a.mu.Unlock()
}

// ProviderError records that the body of the attempt's HTTP error status
// is the provider's own error object, in its dialect's shape
// (Evidence.ProviderError): the provider answered, not an intermediary in
// front of it. A nil Attempt ignores it, as Commit does.
func (a *Attempt) ProviderError() {
	if a == nil {
		return
	}
	a.mu.Lock()
	a.ev.ProviderError = true
	a.mu.Unlock()
}

func (a *Attempt) commitLocked() {
	if a.ev.ContentStarted || a.ev.Status < 200 || a.ev.Status > 299 {
		return
	}
	a.ev.ContentStarted = true
	a.ev.FirstByte = time.Since(a.start)
}

// settle ends the HTTP exchange: it records how it ended, takes the
// frame observer's facts and stops tracking. err is the transport or body
// error, nil for a clean end. When auto is set the attempt is also
// finished (classified and logged).
func (a *Attempt) settle(ctx context.Context, err error, auto bool) {
	a.mu.Lock()
	if a.settled {
		a.mu.Unlock()
		return
	}
	a.settled = true
	if err != nil || ctx.Err() != nil {
		switch cause := context.Cause(ctx); {
		case cause == nil:
			a.ev.BodyFailed = a.ev.Status != 0 && err != nil
		case errors.Is(cause, context.DeadlineExceeded) || errors.Is(cause, ErrTimedOut):
			// A deadline, or a timer of the caller's (first-byte, idle)
			// that canceled with a cause wrapping ErrTimedOut.
			a.ev.TimedOut = true
			a.ev.BodyFailed = a.ev.Status != 0 && err != nil
		default:
			// Anything else that ends the context is the scope ending:
			// the caller canceled (with or without a cause of its own,
			// such as Temporal's activity cancellation).
			a.ev.Canceled = true
		}
	}
	if e := a.engine; e != nil && !a.http1 {
		var oc *ObservedConn
		if a.conn != nil {
			oc = a.conn.oc
		}
		f := e.obs.final(a.spec.AttemptID, oc)
		if f.ConnRef != "" {
			a.ev.ConnRef = f.ConnRef
		}
		a.ev.StreamID, a.ev.RequestSent = f.StreamID, f.Streams > 0
		// HEADERS bound after the barrier gave up settle the question.
		a.ev.MaybeSent = a.ev.MaybeSent && !a.ev.RequestSent
		a.ev.TransportReplays = max(f.Streams-1, 0)
		a.ev.RequestBytes, a.ev.ResponseHeaders = f.RequestBytes, f.ResponseHeaders
		a.ev.RSTStream, a.ev.GoAway = f.RSTStream, f.GoAway
		a.ev.ConnClosed, a.ev.MappingLost = f.ConnClosed, f.MappingLost
		a.ev.SentAfterGoAway = f.SentAfterGoAway
		if a.ev.Status == 0 && a.ev.ProtocolMismatch == "" {
			switch {
			case f.AnsweredHTTP1:
				a.ev.ProtocolMismatch = MismatchHTTP11
			case f.ServerSilent && a.conn != nil && a.conn.h2c:
				// With prior knowledge nothing negotiated HTTP/2; a
				// server that does speak it sends SETTINGS first.
				a.ev.ProtocolMismatch = MismatchNotHTTP2
			}
		}
		if a.ev.TransportReplays > 0 {
			e.stats.replays.Add(int64(a.ev.TransportReplays))
		}
	}
	if !a.start.IsZero() {
		a.ev.Elapsed = time.Since(a.start)
	}
	a.mu.Unlock()
	if auto {
		a.Finish(SignalNone)
	}
}

// OnTheWire reports whether the request's HEADERS have been written
// (over HTTP/1.1, any byte of the request). Evidence carries the wire
// facts only once the exchange ends; this reads them while it runs (the
// attempt journal's sent record needs that).
func (a *Attempt) OnTheWire() bool {
	a.mu.Lock()
	e, settled, sent := a.engine, a.settled, a.ev.RequestSent
	h1, w0 := a.h1, a.h1Written0
	a.mu.Unlock()
	switch {
	case settled || e == nil:
		return sent
	case h1 != nil:
		// The connection carries this attempt alone until it settles.
		return h1.written.Load() > w0
	}
	return e.obs.Stream(a.spec.AttemptID, nil).Streams > 0
}

// Evidence returns a snapshot of what is known of the attempt so far.
// Until the exchange ends (the body is read to its end, fails or is
// closed) the frame facts are not yet included.
func (a *Attempt) Evidence() Evidence {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ev
}

// Finish ends the attempt with only the provider layer's signal (what the
// body said that the wire could not); see FinishWith.
func (a *Attempt) Finish(sig Signal) (Evidence, Classification) {
	return a.FinishWith(Facts{Signal: sig})
}

// FinishWith ends the attempt: it adds the facts the layers above know
// (the body's signal, why the context ended, a request refused before
// sending), classifies the evidence, emits the attempt's one
// "llm.attempt" log event (unless Spec.DeferEvent) and returns both. Only
// the first call classifies and logs; later calls return the same result.
// FinishWith settles the exchange if that has not happened, so call it
// after the body is consumed.
func (a *Attempt) FinishWith(f Facts) (Evidence, Classification) {
	a.mu.Lock()
	settled := a.settled
	a.mu.Unlock()
	if !settled {
		a.settle(context.Background(), nil, false)
	}
	a.mu.Lock()
	if a.finished {
		defer a.mu.Unlock()
		return a.ev, a.class
	}
	a.finished = true
	a.ev.Signal, a.ev.Stop = f.Signal, f.Stop
	if f.Unsendable != "" && !a.ev.RequestSent && !a.ev.MaybeSent {
		a.ev.Unsendable = f.Unsendable
	}
	if !a.ev.Canceled {
		// A stop cause says why the context ended; it means nothing for an
		// exchange that ended first.
		a.ev.Stop = ""
	}
	a.class = Classify(a.ev)
	ev, c, e := a.ev, a.class, a.engine
	a.mu.Unlock()
	logger := slog.Default()
	if e != nil {
		logger = e.logger
		e.stats.classified(c.Class)
	}
	if !a.spec.DeferEvent {
		LogAttempt(context.Background(), logger, ev, c)
	}
	return ev, c
}

// body wraps a response body to find the commit boundary and the end of
// the exchange.
type body struct {
	rc   io.ReadCloser
	a    *Attempt
	ctx  context.Context
	auto bool
	// At the end, an HTTP/2 body returns pc to pool; an HTTP/1.1 body
	// calls release. The HTTP/2 path names the connection instead of
	// capturing it in a closure: one allocation less per request.
	pool    *pool
	pc      *pooledConn
	release func()
	once    sync.Once
}

// Read returns io.EOF bare (readers compare it with ==) and any other
// error as an *AttemptError: x/net's GoAwayError prints the peer's debug
// data, and a body read fails with it when a GOAWAY and a close cut the
// response, so a read error is sanitized like RoundTrip's.
func (b *body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 {
		b.a.delivered(n)
	}
	switch {
	case err == io.EOF:
		b.end(nil)
	case err != nil:
		b.end(err)
		err = &AttemptError{AttemptID: b.a.spec.AttemptID, Err: err}
	}
	return n, err
}

// Close ends the exchange. Closing before the end is the caller's choice,
// not a failure of the stream.
func (b *body) Close() error {
	err := b.rc.Close()
	b.end(nil)
	return err
}

func (b *body) end(err error) {
	b.once.Do(func() {
		b.a.settle(b.ctx, err, b.auto)
		if b.release != nil {
			b.release()
		} else {
			b.pool.release(b.pc)
		}
	})
}
