package exchange

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"

	"golang.org/x/net/http2"

	"github.com/durallm/durallm/recovery"
)

// Sink receives a stream while the attempt runs. Its methods are called on
// the goroutine running the adapter (CallOpenAI, CallAnthropic), in
// order; they should return quickly (the idle timer is paused while they
// run, but the attempt timeout is not). A nil Sink receives nothing.
type Sink interface {
	// Delta receives one piece of generated text, in order.
	Delta(text string)
	// Incomplete is called once when a stream that had started delivering
	// content ends without completing; reason is one of the Incomplete*
	// constants. No further delta follows, and no second answer: the
	// attempt is committed.
	Incomplete(reason string)
}

// ChunkSink is a Sink that also receives each event's typed pieces: text,
// refusal, tool-call deltas, the finish reason and usage. When the Sink a
// Call carries implements it, Chunk is called instead of Delta, with the
// same ordering and timing rules. Nothing reaches it before the commit
// boundary: a chunk that carries only a finish reason or usage before the
// first content is not handed on (its usage is in a later chunk's total).
type ChunkSink interface {
	Sink
	Chunk(c Chunk)
}

// Chunk is what one stream event carried for the caller, after the commit.
type Chunk struct {
	// Text is the content delta, empty when none.
	Text string
	// Refusal is the refusal delta, empty when none.
	Refusal string
	// ToolCalls are the event's tool-call deltas, in order.
	ToolCalls []ToolCallDelta
	// FinishReason is the finish reason when this event carried one.
	FinishReason string
	// Usage is the usage so far when this event carried usage; nil
	// otherwise.
	Usage *providers.Usage
}

// Empty reports whether c carries nothing.
func (c Chunk) Empty() bool {
	return c.Text == "" && c.Refusal == "" && len(c.ToolCalls) == 0 && c.FinishReason == "" && c.Usage == nil
}

// ToolCallDelta is one piece of a tool call. Index is the call's position
// among the answer's tool calls, from 0, whatever index the provider sent;
// ID, Type and Name arrive once, on the call's first piece, and Arguments
// are concatenated in order.
type ToolCallDelta struct {
	Index     int    `json:"index"`
	ID        string `json:"id,omitempty"`
	Type      string `json:"type,omitempty"`
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments,omitempty"`
}

// Call is one attempt's input to an adapter.
type Call struct {
	// Route says where to send it and with which model and key.
	Route routes.Route
	// Request is the envelope.
	Request providers.Request
	// Sink receives streamed deltas; nil means none.
	Sink Sink
	// Record names the attempt in the provider's record, on a route that
	// keeps one (Route.ProviderRecord): the request then carries
	// "store": true and these ids in its metadata (MetadataAttemptID,
	// MetadataActionID). Ignored on other routes.
	Record RecordIDs
}

// Result is one attempt's output from an adapter.
type Result struct {
	// Response is what the provider answered, possibly partial; for an
	// HTTP error status it carries the error object (Response.Error).
	Response providers.Response `json:"response"`
	// Signal is what the body said that the wire cannot: pass it to
	// recovery.Attempt.Finish whether or not the adapter returned an error.
	Signal evidence.Signal `json:"signal,omitempty"`
}

// Errors a timer or the adapter itself ends a request with. They are the
// cause of the request context's cancellation and wrap
// recovery.ErrTimedOut, which is how the recovery engine learns that a
// timer, not the caller's scope, ended the attempt (Evidence.TimedOut);
// the adapter's error wraps them too.
var (
	// ErrFirstByteTimeout: no body byte within the route's
	// FirstByteTimeout of the send (streams only).
	ErrFirstByteTimeout = fmt.Errorf("exchange: first-byte timeout: %w", recovery.ErrTimedOut)
	// ErrIdleTimeout: no byte for the route's IdleTimeout once the body
	// had started (streams only).
	ErrIdleTimeout = fmt.Errorf("exchange: stream idle timeout: %w", recovery.ErrTimedOut)
	// ErrAttemptTimeout: the route's AttemptTimeout ran out.
	ErrAttemptTimeout = fmt.Errorf("exchange: attempt timeout: %w", recovery.ErrTimedOut)
	// ErrStreamAborted: the adapter stopped a committed stream itself (too
	// large, malformed, an error event). It wraps recovery.ErrTimedOut
	// because that is the engine's only way to record a body that ended
	// badly on the caller's side without calling it the caller's
	// cancellation; with content started it classifies as
	// committed_partial, which is what happened.
	ErrStreamAborted = fmt.Errorf("exchange: stream aborted by the adapter: %w", recovery.ErrTimedOut)
)

