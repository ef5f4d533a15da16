package responses

import (
	"net/http"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/gateway/openaiwire"
)

// Path is the endpoint the surface serves.
const Path = "/v1/responses"

// Surface is the Responses surface (answer.Surface); it reads the key and
// renders problems as every OpenAI surface does (openaiwire.Door). The
// zero value is ready; it has no state.
type Surface struct{ openaiwire.Door }

var _ answer.Surface = Surface{}

// Name labels its requests "responses".
func (Surface) Name() string { return "responses" }

// Routes: a response is created by POST /v1/responses (an action started,
// or the one its key names) and read by GET /v1/responses/{id}, its id
// the action id (?stream=true&starting_after=N resumes its stream after
// the event whose sequence_number is N).
func (Surface) Routes() []answer.Route {
	return []answer.Route{
		{Method: http.MethodPost, Path: Path, Op: answer.Start},
		{Method: http.MethodGet, Path: Path + "/{id}", Op: answer.Read},
	}
}

// Parse reads a Responses body (parseRequest).
func (Surface) Parse(body []byte) (answer.Request, *answer.Problem) { return parseRequest(body) }

// Answer is the response object (RenderResponse).
func (Surface) Answer(a answer.Answer) []byte { return RenderResponse(a.Identity, a.Response) }

// Stream is the Responses event encoder; a request has no options for it.
func (Surface) Stream(id answer.Identity, _ any) answer.Encoder { return newEncoder(id, false) }
