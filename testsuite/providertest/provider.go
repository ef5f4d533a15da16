package providertest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
)

const (
	// defaultMaxConcurrentStreams is what the provider advertises in
	// SETTINGS_MAX_CONCURRENT_STREAMS unless WithMaxConcurrentStreams says
	// otherwise. 250 is what several large providers advertise.
	defaultMaxConcurrentStreams = 250
	// defaultModel is the model name echoed in responses.
	defaultModel = "durallm-test"
	// handshakeTimeout bounds the TLS handshake and the wait for the client
	// preface, so a client that connects and says nothing cannot pin a
	// goroutine for longer.
	handshakeTimeout = 10 * time.Second
)

// Option configures a [Provider] in [NewProvider].
type Option func(*options)

type options struct {
	strictIdle        bool
	maxStreams        uint32
	model             string
	tlsAddr, h2cAddr  string
	h1Addr, h1TLSAddr string
	// The provider's own limits (limits.go); set: the option was given.
	rpm, tpm, concurrent          int
	rpmSet, tpmSet, concurrentSet bool
}

// WithHTTP1ListenAddrs sets the addresses of the cleartext HTTP/1.1 and
// the HTTP/1.1 TLS listeners. Default "127.0.0.1:0" for both.
func WithHTTP1ListenAddrs(plain, tlsAddr string) Option {
	return func(o *options) { o.h1Addr, o.h1TLSAddr = plain, tlsAddr }
}

// WithListenAddrs sets the addresses of the TLS and h2c listeners.
// Default "127.0.0.1:0" for both (loopback, a free port each). The
// certificate names only loopback addresses and "localhost", so a client
// elsewhere must use h2c or skip verification for the demo.
func WithListenAddrs(tlsAddr, h2cAddr string) Option {
	return func(o *options) { o.tlsAddr, o.h2cAddr = tlsAddr, h2cAddr }
}

// WithMaxConcurrentStreams sets the SETTINGS_MAX_CONCURRENT_STREAMS the
// provider advertises and enforces per connection; streams beyond it are
// refused with RST_STREAM REFUSED_STREAM. Default 250. Must be at least 1.
func WithMaxConcurrentStreams(n uint32) Option {
	return func(o *options) { o.maxStreams = n }
}

// WithStrictIdleStreams makes the HTTP/2 side treat a stream above the
// last-stream id of a GOAWAY it sent as never opened, as Go's HTTP/2
// server before Go 1.20 does (golang/go#55846), and with it Caddy 2.6 as
// Debian builds it: an RST_STREAM or a WINDOW_UPDATE for such a stream is
// then a connection error PROTOCOL_ERROR. The provider answers it with
// GOAWAY PROTOCOL_ERROR and closes the connection, ending every stream
// still in flight on it, those at or below the last-stream id included.
// DATA for such a stream is still discarded, as that server does. RFC
// 9113 section 6.8 lets a client treat those streams as never created,
// and a client that sends nothing for them keeps the streams below the
// boundary alive. Default off: such frames are ignored.
func WithStrictIdleStreams() Option {
	return func(o *options) { o.strictIdle = true }
}

// WithModel sets the model name echoed in every response's "model" field,
// whatever model the request named. Default "durallm-test". Must not be
// empty.
func WithModel(name string) Option {
	return func(o *options) { o.model = name }
}