// ErrNoTransport is returned when an adapter is given a nil RoundTripper.
var ErrNoTransport = errors.New("exchange: no RoundTripper")

// ErrWrongKind is returned when an adapter is given a route of another
// kind: its key must not be sent to an endpoint of another dialect by
// mistake.
var ErrWrongKind = errors.New("exchange: route kind does not match the adapter")

// ErrUnknownKind is returned by CallRoute for a route kind no adapter
// serves.
var ErrUnknownKind = errors.New("exchange: unknown route kind")

// ErrUnsupported is returned, before anything is sent, when a request
// uses something the route's dialect cannot express (CallAnthropic with a
// response_format, say). The message names the field, never its value.
// The workflow's capability filter is what should keep such requests
// away from such routes.
var ErrUnsupported = errors.New("exchange: not supported by this route's kind")

// maxErrorBody bounds how much of an HTTP error body is read: enough for
// any real error object, and a hostile endless one costs nothing more.
const maxErrorBody = 1 << 20

// CallRoute makes one attempt on c.Route with the adapter its Kind names:
// CallOpenAI for KindOpenAI (and for an empty kind, a route built in code,
// as CallOpenAI has always accepted), CallAnthropic for KindAnthropic.
// Any other kind is ErrUnknownKind, before anything is sent. Everything
// else, the error contract included, is the adapter's.
func CallRoute(ctx context.Context, rt http.RoundTripper, c Call) (Result, error) {
	switch c.Route.Kind {
	case routes.KindOpenAI, "":
		return CallOpenAI(ctx, rt, c)
	case routes.KindAnthropic:
		return CallAnthropic(ctx, rt, c)
	default:
		// A kind is configuration, never a secret, so it may be named.
		return Result{}, fmt.Errorf("exchange: route %q: %w %q", c.Route.Name, ErrUnknownKind, c.Route.Kind)
	}
}

// dialect is what differs between the APIs the adapters speak. Everything
// else about an attempt (timers, the commit boundary, the SSE decoder,
// partial results, bounds) is the exchange's and shared.
type dialect struct {
	// kind is the Route.Kind the dialect serves.
	kind string
	// path is appended to the route's base URL.
	path []string
	// send makes the request through rt and returns the provider's
	// response with its body unread: the exchange reads every body, so
	// the timers, the bounds and the commit boundary see each byte. It is
	// called once and must not retry.
	send func(ctx context.Context, rt http.RoundTripper, o outgoing) (*http.Response, error)
	// whole reads a complete 2xx JSON body.
	whole func(data []byte) (providers.Response, evidence.Signal, error)
	// errorBody reads the body of an HTTP error status.
	errorBody func(data []byte) (providers.Response, evidence.Signal)
	// newStream returns an accumulator for the dialect's event stream.
	newStream func() *streamAcc
	// signal maps an error object to a signal.
	signal func(*providers.APIError) evidence.Signal
	// records says the API can keep a provider record of each request
	// (Route.ProviderRecord).
	records bool
}

// outgoing is what a dialect's send needs: the route (base URL, model),
// the resolved key ("" to send none), the endpoint URL and the envelope.
// The OpenAI send ignores url: the official client joins the route's base
// URL with its own path (the same base URL endpointURL has validated).
type outgoing struct {
	route   routes.Route
	key     string
	url     string
	request providers.Request
}

