package recovery

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/durallm/durallm/evidence"
)

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
	ev         evidence.Evidence
	settled    bool
	finished   bool
	class      evidence.Classification

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
	return &Attempt{spec: spec, ev: evidence.Evidence{
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

func (a *Attempt) unsendable(u evidence.Unsendable) {
	a.mu.Lock()
	a.ev.Unsendable = u
	a.mu.Unlock()
}

func (a *Attempt) useConn(pc *pooledConn, dialed bool) {
	a.mu.Lock()
	a.conn = pc
	a.ev.ConnRef, a.ev.ConnFresh, a.ev.HTTPVersion = pc.ref, dialed, evidence.ProtoHTTP2
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
				a.ev.ProtocolMismatch = evidence.MismatchHTTP11
			case f.ServerSilent && a.conn != nil && a.conn.h2c:
				// With prior knowledge nothing negotiated HTTP/2; a
				// server that does speak it sends SETTINGS first.
				a.ev.ProtocolMismatch = evidence.MismatchNotHTTP2
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
		a.Finish(evidence.SignalNone)
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
func (a *Attempt) Evidence() evidence.Evidence {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ev
}

// EndBeforeSend settles an attempt whose request never went to the
// engine because ctx ended first (it was waiting for room under a
// route's fleet-wide limits): the evidence records why ctx ended, as a
// send cut short would, and that nothing was sent. Call FinishWith
// after it.
func (a *Attempt) EndBeforeSend(ctx context.Context) {
	a.settle(ctx, context.Cause(ctx), false)
}

// Finish ends the attempt with only the provider layer's signal (what the
// body said that the wire could not); see FinishWith.
func (a *Attempt) Finish(sig evidence.Signal) (evidence.Evidence, evidence.Classification) {
	return a.FinishWith(evidence.Facts{Signal: sig})
}

// FinishWith ends the attempt: it adds the facts the layers above know
// (the body's signal, why the context ended, a request refused before
// sending), classifies the evidence, emits the attempt's one
// "llm.attempt" log event (unless Spec.DeferEvent) and returns both. Only
// the first call classifies and logs; later calls return the same result.
// FinishWith settles the exchange if that has not happened, so call it
// after the body is consumed.
func (a *Attempt) FinishWith(f evidence.Facts) (evidence.Evidence, evidence.Classification) {
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
	a.ev.Signal, a.ev.Stop, a.ev.Capacity = f.Signal, f.Stop, f.Capacity
	if f.Unsendable != "" && !a.ev.RequestSent && !a.ev.MaybeSent {
		a.ev.Unsendable = f.Unsendable
	}
	if !a.ev.Canceled {
		// A stop cause says why the context ended; it means nothing for an
		// exchange that ended first.
		a.ev.Stop = ""
	}
	a.class = evidence.Classify(a.ev)
	ev, c, e := a.ev, a.class, a.engine
	a.mu.Unlock()
	logger := slog.Default()
	if e != nil {
		logger = e.logger
		e.stats.classified(c.Class)
	}
	if !a.spec.DeferEvent {
		evidence.LogAttempt(context.Background(), logger, ev, c)
	}
	return ev, c
}
