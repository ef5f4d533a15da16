package chat

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/durallm/durallm/gateway/answer"
)

// Options are a request's settings for its answer.
type Options struct {
	// IncludeUsage asks for the usage chunk at the end of a stream
	// (stream_options.include_usage).
	IncludeUsage bool
}

// The members the gateway reads itself; every other one passes through to
// the provider as a parameter.
var ownMembers = map[string]bool{
	"model": true, "messages": true, "stream": true, "stream_options": true, "n": true,
	"tools": true, "tool_choice": true, "response_format": true,
}

// parse reads a chat-completions body into the envelope; upstream, usage
// is always asked for. A problem names the member (param), never quoting
// its value.
func parse(body []byte) (answer.Request, *answer.Problem) {
	var members map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&members); err != nil || members == nil || dec.More() {
		return answer.Request{}, badRequest("", "the request body must be a JSON object")
	}
	var cr answer.Request
	var opts Options
	if err := decodeMember(members, "model", &cr.Model); err != nil || strings.TrimSpace(cr.Model) == "" {
		return answer.Request{}, badRequest("model", "model must name one of the gateway's models (GET /v1/models)")
	}
	if err := decodeMember(members, "stream", &cr.Stream); err != nil {
		return answer.Request{}, badRequest("stream", "stream must be true or false")
	}
	if raw, ok := members["stream_options"]; ok && !isNull(raw) {
		var so struct {
			IncludeUsage *bool `json:"include_usage"`
		}
		if json.Unmarshal(raw, &so) != nil {
			return answer.Request{}, badRequest("stream_options", "stream_options must be an object")
		}
		opts.IncludeUsage = so.IncludeUsage != nil && *so.IncludeUsage
	}
	if raw, ok := members["n"]; ok && !isNull(raw) {
		var n float64
		if json.Unmarshal(raw, &n) != nil || n != 1 {
			return answer.Request{}, badRequest("n", "n must be 1: an action has one answer")
		}
	}
	r := &cr.Request
	r.Stream = cr.Stream
	if err := decodeMember(members, "messages", &r.Messages); err != nil {
		return answer.Request{}, badRequest("messages", "messages must be an array of message objects")
	}
	if err := decodeMember(members, "tools", &r.Tools); err != nil {
		return answer.Request{}, badRequest("tools", "tools must be an array")
	}
	r.ToolChoice = nonNull(members["tool_choice"])
	r.ResponseFormat = nonNull(members["response_format"])
	for k, v := range members {
		if ownMembers[k] || isNull(v) {
			continue
		}
		if r.Params == nil {
			r.Params = make(map[string]json.RawMessage)
		}
		r.Params[k] = v
	}
	if cr.Stream {
		if r.Params == nil {
			r.Params = make(map[string]json.RawMessage)
		}
		// Usage is always asked for upstream; the caller gets the usage
		// chunk only if it asked.
		r.Params["stream_options"] = json.RawMessage(`{"include_usage":true}`)
	}
	if len(r.Messages) == 0 {
		return answer.Request{}, badRequest("messages", "messages must not be empty")
	}
	for i, m := range r.Messages {
		if m.Role == "" {
			return answer.Request{}, badRequest("messages["+strconv.Itoa(i)+"].role", "every message needs a role")
		}
	}
	// The envelope's own check names every other bad field; its message
	// never quotes a value.
	if err := r.Validate(); err != nil {
		return answer.Request{}, badRequest("", err.Error())
	}
	cr.Options = opts
	return cr, nil
}

func badRequest(param, message string) *answer.Problem {
	return &answer.Problem{Kind: answer.InvalidRequest, Param: param, Message: message}
}

// decodeMember decodes members[name] into v; an absent or null member
// leaves v as it is.
func decodeMember(members map[string]json.RawMessage, name string, v any) error {
	raw, ok := members[name]
	if !ok || isNull(raw) {
		return nil
	}
	return json.Unmarshal(raw, v)
}

func isNull(raw json.RawMessage) bool {
	return len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null"
}

func nonNull(raw json.RawMessage) json.RawMessage {
	if isNull(raw) {
		return nil
	}
	return raw
}
