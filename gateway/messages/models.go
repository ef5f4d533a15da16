package messages

import (
	"encoding/json"
	"net/http"

	"github.com/durallm/durallm/gateway/answer"
)

// VersionHeader is the header every Anthropic client sends, and by which
// GET /v1/models knows to answer in Anthropic's shape. Any version is
// served: the current SDKs send a dated version newer than 2023-06-01.
const VersionHeader = "anthropic-version"

// WantsAnthropic reports whether a request comes from an Anthropic client
// (it carries anthropic-version), which expects Anthropic's shapes.
func WantsAnthropic(h http.Header) bool { return h.Get(VersionHeader) != "" }

// APIKey is the key an Anthropic client sends: x-api-key, or
// Authorization: Bearer (read as answer.BearerToken reads it), which the
// current SDKs send instead.
func APIKey(h http.Header) (string, bool) {
	if k := h.Get("X-Api-Key"); k != "" {
		return k, true
	}
	return answer.BearerToken(h.Get("Authorization"))
}

// wireModel is a model as GET /v1/models lists it. Its release date is
// unknown (the epoch, as Anthropic's reference allows), and so are its
// window and line, which are left out rather than invented.
type wireModel struct {
	Type         string  `json:"type"`
	ID           string  `json:"id"`
	DisplayName  string  `json:"display_name"`
	CreatedAt    string  `json:"created_at"`
	Lifecycle    string  `json:"lifecycle"`
	DeprecatedAt *string `json:"deprecated_at"`
	RetiresAt    *string `json:"retires_at"`
}

func model(id string) wireModel {
	return wireModel{Type: "model", ID: id, DisplayName: id, CreatedAt: "1970-01-01T00:00:00Z", Lifecycle: "active"}
}

// ModelsJSON is GET /v1/models in Anthropic's shape, one page holding every
// model named: {"data": [...], "has_more": false, "first_id", "last_id"}.
func ModelsJSON(ids []string) []byte {
	page := struct {
		Data    []wireModel `json:"data"`
		HasMore bool        `json:"has_more"`
		FirstID *string     `json:"first_id"`
		LastID  *string     `json:"last_id"`
	}{Data: []wireModel{}}
	for _, id := range ids {
		page.Data = append(page.Data, model(id))
	}
	if len(ids) > 0 {
		page.FirstID, page.LastID = &ids[0], &ids[len(ids)-1]
	}
	b, _ := json.Marshal(page) // only marshallable values
	return append(b, '\n')
}

// ModelJSON is GET /v1/models/{id} in Anthropic's shape.
func ModelJSON(id string) []byte {
	b, _ := json.Marshal(model(id)) // only marshallable values
	return append(b, '\n')
}

// countTokens is the answer to POST /v1/messages/count_tokens: 501, not
// retried. A count depends on the model that would answer, and an action
// chooses its route only when it runs (and may fall back to another
// vendor's), so the gateway cannot count for it.
var countTokens = answer.Problem{Kind: answer.NotImplemented,
	Message: "POST /v1/messages/count_tokens is not served by durallm's gateway: a count depends on the model that answers, " +
		"and an action chooses its route (possibly another vendor's) only when it runs; send the request to /v1/messages, " +
		"whose answer's usage has the counts"}

// batches is the answer to POST /v1/messages/batches: 501, not retried.
var batches = answer.Problem{Kind: answer.NotImplemented,
	Message: "POST /v1/messages/batches is not served by durallm's gateway: send each request to /v1/messages, " +
		"where each is a durable action of its own (with an Idempotency-Key, found again rather than run twice)"}