// Request is what a [Provider.Script] function sees of a request, after
// its body has been read completely.
type Request struct {
	// ConnIndex is the 0-based index of the connection, in accept order
	// across all listeners.
	ConnIndex int
	// StreamID is the HTTP/2 stream the request arrived on, 0 over
	// HTTP/1.1.
	StreamID uint32
	// Proto is ProtoHTTP2 or ProtoHTTP11.
	Proto string
	// ConnRequest numbers the HTTP/1.1 requests of one connection from
	// 1 (2 and more: a kept-alive connection); 0 over HTTP/2.
	ConnRequest int
	// Path and Method are the :path and :method pseudo-headers.
	Path, Method string
	// IdempotencyKey is the idempotency-key header, AttemptID the
	// x-durallm-attempt header; empty when absent.
	IdempotencyKey, AttemptID string
	// Model and Stream come from the JSON body's "model" and "stream"
	// members; they are empty when the body is not JSON.
	Model  string
	Stream bool
	// Body is the complete request body. The function may keep it.
	Body []byte
	// Header holds every regular request header, keys in canonical form.
	Header http.Header

	// respID and callID are the ids of the answer and its tool call when
	// the provider stored the completion before answering (keep).
	respID, callID string
	// usage is the usage the behaviour reports, nil for the estimate.
	usage *Usage
	// store and metadata are the body's "store" and "metadata" members
	// (keep), read with Model and Stream in one pass over the body.
	store    bool
	metadata json.RawMessage
}

// Record is one request as the provider saw it, in [Provider.Received]
// and [Provider.Processed].
type Record struct {
	// ConnIndex is the 0-based index of the connection, in accept order.
	ConnIndex int
	// StreamID is the HTTP/2 stream the request arrived on, 0 over
	// HTTP/1.1.
	StreamID uint32
	// Proto is ProtoHTTP2 or ProtoHTTP11.
	Proto string
	// ConnRequest numbers the HTTP/1.1 requests of one connection from
	// 1; 0 over HTTP/2.
	ConnRequest int
	// Path is the :path pseudo-header.
	Path string
	// IdempotencyKey and AttemptID are the idempotency-key and
	// x-durallm-attempt headers.
	IdempotencyKey, AttemptID string
	// Model and Stream come from the JSON body; they stay empty until the
	// body has been read.
	Model  string
	Stream bool
	// Behavior is the [Behavior.String] of the behaviour the request got;
	// one of [BehaviorIgnored], [BehaviorOverLimit] or [BehaviorTooLarge]
	// if it got none; or "" while its body is still arriving, or if the
	// stream ended before the body was complete.
	Behavior string
}

// Provider is a fault-injecting HTTP/2 chat-completions server. Create one
// with [NewProvider] and stop it with [Provider.Close]. All methods are
// safe for concurrent use.
type Provider struct {
	model      string
	maxStreams uint32
	strictIdle bool // WithStrictIdleStreams

	tlsLn       net.Listener
	h2cLn       net.Listener
	h1Ln        net.Listener
	h1TLSLn     net.Listener
	serverTLS   *tls.Config
	serverTLS11 *tls.Config
	leaf        *x509.Certificate

	closing chan struct{} // closed by Close
	wg      sync.WaitGroup
	respSeq atomic.Uint64 // numbers response ids
	callSeq atomic.Uint64 // numbers tool call ids

	mu            sync.Mutex
	closed        bool
	raws          map[net.Conn]struct{} // every accepted socket, so Close can cut them all
	conns         map[*conn]struct{}    // connections past the HTTP/2 preface
	h1conns       map[*h1conn]struct{}  // HTTP/1.1 connections
	connsAccepted int
	queue         []Behavior
	def           Behavior
	script        func(Request) (Behavior, bool)
	received      []*Record // pointers: the read loop fills in body fields later
	processed     []Record
	stored        []StoredCompletion
	storeLag      time.Duration
	limits        *limiter
}

