package providertest

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/net/http2"
)

// kind says what a Behavior does with its stream.
type kind int

const (
	kindDefault kind = iota // the zero Behavior: acts as Answer("ok")
	kindAnswer
	kindGoAway
	kindRefuse
	kindReset
	kindCloseAfterRead
	kindStatus
	kindEmptyBody
	kindNoChoices
	kindStreamStall
	kindStreamCut
	kindBodyCut
	kindHold
	kindHintsThenRefuse
	kindToolCall
	kindAnswerOrCallTool
	kindListStored
)

// lastMode says how a GOAWAY behaviour picks its last-stream-id.
type lastMode int

const (
	lastExplicit  lastMode = iota // GoAwayAt: the given id
	lastBelowSelf                 // GoAwayAbove: the stream id before this one
	lastSelf                      // GoAwayAfterProcessing: this stream's id
)

// defaultAnswer is what the zero Behavior and a fresh Provider answer.
const defaultAnswer = "ok"

// goAwayDebug is the debug data of every GOAWAY a behaviour or Drain sends.
// Clients must never depend on it; it only helps a human reading a capture.
const goAwayDebug = "durallm-providertest"

// CutMode says how [StreamCut] ends a stream after its chunks.
type CutMode int

const (
	// CutReset ends the stream with RST_STREAM INTERNAL_ERROR; the
	// connection stays usable for other streams.
	CutReset CutMode = iota
	// CutClose closes the TCP connection without a GOAWAY, taking every
	// other stream on it down as well.
	CutClose
	// CutGoAway sends GOAWAY NO_ERROR with last-stream-id equal to this
	// stream's id and debug data "durallm-providertest", then closes the
	// connection without ending the stream, as a server whose graceful
	// shutdown ran out of time does. Go's client then fails the body
	// read with an http2.GoAwayError that carries the debug data.
	CutGoAway
)

// String returns "reset", "close" or "goaway".
func (m CutMode) String() string {
	switch m {
	case CutReset:
		return "reset"
	case CutClose:
		return "close"
	case CutGoAway:
		return "goaway"
	default:
		return "CutMode(" + strconv.Itoa(int(m)) + ")"
	}
}

// Dispositions recorded in [Record.Behavior] for requests that never got a
// Behavior. A request that did get one records [Behavior.String].
const (
	// BehaviorIgnored marks a request that arrived on a connection after the
	// provider had sent a GOAWAY whose last-stream-id is below it, or after
	// the connection began to close, or that such a GOAWAY disowned before
	// it was given a behaviour. HTTP/2 lets a server ignore such streams,
	// and the provider does: it never answers them.
	BehaviorIgnored = "ignored"
	// BehaviorOverLimit marks a request refused with RST_STREAM
	// REFUSED_STREAM because the connection already had the advertised
	// SETTINGS_MAX_CONCURRENT_STREAMS streams open.
	BehaviorOverLimit = "refused-over-limit"
	// BehaviorTooLarge marks a request whose body exceeded the provider's
	// 64 MiB limit; its stream was reset with ENHANCE_YOUR_CALM.
	BehaviorTooLarge = "body-too-large"
)

// Behavior is what the provider does with one request. Build one with a
// constructor such as [Answer] or [GoAwayAbove], and adjust it with the
// modifier methods [Behavior.After], [Behavior.WaitFor] and
// [Behavior.Processed], which return a modified copy.
//
// The zero Behavior acts as Answer("ok").
//
// Unless a constructor says otherwise, the provider decides a Behavior
// only after the request body has been read completely, and records the
// request in [Provider.Processed] before any delay.
type Behavior struct {
	kind         kind
	name         string
	executes     bool
	processedSet bool
	processedVal bool
	delay        time.Duration
	gate         <-chan struct{}
	midGate      <-chan struct{}
	text         string
	lastMode     lastMode
	last         uint32
	code         http2.ErrCode
	code2        *http2.ErrCode // a second GOAWAY's code (GoAwayAboveTwice)
	status       int
	header       http.Header
	body         string
	chunks       int
	cut          CutMode
	closeAfter   bool      // AnswerThenClose: Connection: close on HTTP/1.1
	keepOpen     bool      // AnswerThenKeepOpen: the stream's body never ends
	tool         *ToolCall // AnswerToolCall
	unstored     bool      // Unstored: no stored completion
	usage        *Usage    // WithUsage: the usage an answer reports
}