// acceptFor is the Accept header for r: an event stream or JSON.
func acceptFor(r providers.Request) string {
	if r.Stream {
		return "text/event-stream"
	}
	return "application/json"
}

// call makes one attempt in dialect d. It is every adapter's contract
// (CallOpenAI, CallAnthropic):
//
// ctx should carry the attempt (recovery.WithAttempt), created with
// Spec.ManualCommit: the exchange commits it exactly when the first content
// (text, refusal or tool-call delta) is handed on, never on keep-alives or
// role-only chunks; for a non-streaming 2xx, once the body is read, parsed
// and found usable. ManualCommit is required for a stream and advisable
// for a non-streaming request too: without it the engine commits on the
// first body byte, so a JSON body cut halfway classifies as
// committed_partial (with nothing usable) rather than ambiguous.
//
// How it ends:
//   - The provider answered (any status, body read): Result with the
//     Response and the Signal, nil error. HTTP error statuses are not
//     errors: the caller classifies from the evidence plus the Signal.
//   - A 2xx body that is not JSON, or passes MaxResponseBytes: Result with
//     SignalEmptyResponse and an error (ErrMalformedResponse,
//     ErrResponseTooLarge).
//   - A 2xx body cut before content and then ended cleanly: a JSON body
//     that stops mid-value, or a stream that ends inside an event whose
//     data is not complete: Result with SignalStreamIncomplete
//     (ambiguous: the provider ran the request) and an error wrapping
//     ErrTruncatedBody. A stream that ends cleanly on an event boundary
//     with no content and no end marker gets the same signal and no
//     error. A final event that is complete without its blank line
//     ("data: [DONE]" at the end of the body) is read as usual.
//   - A stream that fails before its first content (timer, reset,
//     over-long line): an error wrapping the cause (ErrFirstByteTimeout,
//     ErrIdleTimeout, ErrLineTooLong, the transport's error, ...), and the
//     Signal when the body said something (an error event, or
//     SignalEmptyResponse for a malformed stream).
//   - A stream that fails after its first content: Result with
//     Response.Partial, Response.Incomplete naming why (a cut inside an
//     event is IncompleteTruncated), the text so far, and nil error;
//     Sink.Incomplete is called. If the caller's context
//     was canceled, the error wrapping context.Canceled is returned too.
//   - The send failed: the transport's error, wrapped.
//
// Errors never contain the prompt, the output, headers or the key.
func call(ctx context.Context, rt http.RoundTripper, c Call, d *dialect) (Result, error) {
	route := c.Route.WithDefaults()
	fail := func(err error) (Result, error) {
		return Result{}, fmt.Errorf("exchange: route %q: %w", route.Name, err)
	}
	if rt == nil {
		return fail(ErrNoTransport)
	}
	if route.Kind != d.kind && route.Kind != "" {
		// An empty kind is a route built in code; LoadConfig requires one.
		return fail(fmt.Errorf("%w (route kind %q, adapter %q)", ErrWrongKind, route.Kind, d.kind))
	}
	if err := c.Request.Validate(); err != nil {
		return fail(err)
	}
	if route.ProviderRecord != "" {
		if !d.records || route.ProviderRecord != routes.ProviderRecordStoredCompletions {
			return fail(fmt.Errorf("%w: provider_record %q", ErrUnsupported, route.ProviderRecord))
		}
		req, err := withProviderRecord(c.Request, c.Record)
		if err != nil {
			return fail(err)
		}
		c.Request = req
	}
	url, err := route.Endpoint(d.path...)
	if err != nil {
		return fail(err)
	}
	key, err := route.APIKey()
	if err != nil {
		return fail(err)
	}
	if !route.HasKeySource() {
		key = ""
	}

	actx, cancelAttempt := context.WithTimeoutCause(ctx, route.AttemptTimeout, ErrAttemptTimeout)
	defer cancelAttempt()
	// The route says which HTTP version the engine speaks for it.
	rctx, cancel := context.WithCancelCause(recovery.WithHTTPVersion(actx, recovery.HTTPVersion(route.HTTPVersion)))
	// Deferred before the body's Close below, so it runs after it: the
	// engine reads the context when the body closes, and a cancellation
	// then would record a clean end as canceled.
	defer cancel(nil)

	x := &exchange{route: route, call: c, d: d, ctx: rctx, cancel: cancel, attempt: recovery.AttemptFrom(ctx)}
	if c.Request.Stream {
		x.timers = newStreamTimers(route, cancel)
	}
	resp, err := d.send(rctx, rt, outgoing{route: route, key: key, url: url, request: c.Request})
	if err != nil {
		x.timers.stop()
		return fail(x.causeOf(err))
	}
	defer resp.Body.Close()
	// Deferred after Close, so it runs first: no timer may fire between
	// the end of reading and the close.
	defer x.timers.stop()
	in := io.Reader(resp.Body)
	if x.timers != nil {
		in = &timedReader{r: resp.Body, t: x.timers}
	}

	switch {
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return x.errorStatus(in)
	case isEventStream(resp.Header.Get("Content-Type")) || (c.Request.Stream && resp.Header.Get("Content-Type") == ""):
		return x.stream(in)
	default:
		return x.whole(in)
	}
}