// NewProvider starts a provider listening on four fresh loopback ports
// (HTTP/2 over TLS, h2c, HTTP/1.1 cleartext and HTTP/1.1 over TLS) with a
// freshly generated certificate.
func NewProvider(opts ...Option) (*Provider, error) {
	o := options{maxStreams: defaultMaxConcurrentStreams, model: defaultModel, tlsAddr: "127.0.0.1:0", h2cAddr: "127.0.0.1:0", h1Addr: "127.0.0.1:0", h1TLSAddr: "127.0.0.1:0"}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.maxStreams == 0 {
		return nil, errors.New("providertest: WithMaxConcurrentStreams: must be at least 1")
	}
	if o.model == "" {
		return nil, errors.New("providertest: WithModel: empty model name")
	}
	if err := o.checkLimits(); err != nil {
		return nil, err
	}
	cert, leaf, err := newSelfSignedCert()
	if err != nil {
		return nil, err
	}
	tlsLn, err := net.Listen("tcp", o.tlsAddr)
	if err != nil {
		return nil, fmt.Errorf("providertest: listen (tls): %w", err)
	}
	h2cLn, err := net.Listen("tcp", o.h2cAddr)
	if err != nil {
		_ = tlsLn.Close()
		return nil, fmt.Errorf("providertest: listen (h2c): %w", err)
	}
	h1Ln, err := net.Listen("tcp", o.h1Addr)
	if err != nil {
		_ = tlsLn.Close()
		_ = h2cLn.Close()
		return nil, fmt.Errorf("providertest: listen (http/1.1): %w", err)
	}
	h1TLSLn, err := net.Listen("tcp", o.h1TLSAddr)
	if err != nil {
		_ = tlsLn.Close()
		_ = h2cLn.Close()
		_ = h1Ln.Close()
		return nil, fmt.Errorf("providertest: listen (http/1.1 tls): %w", err)
	}
	p := &Provider{
		model:      o.model,
		maxStreams: o.maxStreams,
		strictIdle: o.strictIdle,
		tlsLn:      tlsLn,
		h2cLn:      h2cLn,
		h1Ln:       h1Ln,
		h1TLSLn:    h1TLSLn,
		serverTLS: &tls.Config{
			Certificates: []tls.Certificate{cert},
			NextProtos:   []string{http2.NextProtoTLS},
			MinVersion:   tls.VersionTLS12,
		},
		serverTLS11: &tls.Config{
			Certificates: []tls.Certificate{cert},
			NextProtos:   []string{"http/1.1"},
			MinVersion:   tls.VersionTLS12,
		},
		leaf:    leaf,
		closing: make(chan struct{}),
		raws:    make(map[net.Conn]struct{}),
		conns:   make(map[*conn]struct{}),
		h1conns: make(map[*h1conn]struct{}),
		def:     Answer(defaultAnswer),
		limits:  newLimiter(o),
	}
	p.wg.Add(4)
	go p.acceptLoop(tlsLn, func(rc net.Conn, idx int) { p.serveConn(rc, idx, true) })
	go p.acceptLoop(h2cLn, func(rc net.Conn, idx int) { p.serveConn(rc, idx, false) })
	go p.acceptLoop(h1Ln, func(rc net.Conn, idx int) { p.serveHTTP1(rc, idx, false) })
	go p.acceptLoop(h1TLSLn, func(rc net.Conn, idx int) { p.serveHTTP1(rc, idx, true) })
	return p, nil
}

// URL returns the base URL of the TLS listener, "https://127.0.0.1:PORT".
func (p *Provider) URL() string { return "https://" + p.tlsLn.Addr().String() }

// H2CURL returns the base URL of the cleartext (h2c, prior knowledge)
// listener, "http://127.0.0.1:PORT".
func (p *Provider) H2CURL() string { return "http://" + p.h2cLn.Addr().String() }

// ClientTLSConfig returns a new TLS client configuration that trusts the
// provider's certificate, offers ALPN "h2" and verifies the name
// "127.0.0.1". Each call returns a fresh value the caller may modify.
func (p *Provider) ClientTLSConfig() *tls.Config {
	return &tls.Config{
		RootCAs:    p.CertPool(),
		NextProtos: []string{http2.NextProtoTLS},
		ServerName: "127.0.0.1",
		MinVersion: tls.VersionTLS12,
	}
}

// CertPool returns a new certificate pool holding only the provider's
// self-signed certificate.
func (p *Provider) CertPool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(p.leaf)
	return pool
}

