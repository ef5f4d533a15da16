package recovery

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/durallm/durallm/evidence"
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
		a.unsendable(evidence.UnsendableRoute)
		a.settle(ctx, nil, auto)
		return nil, fmt.Errorf("%w %q", ErrUnsupportedScheme, scheme)
	}
	if field, ok := validIdentity(a.spec); !ok {
		// x/net would refuse the header on every attempt, so retrying can
		// never help: the request is wrong.
		a.unsendable(evidence.UnsendableInvalid)
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
	return e.roundTripHTTP2(ctx, a, out, version, scheme, authority, auto)
}

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

func authorityOf(scheme, host string) string {
	if _, _, err := net.SplitHostPort(host); err == nil {
		return host
	}
	if scheme == "http" {
		return net.JoinHostPort(host, "80")
	}
	return net.JoinHostPort(host, "443")
}
