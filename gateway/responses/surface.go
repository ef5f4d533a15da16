package responses

import (
	"net/http"
	"strings"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/gateway/openaiwire"
)

// Surface is the Responses surface (answer.Surface). The zero value is
// ready; it has no state.
type Surface struct{}

// Path is the endpoint it serves.
const Path = "/v1/responses"

// Name is "responses".
func (Surface) Name() string { return "responses" }

// Routes: POST /v1/responses starts (or finds) an action; GET
// /v1/responses/{id} reads one (the response's id is the action id), its
// stream with ?stream=true&starting_after=N, N a sequence_number.
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

// Parse reads a Responses body (parseRequest). The members set aside are
// named in IgnoredHeader.
func (Surface) Parse(body []byte) (answer.Request, *answer.Problem) {
	req, p := parseRequest(body)
	if p != nil {
		return answer.Request{}, p
	}
	var h http.Header
	if len(req.Ignored) > 0 {
		h = http.Header{}
		h.Set(IgnoredHeader, strings.Join(req.Ignored, ", "))
	}
	return answer.Request{Model: req.Model, Stream: req.Stream, Request: req.Envelope, Header: h}, nil
}

// Answer is the response object (RenderResponse).
func (Surface) Answer(a answer.Answer) []byte { return RenderResponse(a.Identity, a.Response) }

// Problem is OpenAI's error answer (openaiwire.Render), as chat's.
func (Surface) Problem(p answer.Problem) answer.Rendered { return openaiwire.Render(p) }

// Stream is the Responses event encoder; a request has no options for it.
func (Surface) Stream(id answer.Identity, _ any) answer.Encoder { return newEncoder(id, false) }

var _ answer.Surface = Surface{}