// Usage is the token usage an answer reports ([Behavior.WithUsage]), in
// OpenAI's shape: CachedTokens, part of PromptTokens, go out as
// prompt_tokens_details.cached_tokens; total_tokens is the sum of the
// prompt and completion tokens.
type Usage struct {
	PromptTokens, CachedTokens, CompletionTokens int
}

// WithUsage makes an answering behaviour ([Answer], [AnswerToolCall],
// [AnswerOrCallTool]) report u as its usage, in a JSON body or a
// stream's final chunk, instead of the provider's estimate (a quarter of
// the request body's bytes, one token per word of the answer). Other
// behaviours report no usage either way.
func (b Behavior) WithUsage(u Usage) Behavior {
	b.usage = &u
	return b
}

// String returns the Behavior's name as recorded in [Record.Behavior], for
// example "Answer", "GoAwayAbove(NO_ERROR)", "Status(429)" or
// "StreamCut(3,reset)". Modifiers do not change the name.
func (b Behavior) String() string {
	if b.kind == kindDefault {
		return "Answer"
	}
	return b.name
}

// After returns a copy of b that waits d before acting. The wait ends
// early, and the stream is then abandoned without a response, if the
// client resets the stream, the connection closes or the Provider is
// closed. An executing behaviour is recorded as processed before the wait:
// the wait models the time a provider spends generating.
// A zero or negative d means no wait (the default).
func (b Behavior) After(d time.Duration) Behavior {
	b.delay = d
	return b
}

// WaitFor returns a copy of b that, before acting, waits until ch is
// closed (or receives a value). Like [Behavior.After], the wait is cut
// short by a client reset, a connection close or [Provider.Close]. It lets
// a test hold a request in flight and release it at an exact point without
// sleeping. When both are set, WaitFor's wait comes first. Default: no
// wait.
func (b Behavior) WaitFor(ch <-chan struct{}) Behavior {
	b.gate = ch
	return b
}

// MidStreamWaitFor returns a copy of b that, for a streamed [Answer],
// sends the first word and then waits until ch is closed before sending
// the rest: a long stream held in flight, content started, for as long as
// a test needs (say, across a Temporal server restart). [StreamStall] and
// [StreamCut] wait the same way after their first chunk. The wait is cut
// short like [Behavior.WaitFor]'s, and the stream then abandoned. Other
// behaviours ignore it. Default: no wait.
func (b Behavior) MidStreamWaitFor(ch <-chan struct{}) Behavior {
	b.midGate = ch
	return b
}

// Processed returns a copy of b that records (true) or does not record
// (false) the request in [Provider.Processed], overriding the
// constructor's default. Use it to model a provider whose visible
// behaviour and real execution disagree.
func (b Behavior) Processed(executed bool) Behavior {
	b.processedSet = true
	b.processedVal = executed
	return b
}

// executed reports whether a request given b counts as executed.
func (b Behavior) executed() bool {
	if b.processedSet {
		return b.processedVal
	}
	if b.kind == kindDefault {
		return true
	}
	return b.executes
}

// lastFor returns the GOAWAY last-stream-id a GOAWAY behaviour uses when
// triggered by stream id.
func (b Behavior) lastFor(id uint32) uint32 {
	switch b.lastMode {
	case lastBelowSelf:
		if id >= 3 {
			return id - 2
		}
		return 0
	case lastSelf:
		return id
	default:
		return b.last
	}
}