// exchange is the state of one attempt.
type exchange struct {
	route     routes.Route
	call      Call
	d         *dialect
	ctx       context.Context
	cancel    context.CancelCauseFunc
	attempt   *recovery.Attempt
	timers    *streamTimers
	committed bool
}

func (x *exchange) wrap(err error) error {
	return fmt.Errorf("exchange: route %q: %w", x.route.Name, err)
}

// causeOf adds the request context's cause to a transport error, so
// errors.Is finds ErrFirstByteTimeout (say) as well as what the transport
// said.
func (x *exchange) causeOf(err error) error {
	if cause := context.Cause(x.ctx); cause != nil && !errors.Is(err, cause) {
		return fmt.Errorf("%w: %w", cause, err)
	}
	return err
}

// commit marks the commit boundary on the attempt, once.
func (x *exchange) commit() {
	if x.committed {
		return
	}
	x.committed = true
	// The attempt is optional: a caller testing with a plain transport
	// has none, and recovery.Attempt.Commit is not nil-safe.
	if x.attempt != nil {
		x.attempt.Commit()
	}
}

// errorStatus reads an HTTP error body (bounded) and maps it to a signal.
func (x *exchange) errorStatus(in io.Reader) (Result, error) {
	data, err := io.ReadAll(io.LimitReader(in, maxErrorBody))
	r, sig := x.d.errorBody(data)
	if r.Error != nil {
		// The provider's own error object: the provider answered, not a
		// proxy in front of it (an intermediary's 502 is ambiguous).
		x.attempt.ProviderError()
	}
	if err != nil {
		return Result{Response: r, Signal: sig}, x.wrap(x.causeOf(fmt.Errorf("read error body: %w", err)))
	}
	return Result{Response: r, Signal: sig}, nil
}

// whole reads a complete JSON body.
func (x *exchange) whole(in io.Reader) (Result, error) {
	data, err := io.ReadAll(io.LimitReader(in, MaxResponseBytes+1))
	if err != nil {
		return Result{}, x.wrap(x.causeOf(fmt.Errorf("read body: %w", err)))
	}
	if len(data) > MaxResponseBytes {
		return Result{Signal: evidence.SignalEmptyResponse}, x.wrap(fmt.Errorf("%w (limit %d bytes)", ErrResponseTooLarge, MaxResponseBytes))
	}
	r, sig, err := x.d.whole(data)
	if err != nil {
		return Result{Response: r, Signal: sig}, x.wrap(err)
	}
	if sig == evidence.SignalNone {
		x.commit()
		// A provider that ignored "stream": true still answered; the sink
		// gets the whole answer as one delta.
		if x.call.Request.Stream && x.call.Sink != nil {
			if cs, ok := x.call.Sink.(ChunkSink); ok {
				cs.Chunk(WholeChunk(r))
			} else if r.Text != "" {
				x.call.Sink.Delta(r.Text)
			}
		}
	}
	return Result{Response: r, Signal: sig}, nil
}

