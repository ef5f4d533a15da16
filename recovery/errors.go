package recovery

import (
	"errors"
	"fmt"

	"github.com/durallm/durallm/evidence"
	"golang.org/x/net/http2"
)

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

// ErrUnsupportedScheme is returned for a URL the engine cannot speak.
var ErrUnsupportedScheme = errors.New("recovery: unsupported URL scheme")

// ErrAttemptReused is returned when one Attempt is sent twice.
var ErrAttemptReused = errors.New("recovery: an Attempt carries one request; create a new one per attempt")

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
		return fmt.Sprintf("recovery: attempt %s: server sent GOAWAY (last stream %d, %s)", e.AttemptID, ga.LastStreamID, evidence.ErrCode(ga.ErrCode))
	}
	return "recovery: attempt " + e.AttemptID + ": " + e.Err.Error()
}

func (e *AttemptError) Unwrap() error { return e.Err }
