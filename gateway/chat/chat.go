// Package chat is the gateway's OpenAI chat-completions surface: the wire
// format of POST /v1/chat/completions (a request body read into the
// envelope, an answer rendered as a chat.completion, a stream as
// chat.completion.chunk events, a problem as OpenAI's error object with
// its status and x-should-retry) over the gateway's action core. It
// decides nothing about actions (docs/gateway.md).
package chat

import (
	"net/http"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/gateway/openaiwire"
)

// Surface is the chat-completions surface (answer.Surface). The zero
// value is ready; it has no state.
type Surface struct{}

// Path is the endpoint it serves.
const Path = "/v1/chat/completions"

// Name is "chat".
func (Surface) Name() string { return "chat" }

// Routes: POST /v1/chat/completions starts (or finds) an action; GET
// /v1/chat/completions/{id} reads one (the completion's id is the action
// id), as OpenAI's stored completions are read.
func (Surface) Routes() []answer.Route {
	return []answer.Route{
		{Method: http.MethodPost, Path: Path, Op: answer.Start},
		{Method: http.MethodGet, Path: Path + "/{id}", Op: answer.Read},
	}
}

// Credential is the bearer token of the Authorization header, as every
// OpenAI SDK sends its API key (answer.BearerToken).
func (Surface) Credential(r *http.Request) (string, bool) {
	return answer.BearerToken(r.Header.Get("Authorization"))
}

// Parse reads a chat-completions body (parse).
func (Surface) Parse(body []byte) (answer.Request, *answer.Problem) { return parse(body) }

// Answer is the chat.completion (completionJSON).
func (Surface) Answer(a answer.Answer) []byte { return completionJSON(a.Identity, a.Response) }

// Problem is OpenAI's error answer (openaiwire.Render).
func (Surface) Problem(p answer.Problem) answer.Rendered { return openaiwire.Render(p) }

// Stream is the chat.completion.chunk encoder; options are the request's
// Options (nil for a resumed read, which gets the usage chunk).
func (Surface) Stream(id answer.Identity, options any) answer.Encoder {
	o, ok := options.(Options)
	if !ok {
		o = Options{IncludeUsage: true}
	}
	return &encoder{who: id, includeUsage: o.IncludeUsage}
}