// Close stops the provider: it closes both listeners and every connection
// abruptly (no GOAWAY), interrupts every delayed, held or stalled stream,
// and waits for all of the provider's goroutines to exit. It is safe to
// call more than once; later calls return nil. It must not be called from
// a [Provider.Script] function, which runs on a connection's goroutine.
func (p *Provider) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.closing)
	raws := make([]net.Conn, 0, len(p.raws))
	for rc := range p.raws {
		raws = append(raws, rc)
	}
	p.mu.Unlock()

	var errs []error
	for _, ln := range []net.Listener{p.tlsLn, p.h2cLn, p.h1Ln, p.h1TLSLn} {
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("providertest: close listener: %w", err))
		}
	}
	// Closing the sockets unblocks every read, write and handshake; each
	// connection's read loop then tears the connection down and wakes its
	// streams, so Wait below cannot hang on a stalled stream.
	for _, rc := range raws {
		_ = rc.Close()
	}
	p.wg.Wait()
	return errors.Join(errs...)
}

// Push appends behaviours to the FIFO queue. Each request that
// [Provider.Script] does not claim takes the next queued behaviour, in the
// order request bodies complete (on one connection, that is stream order
// for requests sent one after another).
func (p *Provider) Push(b ...Behavior) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.queue = append(p.queue, b...)
}

// SetDefault sets the behaviour used when the script does not claim a
// request and the queue is empty. Default Answer("ok").
func (p *Provider) SetDefault(b Behavior) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.def = b
}

// Script sets a function consulted first for every request; when it
// returns ok=false the queue, then the default, decide. nil removes it.
// Default: none.
//
// f runs on the connection's read goroutine, so it should return quickly;
// it may call any Provider method except Close.
func (p *Provider) Script(f func(Request) (Behavior, bool)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.script = f
}

// Drain gracefully drains every connection open at the time of the call:
// it sends GOAWAY with the given code and last-stream-id equal to the
// highest stream id the connection has accepted, lets the streams in
// flight finish, and then closes the connection. New streams the client
// opens on a draining connection are ignored. Connections accepted after
// Drain are served normally.
func (p *Provider) Drain(code http2.ErrCode) {
	for _, c := range p.openConns() {
		c.goAway(0, true, code, goAwayDebug)
		c.maybeClose()
	}
}

// Received returns a copy of every request whose headers the provider
// read, in arrival order, including requests it then ignored or refused
// (see [Record.Behavior]).
func (p *Provider) Received() []Record {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Record, len(p.received))
	for i, r := range p.received {
		out[i] = *r
	}
	return out
}

// Processed returns a copy of every request the provider executed, in the
// order execution started. A request is recorded when the provider starts
// to work on it, and only if its behaviour executes.
func (p *Provider) Processed() []Record {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Record(nil), p.processed...)
}

// ExecutedCount returns how many executed requests carried the given
// idempotency-key header.
func (p *Provider) ExecutedCount(idempotencyKey string) int {
	return p.countProcessed(func(r Record) bool { return r.IdempotencyKey == idempotencyKey })
}

// AttemptExecutions returns how many executed requests carried the given
// x-durallm-attempt header. More than one means a request was replayed
// under the same attempt id, for example by a transport's hidden retry.
func (p *Provider) AttemptExecutions(attemptID string) int {
	return p.countProcessed(func(r Record) bool { return r.AttemptID == attemptID })
}

func (p *Provider) countProcessed(match func(Record) bool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, r := range p.processed {
		if match(r) {
			n++
		}
	}
	return n
}

// ConnsAccepted returns how many TCP connections the provider has
// accepted on both listeners since it started. [Provider.Reset] does not
// change it.
func (p *Provider) ConnsAccepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.connsAccepted
}

// ConnsOpen returns how many HTTP/2 connections (past the preface) are
// currently open. Tests poll it to see a drained or cut connection go.
func (p *Provider) ConnsOpen() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// StreamsOpen returns how many streams are currently open across all
// connections: accepted and neither finished, reset nor abandoned. Tests
// poll it to see that a client reset reached a held or stalled stream.
func (p *Provider) StreamsOpen() int {
	n := 0
	for _, c := range p.openConns() {
		c.mu.Lock()
		n += len(c.streams)
		c.mu.Unlock()
	}
	return n
}

// Reset clears the records, the stored completions, the queue and the
// script. It keeps the default behaviour, the store lag, the connections
// and the accepted-connection count.
func (p *Provider) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.received = nil
	p.processed = nil
	p.stored = nil
	p.queue = nil
	p.script = nil
}