// Answer executes the request and replies 200 with text.
//
// If the request body asked for "stream": true the reply is
// text/event-stream: one OpenAI chat.completion.chunk event per word of
// text (each word after the first keeps its leading space, so the chunks
// concatenate back to text), a final chunk with finish_reason "stop" and
// usage, then "data: [DONE]". Otherwise the reply is application/json with
// a complete chat.completion object.
func Answer(text string) Behavior {
	return Behavior{kind: kindAnswer, name: "Answer", executes: true, text: text}
}

// AnswerThenClose is [Answer] that, over HTTP/1.1, says "Connection:
// close" and closes the connection after the complete answer. A client
// must read it as completed and not reuse the connection. Over HTTP/2,
// which has no Connection header, it acts as Answer.
func AnswerThenClose(text string) Behavior {
	b := Answer(text)
	b.name, b.closeAfter = "AnswerThenClose", true
	return b
}

// AnswerThenKeepOpen is [Answer] whose streamed body never ends: after
// "data: [DONE]" it sends an SSE comment (": keep-alive") every 100 ms and
// never ends the body (no END_STREAM over HTTP/2, no last chunk over
// HTTP/1.1), until the client closes or resets it, the connection closes
// or the Provider is closed; over HTTP/1.1 the connection then closes. It
// models a server or proxy that keeps a finished stream open (keep-alive
// comments, a late usage flush). A client that stops at [DONE] has the
// complete answer, and closing the body must not wait for an end that
// never comes. A request that did not ask to stream is answered as
// Answer answers it.
func AnswerThenKeepOpen(text string) Behavior {
	b := Answer(text)
	b.name, b.keepOpen = "AnswerThenKeepOpen", true
	return b
}

// keepOpenInterval is how often [AnswerThenKeepOpen] sends its keep-alive
// comment.
const keepOpenInterval = 100 * time.Millisecond

// keepAliveComment is the SSE comment it sends.
const keepAliveComment = ": keep-alive\n\n"

// GoAwayAbove refuses the request without executing it: it sends GOAWAY
// with last-stream-id set to the stream id just below this one (id−2, or
// 0 for stream 1), the given code and debug data "durallm-providertest", and
// never answers this stream or any later one on the connection. Streams
// at or below the last-stream-id keep being served; the connection is
// closed as soon as none is left in flight, and at the latest 2 s after
// the GOAWAY.
//
// A client may retry such a request safely: HTTP/2 guarantees it was
// never processed. Go's http2.Transport does so by itself when
// Request.GetBody is set and code is NO_ERROR (or the stream is not the
// connection's first).
func GoAwayAbove(code http2.ErrCode) Behavior {
	return Behavior{kind: kindGoAway, name: "GoAwayAbove(" + code.String() + ")", lastMode: lastBelowSelf, code: code}
}

// GoAwayAboveTwice is [GoAwayAbove] with two GOAWAY frames back to back
// in one write, both with the same last-stream-id: the first with code
// first, the second with code second. It models a server that says why it is leaving
// (ENHANCE_YOUR_CALM, say) and then sends a routine NO_ERROR on its way
// out. A client must not let the second code hide the first.
func GoAwayAboveTwice(first, second http2.ErrCode) Behavior {
	b := GoAwayAbove(first)
	b.name = "GoAwayAboveTwice(" + first.String() + "," + second.String() + ")"
	b.code2 = &second
	return b
}

// GoAwayAfterProcessing executes the request, then sends GOAWAY with
// last-stream-id equal to this stream's id and the given code, and closes
// the connection without answering. The client cannot tell this from a
// request that was never executed: the outcome is ambiguous.
func GoAwayAfterProcessing(code http2.ErrCode) Behavior {
	return Behavior{kind: kindGoAway, name: "GoAwayAfterProcessing(" + code.String() + ")", lastMode: lastSelf, code: code, executes: true}
}

// GoAwayAt is the general GOAWAY behaviour: it sends GOAWAY with the given
// last-stream-id and code. Streams above last, including this one if it
// is, are never answered; the connection then closes like [GoAwayAbove]'s.
// If this stream is at or below last, the connection is closed right away
// without answering it. processed says whether the request records as
// executed, in either case.
func GoAwayAt(last uint32, code http2.ErrCode, processed bool) Behavior {
	return Behavior{
		kind:     kindGoAway,
		name:     fmt.Sprintf("GoAwayAt(%d,%s)", last, code),
		lastMode: lastExplicit,
		last:     last & (1<<31 - 1),
		code:     code,
		executes: processed,
	}
}

