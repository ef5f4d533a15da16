package evidence

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Evidence is what the engine saw of one attempt on the wire (docs/contract.md
// section 2). It holds no content, no headers and no GOAWAY debug data, so
// it is safe to log, to store in workflow history and to show in the UI.
//
// The zero value describes an attempt that never reached the engine.
type Evidence struct {
	// Identity of the attempt, copied from its Spec.
	ActionRef string `json:"action_ref,omitempty"`
	Attempt   int    `json:"attempt,omitempty"`
	AttemptID string `json:"attempt_id,omitempty"`
	Route     string `json:"route,omitempty"`
	// Provider and Model say what the route points at (e.g. "openai",
	// "gpt-4o-mini").
	Provider string `json:"provider,omitempty"`
	Model    string `json:"model,omitempty"`

	// Authority is the host:port the request was meant for.
	Authority string `json:"authority,omitempty"`
	// HTTPVersion is the protocol spoken, "HTTP/2.0" or "HTTP/1.1" once a
	// connection was had (the route's http_version and ALPN decide).
	HTTPVersion string `json:"http_version,omitempty"`
	// ProtocolMismatch says what the server turned out to speak when it
	// was not what the engine tried (MismatchHTTP11, MismatchHTTP2,
	// MismatchNotHTTP2): the route is misconfigured, and the request was
	// provably not processed.
	ProtocolMismatch string `json:"protocol_mismatch,omitempty"`
	// ConnRef names the connection the attempt used, unique per process
	// and connection (e.g. "7f3a9c01d2e4b5a6-c12"). Empty when no connection was had.
	ConnRef string `json:"conn_ref,omitempty"`
	// ConnFresh reports that the connection was dialed for this attempt;
	// false with a ConnRef means a reused (kept-alive) connection.
	ConnFresh bool `json:"conn_fresh,omitempty"`
	// DialFailed reports that no connection could be had (dial, TLS or
	// ALPN failure). The request never left the client.
	DialFailed bool `json:"dial_failed,omitempty"`

	// RequestSent reports that a HEADERS frame carrying this attempt's
	// header was handed to the connection; over HTTP/1.1, that at least
	// one byte of the request was written to it (RequestBytes > 0).
	RequestSent bool `json:"request_sent,omitempty"`
	// MaybeSent reports that the request was in the transport's hands
	// when its context ended and the observer could not prove its HEADERS
	// did not leave. Never set together with RequestSent.
	MaybeSent bool `json:"maybe_sent,omitempty"`
	// StreamID is the attempt's HTTP/2 stream id, 0 when it never got one.
	StreamID uint32 `json:"stream_id,omitempty"`
	// TransportReplays counts streams beyond the first that carried this
	// attempt's header: a lower layer re-sent the request. The engine
	// itself never does; anything above zero is charged to the budget.
	TransportReplays int `json:"transport_replays,omitempty"`
	// MappingLost reports that the frame observer lost track of the
	// connection (unparseable frames or header block), so nothing can be
	// proven about this attempt's stream.
	MappingLost bool `json:"mapping_lost,omitempty"`
	// SentAfterGoAway reports that the request left on a connection that
	// had already received GOAWAY: the pool's drain failed. It should never
	// be true; an alert watches it (docs/operations.md).
	SentAfterGoAway bool `json:"sent_after_goaway,omitempty"`
	// RequestBytes counts HEADERS and DATA payload bytes sent on the
	// stream; over HTTP/1.1, the request's bytes (request line, headers,
	// body) the connection accepted, counted exactly.
	RequestBytes int64 `json:"request_bytes,omitempty"`

	// ResponseHeaders reports that a HEADERS frame arrived on the stream;
	// over HTTP/1.1, that any byte of an answer arrived.
	ResponseHeaders bool `json:"response_headers,omitempty"`
	// Status is the final HTTP status, 0 when no response arrived.
	Status int `json:"status,omitempty"`
	// RetryAfter is the provider's pushback (Retry-After or
	// retry-after-ms), zero when absent or unparseable.
	RetryAfter time.Duration `json:"retry_after,omitempty"`
	// ContentStarted reports that the first byte of a 2xx body reached the
	// caller: the commit boundary.
	ContentStarted bool `json:"content_started,omitempty"`
	// ResponseBytes counts body bytes delivered to the caller.
	ResponseBytes int64 `json:"response_bytes,omitempty"`
	// BodyFailed reports that the response body ended with an error rather
	// than a clean end of stream.
	BodyFailed bool `json:"body_failed,omitempty"`

	// GoAway is what the server's GOAWAYs on the connection said up to the
	// end of the attempt, nil when none. Several GOAWAYs merge: the lowest
	// last-stream id and the first non-NO_ERROR code, with that frame's
	// DebugLen.
	GoAway *GoAway `json:"goaway,omitempty"`
	// RSTStream is the code of a RST_STREAM the server sent on the
	// attempt's stream, nil when none.
	RSTStream *ErrCode `json:"rst_stream,omitempty"`
	// ConnClosed reports that the connection ended (EOF or read error)
	// while the attempt was in flight.
	ConnClosed bool `json:"conn_closed,omitempty"`

	// Canceled reports that the caller's scope ended the attempt: its
	// context was canceled, with any cause but a timeout.
	Canceled bool `json:"canceled,omitempty"`
	// TimedOut reports that a deadline or timer ended the attempt: the
	// context's deadline, or a cancel whose cause wraps ErrTimedOut (such
	// as an idle-stream timer).
	TimedOut bool `json:"timed_out,omitempty"`
	// AfterMisdirected reports that an earlier attempt of the same action
	// got a 421, on any route: the action's second 421, wherever it falls,
	// is misdirected_repeated.
	AfterMisdirected bool `json:"after_misdirected,omitempty"`
	// Intermediary reports that the route goes through a proxy whose
	// REFUSED_STREAM, and whose own 502, are not proof of non-processing
	// (Spec.Intermediary).
	Intermediary bool `json:"intermediary,omitempty"`
	// HonoursIdempotencyKey reports that the route declares its provider
	// deduplicates requests by Idempotency-Key
	// (Spec.HonoursIdempotencyKey), so sending the request again with the
	// same key cannot run it twice.
	HonoursIdempotencyKey bool `json:"honours_idempotency_key,omitempty"`
	// ProviderError reports that the body of an HTTP error status was the
	// provider's own error object, in its dialect's shape: the provider
	// answered, not a proxy in front of it. The provider layer says so
	// (Attempt.ProviderError).
	ProviderError bool `json:"provider_error,omitempty"`
	// Signal is what the provider layer read from the body (empty
	// response, model not found, ...), empty when nothing.
	Signal Signal `json:"signal,omitempty"`

	// The facts below are known only to the layers above the engine. They
	// travel down as evidence (Facts, or the workflow filling them in) so
	// that Classify, and nothing else, decides the class.

	// Stop says why the attempt's context ended, when it ended other than
	// by a timer (Canceled): the action's scope, a worker shutdown, an
	// operator pausing or resetting the activity, or Temporal losing track
	// of it before it was sent. Empty means nobody said,
	// which Classify reads as the scope (the engine used on its own: its
	// caller canceled).
	Stop StopCause `json:"stop,omitempty"`
	// Unsendable says the request was refused before anything was sent
	// because it can never be sent as it is: the request is invalid, or
	// the route cannot express it, or the route is not configured on the
	// worker.
	Unsendable Unsendable `json:"unsendable,omitempty"`
	// Activity says how the attempt's activity ended when it returned no
	// outcome of its own: no worker took it, its worker was lost, Temporal
	// timed it out, or it failed. The workflow fills it in, with the last
	// heartbeat's facts (ConnRef, ContentStarted, ResponseBytes) as
	// evidence: a heartbeat that says content started proves the commit,
	// one that does not proves nothing.
	Activity ActivityEnd `json:"activity,omitempty"`

	// Capacity is what the route's fleet-wide limits did to the attempt
	// before its request went to the engine (docs/contract.md section
	// 4.9); nil on a route without limits.
	Capacity *Capacity `json:"capacity,omitempty"`

	// Elapsed is the attempt's wall time until its evidence was taken,
	// from the moment its request went to the engine (a wait for
	// Capacity is not in it).
	Elapsed time.Duration `json:"elapsed,omitempty"`
	// FirstByte is the time from the start of the attempt to the first
	// content byte, zero when content never started.
	FirstByte time.Duration `json:"first_byte,omitempty"`
}

// Capacity is what a route's fleet-wide limits did to an attempt before
// its request was sent (Evidence.Capacity): the room it was granted,
// after how long, or that there was none within what its deadline left.
type Capacity struct {
	// Wait is how long the attempt spent in the limiter before its
	// request went to the engine: the check alone when there was room,
	// or the wait for it. It counts against the action's deadline, never
	// its attempt budget.
	Wait time.Duration `json:"wait"`
	// Limit is the limit it waited for ("requests", "tokens",
	// "concurrency", or "pushback": a provider's Retry-After held for the
	// fleet), empty when it had room at once.
	Limit string `json:"limit,omitempty"`
	// NoRoom reports that Limit had no room for the attempt within what
	// the action's deadline left it: its request was never sent.
	NoRoom bool `json:"no_room,omitempty"`
	// In is, with NoRoom, how long until the limit expected room; zero
	// when it cannot tell (a place in flight frees when a request ends).
	In time.Duration `json:"in,omitempty"`
}

// StopCause says why an attempt's context ended (Evidence.Stop).
type StopCause string

// The stop causes.
const (
	// StopScope: the action's own scope ended (a cancel, the deadline of
	// the action, Temporal cancellation). The attempt is canceled.
	StopScope StopCause = "scope"
	// StopWorkerShutdown: the worker running the attempt is shutting down;
	// the action goes on. What the attempt had done decides its class.
	StopWorkerShutdown StopCause = "worker_shutdown"
	// StopPaused: an operator paused or reset the attempt's activity; the
	// action goes on, as for a worker shutdown.
	StopPaused StopCause = "paused"
	// StopTemporalLost: Temporal lost track of the attempt (its heartbeat
	// found it gone, or could not reach the server) before its request
	// was on the wire, and the activity ended it there rather than send a
	// request whose report nobody would take. The action goes on, as for
	// a worker shutdown.
	StopTemporalLost StopCause = "temporal_lost"
)

// Unsendable says why a request was refused before sending
// (Evidence.Unsendable).
type Unsendable string

// The reasons a request cannot be sent.
const (
	// UnsendableInvalid: the request can never be sent as it is (an
	// invalid envelope, a header value the client cannot encode). The
	// request is wrong: rejected.
	UnsendableInvalid Unsendable = "invalid_request"
	// UnsendableRoute: the route's dialect cannot express the request (an
	// Anthropic route asked for response_format, an unknown route kind).
	// Another route may: incompatible_route.
	UnsendableRoute Unsendable = "route_cannot_express_request"
	// UnsendableNoRoute: the worker has no route of that name.
	UnsendableNoRoute Unsendable = "route_not_configured"
)

// ActivityEnd says how an attempt's activity ended when it returned no
// outcome (Evidence.Activity).
type ActivityEnd string

// The activity ends the workflow can see.
const (
	// ActivityQueueTimeout: ScheduleToStart timed out; no worker took the
	// attempt, so nothing was sent.
	ActivityQueueTimeout ActivityEnd = "queue_timeout"
	// ActivityWorkerLost: the heartbeat timed out; the worker died or
	// hung mid-attempt.
	ActivityWorkerLost ActivityEnd = "worker_lost"
	// ActivityTimedOut: Temporal's StartToClose ran out before the
	// attempt's own timer ended the exchange.
	ActivityTimedOut ActivityEnd = "attempt_timeout"
	// ActivityFailed: the activity failed without an outcome (a panic, a
	// result too large to record, a worker of another version).
	ActivityFailed ActivityEnd = "activity_failed"
)

// Facts are what the layers above the engine know of an attempt that the
// wire cannot show. Attempt.Finish adds them to the evidence before
// Classify reads it.
type Facts struct {
	// Signal is what the provider layer read from the body.
	Signal Signal
	// Stop says why the attempt's context ended, if it did.
	Stop StopCause
	// Unsendable says why the request was refused before sending, if it
	// was.
	Unsendable Unsendable
	// Capacity is what the route's fleet-wide limits did to the attempt,
	// nil on a route without limits.
	Capacity *Capacity
}

// GoAway is what a GOAWAY frame said, without its debug data.
type GoAway struct {
	// LastStreamID is the highest stream id the server may have processed.
	LastStreamID uint32 `json:"last_stream_id"`
	// Code is the frame's error code.
	Code ErrCode `json:"code"`
	// DebugLen is the length of the debug data, which is never kept.
	DebugLen int `json:"debug_len,omitempty"`
}

// Signal is a fact the provider layer read from a response body that the
// wire cannot show. Classify uses it alongside the wire evidence.
type Signal string

// Signals a provider adapter can report.
const (
	SignalNone            Signal = ""
	SignalEmptyResponse   Signal = "empty_response"
	SignalModelNotFound   Signal = "model_not_found"
	SignalContextTooLong  Signal = "context_length_exceeded"
	SignalOverloaded      Signal = "overloaded"
	SignalContentFiltered Signal = "content_filtered"
	// SignalStreamIncomplete: the body ended cleanly on the wire but the
	// stream's own framing says it was cut (no [DONE], no finish reason).
	SignalStreamIncomplete Signal = "stream_incomplete"
)

// ErrCode is an HTTP/2 error code (RFC 9113 section 7) as read from a
// GOAWAY or RST_STREAM frame. It marshals as its name.
type ErrCode uint32

// The RFC 9113 error codes.
const (
	CodeNoError            ErrCode = 0x0
	CodeProtocolError      ErrCode = 0x1
	CodeInternalError      ErrCode = 0x2
	CodeFlowControlError   ErrCode = 0x3
	CodeSettingsTimeout    ErrCode = 0x4
	CodeStreamClosed       ErrCode = 0x5
	CodeFrameSizeError     ErrCode = 0x6
	CodeRefusedStream      ErrCode = 0x7
	CodeCancel             ErrCode = 0x8
	CodeCompressionError   ErrCode = 0x9
	CodeConnectError       ErrCode = 0xa
	CodeEnhanceYourCalm    ErrCode = 0xb
	CodeInadequateSecurity ErrCode = 0xc
	CodeHTTP11Required     ErrCode = 0xd
)

var errCodeNames = [...]string{
	"NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR",
	"SETTINGS_TIMEOUT", "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM",
	"CANCEL", "COMPRESSION_ERROR", "CONNECT_ERROR", "ENHANCE_YOUR_CALM",
	"INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED",
}

// String returns the RFC name, or "UNKNOWN_0x.." for an unassigned code.
func (c ErrCode) String() string {
	if int(c) < len(errCodeNames) {
		return errCodeNames[c]
	}
	return fmt.Sprintf("UNKNOWN_0x%x", uint32(c))
}

// Label returns the RFC name, or "UNKNOWN" for an unassigned code. A peer
// may send any of 2^32 codes, so whatever becomes a metric attribute (a
// Classification.Reason, the engine's GOAWAY counter) uses Label; String
// keeps the exact code for evidence and logs, which are not metrics.
func (c ErrCode) Label() string {
	if c < ErrCode(len(errCodeNames)) {
		return errCodeNames[c]
	}
	return "UNKNOWN"
}

// MarshalText writes the RFC name so history and logs read naturally.
func (c ErrCode) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText accepts an RFC name, an "UNKNOWN_0x.." name or a number.
func (c *ErrCode) UnmarshalText(b []byte) error {
	s := string(b)
	for i, n := range errCodeNames {
		if n == s {
			*c = ErrCode(i)
			return nil
		}
	}
	hex, ok := strings.CutPrefix(s, "UNKNOWN_0x")
	base := 16
	if !ok {
		hex, base = s, 0
	}
	v, err := strconv.ParseUint(hex, base, 32)
	if err != nil {
		return fmt.Errorf("recovery: unknown HTTP/2 error code %q: %w", s, err)
	}
	*c = ErrCode(v)
	return nil
}