// take picks the behaviour for a request whose body is complete, after
// the provider's own limits: a request over one gets their 429 and takes
// nothing from the script or the queue. done ends the request's place
// among those in progress; call it when the behaviour has ended.
func (p *Provider) take(req *Request) (b Behavior, done func()) {
	done = func() {}
	if !isStoredList(*req) {
		var refusal *Behavior
		if refusal, done = p.limits.admit(*req); refusal != nil {
			return *refusal, func() {}
		}
	}
	b = p.next(*req)
	req.usage = b.usage
	return b, done
}

// next picks the behaviour for a request whose body is complete.
func (p *Provider) next(req Request) Behavior {
	p.mu.Lock()
	script := p.script
	p.mu.Unlock()
	// The script is user code: call it without p.mu so it may use the
	// Provider's other methods.
	if script != nil {
		if b, ok := script(req); ok {
			return b
		}
	}
	if isStoredList(req) {
		// A lookup of the store never takes a behaviour meant for a
		// model request.
		return ListStored()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.queue) > 0 {
		b := p.queue[0]
		p.queue[0] = Behavior{} // drop references held by the spent entry
		p.queue = p.queue[1:]
		return b
	}
	return p.def
}

// addReceived appends a record; the caller may keep updating it under
// p.mu through the pointer.
func (p *Provider) addReceived(r *Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.received = append(p.received, r)
}

// updateRecord applies f to r under p.mu.
func (p *Provider) updateRecord(r *Record, f func(*Record)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(r)
}

// addProcessed records r as executed.
func (p *Provider) addProcessed(r *Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.processed = append(p.processed, *r)
}

// openConns snapshots the registered connections.
func (p *Provider) openConns() []*conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		out = append(out, c)
	}
	return out
}

// addConn registers c for Drain and the counters; it fails once Close has
// begun, so a late connection cannot escape Close.
func (p *Provider) addConn(c *conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Provider) removeConn(c *conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// acceptLoop accepts connections on ln until Close closes it.
func (p *Provider) acceptLoop(ln net.Listener, serve func(rc net.Conn, idx int)) {
	defer p.wg.Done()
	var backoff time.Duration
	for {
		rc, err := ln.Accept()
		if err != nil {
			select {
			case <-p.closing:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Transient failures (for example EMFILE) must not end the
			// listener; back off like net/http does, but wake for Close.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-p.closing:
				t.Stop()
				return
			}
			continue
		}
		backoff = 0
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = rc.Close()
			return
		}
		idx := p.connsAccepted
		p.connsAccepted++
		p.raws[rc] = struct{}{}
		// Add while holding our own count, so Close's Wait cannot have
		// observed zero.
		p.wg.Add(1)
		p.mu.Unlock()
		go serve(rc, idx)
	}
}

// serveConn runs one accepted socket to completion.
func (p *Provider) serveConn(rc net.Conn, idx int, useTLS bool) {
	defer p.wg.Done()
	defer p.forget(rc)
	var nc net.Conn = rc
	var tc *tls.Conn
	if useTLS {
		var err error
		if tc, err = handshake(rc, p.serverTLS); err != nil {
			return
		}
		// RFC 9113 §3.2: over TLS, HTTP/2 is selected by ALPN only.
		if tc.ConnectionState().NegotiatedProtocol != http2.NextProtoTLS {
			return
		}
		nc = tc
	}
	newConn(p, idx, rc, tc, nc).serve()
}

// forget closes an accepted socket and drops it from the set Close cuts.
func (p *Provider) forget(rc net.Conn) {
	p.mu.Lock()
	delete(p.raws, rc)
	p.mu.Unlock()
	_ = rc.Close()
}

// handshake makes the server side of a TLS handshake, bounded by
// handshakeTimeout.
func handshake(rc net.Conn, cfg *tls.Config) (*tls.Conn, error) {
	tc := tls.Server(rc, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
	defer cancel()
	return tc, tc.HandshakeContext(ctx)
}
