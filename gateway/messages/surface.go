package messages

import (
	"net/http"
	"strings"

	"github.com/durallm/durallm/gateway/answer"
)

// Surface is the Messages surface (answer.Surface, answer.Claimant). The
// zero value is ready; it has no state.
type Surface struct{}

// Path is the endpoint it serves.
const Path = "/v1/messages"

// Name is "messages".
func (Surface) Name() string { return "messages" }

// Routes: POST /v1/messages starts (or finds) an action; GET
// /v1/messages/{id} reads one (the message's id is the action id), its
// stream with ?stream=true&starting_after=N; count_tokens and batches are
// refused with a 501 that says why.
func (Surface) Routes() []answer.Route {
	return []answer.Route{
		{Method: http.MethodPost, Path: Path, Op: answer.Start},
		{Method: http.MethodGet, Path: Path + "/{id}", Op: answer.Read},
		{Method: http.MethodPost, Path: Path + "/count_tokens", Op: answer.Unserved, Problem: &countTokens},
		{Method: http.MethodPost, Path: Path + "/batches", Op: answer.Unserved, Problem: &batches},
	}
}

// Credential is the key as the Anthropic clients send it: x-api-key, or
// Authorization: Bearer, which the current @anthropic-ai/sdk sends
// instead (APIKey).
func (Surface) Credential(r *http.Request) (string, bool) { return APIKey(r.Header) }

// Parse reads a Messages body (parseRequest). Every answer to it carries
// x-should-retry: false unless its own says otherwise (a refusal where
// nothing started says true): anthropic-sdk-go sends a request again when
// it cannot read a 200's body unless the 200 says false, and a keyless
// request sent again is a new action; @anthropic-ai/sdk reads the header
// only on an error status. The members set aside are named in
// IgnoredHeader.
func (Surface) Parse(body []byte) (answer.Request, *answer.Problem) {
	req, p := parseRequest(body)
	if p != nil {
		return answer.Request{}, p
	}
	h := http.Header{}
	h.Set("X-Should-Retry", "false")
	if len(req.Ignored) > 0 {
		h.Set(IgnoredHeader, strings.Join(req.Ignored, ", "))
	}
	return answer.Request{Model: req.Model, Stream: req.Stream, Request: req.Envelope, Header: h}, nil
}

// Answer is the Messages response (RenderMessage).
func (Surface) Answer(a answer.Answer) []byte { return RenderMessage(a.Identity, a.Response) }

// Problem is Anthropic's error answer (render).
func (Surface) Problem(p answer.Problem) answer.Rendered { return render(p) }

// Stream is the Messages event encoder; a request has no options for it.
func (Surface) Stream(id answer.Identity, _ any) answer.Encoder { return newEncoder(id) }

// Claims a request that carries anthropic-version, as every Anthropic
// client sends (WantsAnthropic): its GET /v1/models is Anthropic's.
func (Surface) Claims(r *http.Request) bool { return WantsAnthropic(r.Header) }

// Models is GET /v1/models in Anthropic's shape (ModelsJSON).
func (Surface) Models(names []string) []byte { return ModelsJSON(names) }

// Model is GET /v1/models/{id} in Anthropic's shape (ModelJSON).
func (Surface) Model(name string) []byte { return ModelJSON(name) }

var _ answer.Claimant = Surface{}
