package answer

import (
	"net/http"
	"strings"

	"github.com/durallm/durallm/providers"
)

// Surface is one front door of the gateway: the wire format of one API
// (OpenAI chat completions in package gateway/chat) over the one action
// core. The core owns everything else: callers and their tokens, limits,
// idempotency (keys, fingerprints, action ids), the action (start, attach,
// replay, a caller's disconnect), which answer an outcome gets, the wait
// for the result, and streams (following the worker's hub, replay,
// resumption, keep-alives, holding the status until the first content).
//
// To add a surface, write a package with a type that implements Surface
// and add it to gateway.Options.Surfaces:
//
//   - Routes names the paths it serves and what the core does there;
//     a surface whose clients mark their requests may also claim the
//     endpoints every API shares (Claimant);
//   - Credential reads the caller's token as the API's clients send it;
//   - Parse turns a request body into the envelope (providers.Request),
//     refusing what it cannot carry with a Problem naming the field;
//   - Answer renders an ended action's answer, Problem a problem (its
//     status, headers and body: the status each Kind gets is the
//     surface's, with the rule of Kind.MayHaveRun);
//   - Stream returns an Encoder for one stream of an action's answer.
//
// A Surface is used from many requests at once: it must be safe for
// concurrent use (a type without state is). Nothing it returns may quote
// a token or an Idempotency-Key; a Problem's Message is what the caller
// reads.
type Surface interface {
	// Name labels the surface's requests in the log and metrics.
	Name() string
	// Routes are the requests it serves.
	Routes() []Route
	// Credential returns the token the request carries, as the API's
	// clients send it (Authorization: Bearer, or an API key header); ok
	// is false when it carries none.
	Credential(r *http.Request) (token string, ok bool)
	// Parse reads a Start request's body. A problem is an InvalidRequest
	// naming the field (Param), never quoting its value.
	Parse(body []byte) (Request, *Problem)
	// Answer is an ended action's answer as the body of a 200
	// (application/json). The same answer must render the same bytes: a
	// replay is compared byte for byte.
	Answer(a Answer) []byte
	// Problem renders a problem as the API's error answer.
	Problem(p Problem) Rendered
	// Stream returns the encoder of one stream of the action's answer.
	// options are what Parse put in Request.Options, nil for a stream no
	// request of this surface asked for (a resumed read).
	Stream(id Identity, options any) Encoder
}

// Route is one request a surface serves.
type Route struct {
	// Method is the HTTP method; another method on the path is a 405.
	Method string
	// Path is the request's path: exact, or with one segment "{id}"
	// that stands for an action id (path-escaped by the client).
	Path string
	// Op is what the core does.
	Op Op
	// Problem is, for Unserved, the answer: why the endpoint is not
	// served.
	Problem *Problem
}

// Op is what the core does for a route.
type Op int

const (
	// Start reads the body (Surface.Parse) and answers it with an
	// action: a new one, or the one its Idempotency-Key names; as JSON
	// (Surface.Answer, after waiting) or, when the request asked for a
	// stream, as server-sent events (Surface.Stream).
	Start Op = iota + 1
	// Read answers with the action the {id} names (the caller's own, or
	// any for an operator): its answer if it ended, an InProgress
	// problem if not; with ?stream=true its stream, live until it ends,
	// after the numbered event starting_after=N when given.
	Read
	// Unserved answers the route's Problem once the caller is
	// authenticated: an endpoint of the API that the gateway knows and
	// does not serve, refused with a message that says why.
	Unserved
)

// Request is a Start request as the core needs it.
type Request struct {
	// Model names one of the gateway's models.
	Model string
	// Stream asks for server-sent events.
	Stream bool
	// Request is what the action sends upstream.
	Request providers.Request
	// Options are the surface's own settings for its answer (such as
	// chat's stream_options.include_usage), opaque to the core and
	// handed back to Stream.
	Options any
	// Header is set on every answer to the request, whatever it is (an
	// answer, a stream, a problem, whose own headers replace those it
	// names): what the surface says of the request itself, such as the
	// members it set aside. Nil for none.
	Header http.Header
}

// Claimant is a surface whose clients mark every request they send
// (Anthropic's send anthropic-version). The endpoints that every API of
// the gateway shares (GET /v1/models, GET /v1/models/{id}, and the answer
// to a path nobody serves) answer such a request in the claimant's shape,
// its credential read as the claimant reads it; any other request gets
// chat's.
type Claimant interface {
	Surface
	// Claims reports whether r comes from one of its clients.
	Claims(r *http.Request) bool
	// Models is GET /v1/models's body: the models named, in order.
	Models(names []string) []byte
	// Model is GET /v1/models/{id}'s body for the model named.
	Model(name string) []byte
}

// Rendered is an answer as HTTP: its status, the headers to set and the
// body.
type Rendered struct {
	Status int
	Header http.Header
	Body   []byte
}

// Encoder renders one stream of an action's answer as the surface's
// server-sent events. The core calls Start once, right after the stream's
// 200; then Delta for each of the answer's deltas, in order, from the
// first, each once (live from a worker, or rebuilt from the action's
// result: the same deltas either way); then, once the action ended, End
// with its answer, or Fail with the problem it ended with.
//
// An Encoder must be deterministic: the events it returns, and their
// numbers, are a function of what it was fed. A stream resumed on any
// gateway (starting_after=N) is re-encoded from the first delta, and the
// core skips the numbered events up to N; the caller gets exactly what it
// had not read. It is used by one stream at a time.
type Encoder interface {
	// Start is what opens the stream (nothing, for chat completions).
	Start() []Event
	// Delta renders one delta.
	Delta(d Delta) []Event
	// End renders the end of a stream whose action ended with an
	// answer: what the deltas did not carry (a finish reason, usage),
	// then the end marker, or the in-band StreamIncomplete error of a
	// partial answer.
	End(a Answer) []Event
	// Fail renders a problem after the stream's 200: the in-band error
	// that ends the stream.
	Fail(p Problem) []Event
}

// BearerToken reads an Authorization header's bearer token as RFC 9110
// writes it: the scheme "Bearer" (in any case), one or more spaces, the
// token; spaces and tabs after it are dropped, nothing else is. ok is
// false for another scheme or no token; the core refuses a token that is
// not visible ASCII.
func BearerToken(header string) (token string, ok bool) {
	scheme, rest, found := strings.Cut(header, " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.Trim(rest, " \t")
	return token, token != ""
}