// RefuseStream resets the stream with RST_STREAM REFUSED_STREAM without
// executing it. Like GOAWAY above the last-stream-id, REFUSED_STREAM
// guarantees the request was not processed.
func RefuseStream() Behavior {
	return Behavior{kind: kindRefuse, name: "RefuseStream", code: http2.ErrCodeRefusedStream}
}

// HintsThenRefuse executes the request, sends an informational response
// (103 Early Hints), then resets the stream with RST_STREAM
// REFUSED_STREAM. A server that sent response HEADERS has acted on the
// stream, so the refusal no longer proves it was not processed: a
// correct client treats this as ambiguous, never as a safe resend.
func HintsThenRefuse() Behavior {
	return Behavior{kind: kindHintsThenRefuse, name: "HintsThenRefuse", code: http2.ErrCodeRefusedStream, executes: true}
}

// ResetStream executes the request, then resets the stream with
// RST_STREAM and the given code before sending any response headers.
func ResetStream(code http2.ErrCode) Behavior {
	return Behavior{kind: kindReset, name: "ResetStream(" + code.String() + ")", code: code, executes: true}
}

// CloseAfterRead executes the request and then closes the TCP connection
// without a GOAWAY and without answering, as a crashed or partitioned
// provider would.
func CloseAfterRead() Behavior {
	return Behavior{kind: kindCloseAfterRead, name: "CloseAfterRead", executes: true}
}

// Status replies with the given status code, the headers in header (names
// are sent lower-case; connection-specific headers are dropped because
// HTTP/2 forbids them) and body. Content-Type is application/json unless
// header sets it.
//
// It records as executed for 2xx, 500, 502 and 504, the codes after which
// a provider may have done the work; every other code (421, 429, 503, 529,
// other 4xx, …) records as not executed. [Behavior.Processed] overrides
// this. code should be a final status, 200–599.
func Status(code int, header http.Header, body string) Behavior {
	return Behavior{
		kind:     kindStatus,
		name:     "Status(" + strconv.Itoa(code) + ")",
		status:   code,
		header:   header.Clone(),
		body:     body,
		executes: statusExecutes(code),
	}
}

// statusExecutes is the ground-truth rule for [Status]: 500 and 502 may
// come after the model ran, 504 means a gateway gave up on a request that
// may still be running, and 2xx obviously ran.
func statusExecutes(code int) bool {
	switch {
	case code >= 200 && code < 300:
		return true
	case code == http.StatusInternalServerError, code == http.StatusBadGateway, code == http.StatusGatewayTimeout:
		return true
	default:
		return false
	}
}

// errorBody renders an OpenAI-style error object.
func errorBody(message, typ, code string) string {
	if code == "" {
		return fmt.Sprintf(`{"error":{"message":%q,"type":%q,"param":null,"code":null}}`, message, typ)
	}
	return fmt.Sprintf(`{"error":{"message":%q,"type":%q,"param":null,"code":%q}}`, message, typ, code)
}

// Misdirected replies 421 Misdirected Request with an OpenAI-style error
// body. Not executed.
func Misdirected() Behavior {
	return Status(http.StatusMisdirectedRequest, nil,
		errorBody("This connection cannot serve the requested authority.", "invalid_request_error", "misdirected_request"))
}

// TooManyRequests replies 429 with the headers in retryAfter (nil for
// none; see [RetryAfterSeconds] and friends) and an OpenAI-style
// rate-limit error body. Not executed.
func TooManyRequests(retryAfter http.Header) Behavior {
	return Status(http.StatusTooManyRequests, retryAfter,
		errorBody("Rate limit reached for requests.", "requests", "rate_limit_exceeded"))
}