// stream consumes a server-sent-event body.
func (x *exchange) stream(in io.Reader) (Result, error) {
	acc := x.d.newStream()
	sink := x.call.Sink
	hooks := streamHooks{commit: x.commit}
	if cs, ok := sink.(ChunkSink); ok {
		hooks.chunk = func(c Chunk) {
			// The provider is not idle while the sink works.
			x.timers.pause()
			cs.Chunk(c)
			x.timers.resume()
		}
	} else if sink != nil {
		hooks.delta = func(s string) {
			x.timers.pause()
			sink.Delta(s)
			x.timers.resume()
		}
	}
	err := consumeStream(newSSEDecoder(in), acc, hooks)
	x.timers.stop()
	r := acc.response()
	switch {
	case err == nil && acc.complete():
		// [DONE] or a finish_reason (with no content, the signal reports
		// it empty).
		return Result{Response: r, Signal: completionSignalWith(r, x.d.signal)}, nil
	case err == nil && !acc.content:
		// A clean end with no content and no end marker: the stream was
		// cut before its first content, which is what a proxy makes of
		// an origin's reset after the headers. The provider ran the
		// request and may have an answer, so this is not an empty
		// response (which may fall back) but a body that failed before
		// content (ambiguous).
		return Result{Response: r, Signal: evidence.SignalStreamIncomplete}, nil
	case err == nil:
		return x.partial(r, providers.IncompleteTruncated, nil)
	case errors.Is(err, ErrTruncatedBody) && !x.committed:
		// Cut inside an event: as a cut on an event boundary (above), the
		// provider ran the request and may have an answer.
		return Result{Response: r, Signal: evidence.SignalStreamIncomplete}, x.wrap(err)
	case errors.Is(err, ErrTruncatedBody):
		return x.partial(r, providers.IncompleteTruncated, nil)
	case errors.Is(err, errProviderError):
		if !x.committed {
			sig := x.d.signal(r.Error)
			if sig == evidence.SignalNone {
				sig = evidence.SignalEmptyResponse
			}
			return Result{Response: r, Signal: sig}, nil
		}
		return x.abort(r, providers.IncompleteProviderError)
	}
	if reason := selfReason(err); reason != "" {
		// The adapter itself gave up on the body.
		if !x.committed {
			return Result{Response: r, Signal: evidence.SignalEmptyResponse}, x.wrap(err)
		}
		return x.abort(r, reason)
	}
	// The transport or a timer ended the body.
	if !x.committed {
		return Result{}, x.wrap(x.causeOf(err))
	}
	reason := x.incompleteReason(err)
	var cerr error
	if reason == providers.IncompleteCanceled {
		cerr = x.wrap(x.causeOf(err))
	}
	return x.partial(r, reason, cerr)
}

// abort ends a committed stream the adapter refused to read further. The
// request context is canceled with a cause before the body closes, so the
// engine records the attempt as cut (committed_partial) rather than
// complete.
func (x *exchange) abort(r providers.Response, reason string) (Result, error) {
	x.cancel(fmt.Errorf("%w: %s", ErrStreamAborted, reason))
	return x.partial(r, reason, nil)
}

func (x *exchange) partial(r providers.Response, reason string, err error) (Result, error) {
	r.Partial, r.Incomplete = true, reason
	if x.call.Sink != nil {
		x.call.Sink.Incomplete(reason)
	}
	return Result{Response: r}, err
}

