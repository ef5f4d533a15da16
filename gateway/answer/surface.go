package answer

import (
	"net/http"
	"net/url"
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
	// problem if not (a Stored surface's object whatever its state:
	// Stored.Pending, Stored.Unanswered); with ?stream=true its stream, live until it ends,
	// after the numbered event starting_after=N when given.
	Read
	// Unserved answers the route's Problem once the caller is
	// authenticated: an endpoint of the API that the gateway knows and
	// does not serve, refused with a message that says why.
	Unserved
	// Cancel cancels the action the {id} names, the caller's own, as the
	// caller's stop (origin user_stop; operator_stop for an operator),
	// waits a moment for it to end, and answers with it as Read does
	// (Stored.Unanswered once canceled). An action that had ended is
	// answered as it ended. The surface must be Stored.
	Cancel
	// Delete deletes the action the {id} names, the caller's own: a
	// running one is canceled first (user_stop) and waited for; then its
	// execution is deleted from Temporal, so that every gateway answers
	// NotFound for it from then on (Stored.Deleted). The surface must be
	// Stored.
	Delete
	// Items answers the items of the request of the action the {id}
	// names, the caller's own, read from the action's durable input
	// (Stored.Items). The surface must be Stored.
	Items
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
	// State is what the request asks of a Stored surface's ops: none
	// for another surface's.
	State
}

// State is what a Start request asks of the stored ops.
type State struct {
	// Background asks for the answer at once, before the action ends: a
	// Stored surface's rendering of the running action (Stored.Pending),
	// or, with Stream, its stream. The caller reads it later (Read); its
	// leaving never cancels the action (on_disconnect continue). Only a
	// Stored surface may set it.
	Background bool
	// Continues names the earlier action whose conversation the request
	// continues (OpenAI's previous_response_id), nil for none. The core
	// loads that action's request and answer from Temporal and the result
	// store, for the same caller and surface only, and hands them to
	// Continuer.Continue, which composes the request. Only a Continuer
	// may set it.
	Continues *Continuation
	// Keep is what the surface keeps of the request beside the action
	// (in its memo), handed back as Identity.Kept to every rendering of
	// the action and to Continue: a few members, such as whether the
	// request's first message is its instructions. At most MaxKept
	// bytes; nil for none.
	Keep []byte
}

// StateParser is a surface that reads a Start request's State apart
// from the rest of its body: the core hands it the body first, Parse gets
// the rest (the body without the members State holds), and the core sets
// the State on the Request Parse returns. A surface whose Parse reads the
// State itself needs none.
type StateParser interface {
	Surface
	// ParseState returns the body without the members it read, and what
	// they ask; a problem is an InvalidRequest naming the member.
	ParseState(body []byte) (rest []byte, st State, p *Problem)
}

// MaxKept bounds Request.Keep: it lives in the action's memo, which
// Temporal keeps small.
const MaxKept = 2048

// Continuation names the earlier action a request continues.
type Continuation struct {
	// ID is the earlier action's id.
	ID string
	// Param names the request's member that named it, for a problem.
	Param string
}

// Stored is a surface whose API keeps each answer as an object the
// caller reads again whatever its state (OpenAI's Responses: a response
// object with a status). Its routes may use the Cancel, Delete and Items
// ops and its requests Background; where another surface answers a
// running or an unanswered action with a problem, the core answers a
// Read with the object.
type Stored interface {
	Surface
	// StoredRoutes are the routes of the stored ops (Cancel, Delete,
	// Items), served beside Routes; nil when Routes names them.
	StoredRoutes() []Route
	// Pending renders a running action as the API's object: the answer
	// to a Background start, and to a Read while it runs. state is the
	// action's state (queued, dispatching, backing_off,
	// awaiting_reconciliation).
	Pending(who Identity, state string) []byte
	// Unanswered renders an action that ended without an answer (its
	// problem p: canceled, failed, ...) as the API's object, the body of
	// a 200 to a Read or a Cancel.
	Unanswered(who Identity, p Problem) []byte
	// Deleted is the body of the 200 to a Delete of the action id.
	Deleted(id string) []byte
	// Items renders the items of the action's request, as the started
	// action holds it, selected by the query (q: order, limit, after, as
	// the API pages them); a problem is an InvalidRequest naming the
	// query's member.
	Items(who Identity, req providers.Request, q url.Values) ([]byte, *Problem)
}

// Continuer is a surface whose requests may continue an earlier action's
// conversation (Request.Continues).
type Continuer interface {
	Surface
	// Continue composes the request that continues earlier: typically
	// earlier's conversation, then its answer, then the new request's
	// input. A problem is an InvalidRequest naming the member.
	Continue(req Request, earlier Earlier) (Request, *Problem)
}

// Earlier is an ended action a request continues, as Temporal and the
// result store keep it, never a gateway's memory.
type Earlier struct {
	Identity
	// Request is what the action sent upstream, as it was started.
	Request providers.Request
	// Answer is its answer: the action completed (whole or partial).
	Answer Answer
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