// Unavailable replies 503 with the headers in retryAfter (nil for none)
// and an OpenAI-style overload error body. Not executed.
func Unavailable(retryAfter http.Header) Behavior {
	return Status(http.StatusServiceUnavailable, retryAfter,
		errorBody("The server is overloaded or not ready yet.", "server_error", ""))
}

// ServerError replies with code (500, 502, 504, …) and an OpenAI-style
// server error body. Executed or not following [Status]'s rule.
func ServerError(code int) Behavior {
	return Status(code, nil,
		errorBody("The server had an error while processing your request.", "server_error", ""))
}

// EmptyBody executes the request and replies 200, application/json, with
// a zero-length body.
func EmptyBody() Behavior {
	return Behavior{kind: kindEmptyBody, name: "EmptyBody", executes: true}
}

// NoChoices executes the request and replies 200 with a chat.completion
// whose choices array is empty.
func NoChoices() Behavior {
	return Behavior{kind: kindNoChoices, name: "NoChoices", executes: true}
}

// StreamStall executes the request, replies 200 text/event-stream, sends
// afterChunks content chunks (whatever the request's "stream" field says)
// and then sends nothing more until the client resets the stream, the
// connection closes or the Provider is closed. Chunk i (from 1) carries
// content "chunkI", with a leading space after the first, so the partial
// text of StreamStall(3) is "chunk1 chunk2 chunk3". Negative counts are
// treated as 0.
func StreamStall(afterChunks int) Behavior {
	return Behavior{kind: kindStreamStall, name: "StreamStall(" + strconv.Itoa(afterChunks) + ")", chunks: max(afterChunks, 0), executes: true}
}

// StreamCut executes the request, replies 200 text/event-stream, sends
// afterChunks content chunks like [StreamStall] and then ends the stream
// as how says: [CutReset] or [CutClose]. Unknown modes act as CutReset.
func StreamCut(afterChunks int, how CutMode) Behavior {
	return Behavior{
		kind:     kindStreamCut,
		name:     fmt.Sprintf("StreamCut(%d,%s)", afterChunks, how),
		chunks:   max(afterChunks, 0),
		cut:      how,
		executes: true,
	}
}

// BodyCut executes the request and replies like [Status] (code, the
// headers in header, Content-Type application/json unless header sets
// it), sends body without END_STREAM and without a content-length, and
// then ends the stream as how says: a body that dies mid-way, a JSON
// answer or an error object that never finishes. Executed or not
// following Status's rule; unknown modes act as CutReset.
func BodyCut(code int, header http.Header, body string, how CutMode) Behavior {
	return Behavior{
		kind:     kindBodyCut,
		name:     fmt.Sprintf("BodyCut(%d,%s)", code, how),
		status:   code,
		header:   header.Clone(),
		body:     body,
		cut:      how,
		executes: statusExecutes(code),
	}
}

// Hold executes the request (records it) and never answers, until the
// client resets the stream, the connection closes or the Provider is
// closed.
func Hold() Behavior {
	return Behavior{kind: kindHold, name: "Hold", executes: true}
}

// RetryAfterSeconds returns a header set with "Retry-After: n".
func RetryAfterSeconds(n int) http.Header {
	return http.Header{"Retry-After": {strconv.Itoa(n)}}
}

// RetryAfterDate returns a header set with Retry-After as an HTTP-date
// (http.TimeFormat, in UTC).
func RetryAfterDate(t time.Time) http.Header {
	return http.Header{"Retry-After": {t.UTC().Format(http.TimeFormat)}}
}

// RetryAfterMS returns a header set with "retry-after-ms: ms", the
// millisecond form some LLM providers send.
func RetryAfterMS(ms int) http.Header {
	h := make(http.Header)
	h.Set("retry-after-ms", strconv.Itoa(ms))
	return h
}

// RetryAfterRaw returns a header set with Retry-After set verbatim to v,
// for testing how a client copes with garbage.
func RetryAfterRaw(v string) http.Header {
	return http.Header{"Retry-After": {v}}
}