// selfReason names the limits and format errors the adapter enforces
// itself, "" for anything else.
func selfReason(err error) string {
	switch {
	case errors.Is(err, ErrLineTooLong):
		return providers.IncompleteLineTooLong
	case errors.Is(err, ErrEventTooLarge):
		return providers.IncompleteEventTooLarge
	case errors.Is(err, ErrResponseTooLarge):
		return providers.IncompleteTooLarge
	case errors.Is(err, ErrMalformedStream):
		return providers.IncompleteMalformed
	default:
		return ""
	}
}

// incompleteReason names why the transport ended a committed stream: the
// context's cause first (a timer or the caller), then the wire evidence
// the engine recorded, then the error's type.
func (x *exchange) incompleteReason(err error) string {
	if cause := context.Cause(x.ctx); cause != nil {
		switch {
		case errors.Is(cause, ErrIdleTimeout):
			return providers.IncompleteIdleTimeout
		case errors.Is(cause, ErrAttemptTimeout):
			return providers.IncompleteAttemptTimeout
		case errors.Is(cause, context.DeadlineExceeded):
			return providers.IncompleteDeadline
		case errors.Is(cause, recovery.ErrTimedOut):
			return providers.IncompleteTimeout
		default:
			// The engine's rule: any other cause is the scope ending.
			return providers.IncompleteCanceled
		}
	}
	if x.attempt != nil {
		// The engine settled the exchange when the body failed, so the
		// frame facts are in.
		ev := x.attempt.Evidence()
		switch {
		case ev.RSTStream != nil:
			return providers.IncompleteReset
		case ev.GoAway != nil:
			return providers.IncompleteGoAway
		case ev.ConnClosed:
			return providers.IncompleteConnectionClosed
		}
	}
	var se http2.StreamError
	switch {
	case errors.As(err, &se):
		return providers.IncompleteReset
	case errors.Is(err, io.ErrUnexpectedEOF):
		return providers.IncompleteConnectionClosed
	default:
		return providers.IncompleteReadError
	}
}

func isEventStream(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}

// streamTimers are a stream's first-byte and idle timers. Each cancels the
// request context with its own cause when it fires; once stopped, neither
// can, so a timer can never turn a finished exchange into a timed-out one.
type streamTimers struct {
	idleAfter time.Duration
	cancel    context.CancelCauseFunc

	mu        sync.Mutex
	stopped   bool
	gotByte   bool
	paused    bool
	firstByte *time.Timer
	idle      *time.Timer
}

func newStreamTimers(r routes.Route, cancel context.CancelCauseFunc) *streamTimers {
	t := &streamTimers{idleAfter: r.IdleTimeout, cancel: cancel}
	t.firstByte = time.AfterFunc(r.FirstByteTimeout, func() { t.fire(ErrFirstByteTimeout) })
	return t
}

func (t *streamTimers) fire(cause error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped || t.paused {
		return
	}
	t.cancel(cause)
}

// sawBytes records body bytes: the first stops the first-byte timer and
// starts the idle timer; every one restarts the idle timer.
func (t *streamTimers) sawBytes() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	if !t.gotByte {
		t.gotByte = true
		t.firstByte.Stop()
		t.idle = time.AfterFunc(t.idleAfter, func() { t.fire(ErrIdleTimeout) })
		return
	}
	if !t.paused {
		t.idle.Reset(t.idleAfter)
	}
}

// pause stops the idle timer while the sink runs; resume restarts it.
func (t *streamTimers) pause() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.paused = true
	if t.idle != nil {
		t.idle.Stop()
	}
}

func (t *streamTimers) resume() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.paused = false
	if t.idle != nil && !t.stopped {
		t.idle.Reset(t.idleAfter)
	}
}

func (t *streamTimers) stop() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	t.firstByte.Stop()
	if t.idle != nil {
		t.idle.Stop()
	}
}

// timedReader tells the stream timers about every byte read.
type timedReader struct {
	r io.Reader
	t *streamTimers
}

func (r *timedReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.t.sawBytes()
	}
	return n, err
}
