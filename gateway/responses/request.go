package responses

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/providers"
)

// IgnoredHeader is the answers' header that names, comma-separated, the
// members of the request that were read and set aside.
const IgnoredHeader = "X-Durallm-Ignored"

// IgnoredMembers are the members a Responses request may carry that are
// read and set aside, because leaving them out changes neither what is
// asked nor the answer's shape:
//   - store: every response is an action, kept in Temporal for its
//     namespace's retention whatever store says; store: false does not
//     shorten that (docs/gateway.md);
//   - metadata: the caller's labels for the response, never sent upstream
//     (an OpenAI-compatible server refuses metadata without its own store);
//   - service_tier: a capacity choice, not a request for another answer;
//   - stream_options.include_obfuscation: the gateway's events carry no
//     obfuscation padding;
//   - id and status on an input item: what a client echoes of an earlier
//     answer's item; its content is what the model reads.
//
// Every other member the envelope cannot carry (built-in tools,
// conversation, reasoning, prompt, include, truncation: auto, ...) is a
// 400 naming it: running a request without what it asked for would answer
// another question.
var IgnoredMembers = []string{"input[].id", "input[].status", "metadata", "service_tier", "store", "stream_options.include_obfuscation"}

// The top-level members parseRequest reads; any other is refused.
var topMembers = map[string]bool{
	"model": true, "input": true, "instructions": true, "stream": true, "store": true, "metadata": true,
	"temperature": true, "top_p": true, "max_output_tokens": true, "tools": true, "tool_choice": true,
	"parallel_tool_calls": true, "text": true, "user": true, "service_tier": true, "stream_options": true,
	"truncation": true, "include": true, "background": true, "previous_response_id": true,
}

// problem is a 400 naming the member (param) in Responses' own form,
// input[2].content[0].type; its message never quotes a value.
func problem(param, msg string) *answer.Problem {
	return &answer.Problem{Kind: answer.InvalidRequest, Param: param, Message: msg}
}

// refused is the 400 for a member the envelope cannot carry.
func refused(param string) *answer.Problem {
	return problem(param, param+" is not supported by durallm's gateway: the request is refused rather than run without it")
}

// storedOnly is the 400 for a member that only the gateway's stored
// responses serve (ParseState reads and removes it before Parse): Parse
// alone, without the core's stored ops, cannot honour it.
func storedOnly(param string) *answer.Problem {
	return problem(param, param+" is served only through the gateway's stored responses, which read it before the request is parsed")
}

// members reads raw as a JSON object, its null members dropped; ok is
// false for anything but an object.
func members(raw json.RawMessage) (map[string]json.RawMessage, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		return nil, false
	}
	for k, v := range m {
		if t := bytes.TrimSpace(v); len(t) == 0 || string(t) == "null" {
			delete(m, k)
		}
	}
	return m, true
}

// text is raw as a string; ok is false for anything else.
func text(raw json.RawMessage) (string, bool) {
	var s string
	return s, json.Unmarshal(raw, &s) == nil
}

// kind is an object's type member, "" when it has none.
func kind(m map[string]json.RawMessage) string {
	s, _ := text(m["type"])
	return s
}

// reader reads one request, stopping at the first problem; ignored
// collects the members set aside.
type reader struct {
	ignored map[string]bool
}

// only refuses any member of m at path other than those named: the first
// by name, so that the answer is the same on every run.
func only(path string, m map[string]json.RawMessage, allowed ...string) *answer.Problem {
	first := ""
	for k := range m {
		if !slices.Contains(allowed, k) && (first == "" || k < first) {
			first = k
		}
	}
	if first != "" {
		return refused(path + "." + first)
	}
	return nil
}

// parseRequest reads a POST /v1/responses body into the envelope, which
// the action carries: the request in the chat shape every route reads
// (docs/providers.md), with max_tokens (from max_output_tokens),
// temperature, top_p, user and parallel_tool_calls as params. The members
// it set aside are named in the header IgnoredHeader of every answer to
// the request, sorted, each once.
func parseRequest(body []byte) (answer.Request, *answer.Problem) {
	rd := reader{ignored: map[string]bool{}}
	req, p := rd.request(body)
	if p != nil {
		return answer.Request{}, p
	}
	if len(rd.ignored) > 0 {
		names := make([]string, 0, len(rd.ignored))
		for k := range rd.ignored {
			names = append(names, k)
		}
		sort.Strings(names)
		req.Header = http.Header{IgnoredHeader: {strings.Join(names, ", ")}}
	}
	return req, nil
}

func (rd *reader) request(body []byte) (answer.Request, *answer.Problem) {
	dec := json.NewDecoder(bytes.NewReader(body))
	var raw json.RawMessage
	if dec.Decode(&raw) != nil || dec.More() {
		return answer.Request{}, problem("", "the request body must be a JSON object")
	}
	top, ok := members(raw)
	if !ok {
		return answer.Request{}, problem("", "the request body must be a JSON object")
	}
	keys := make([]string, 0, len(top))
	for k := range top {
		keys = append(keys, k)
	}
	// The first unknown member by name, so the answer is the same on
	// every run.
	sort.Strings(keys)
	for _, k := range keys {
		if !topMembers[k] {
			return answer.Request{}, refused(k)
		}
	}
	var req answer.Request
	if req.Model, ok = text(top["model"]); !ok || strings.TrimSpace(req.Model) == "" {
		return answer.Request{}, problem("model", "model is required: one of the gateway's models (GET /v1/models)")
	}
	var background, store, parallel bool
	for _, f := range []struct {
		name string
		v    *bool
	}{{"stream", &req.Stream}, {"background", &background}, {"store", &store}, {"parallel_tool_calls", &parallel}} {
		if raw, has := top[f.name]; has && json.Unmarshal(raw, f.v) != nil {
			return answer.Request{}, problem(f.name, f.name+" must be true or false")
		}
	}
	if background {
		return answer.Request{}, storedOnly("background")
	}
	if _, has := top["previous_response_id"]; has {
		return answer.Request{}, storedOnly("previous_response_id")
	}
	if _, has := top["store"]; has {
		rd.ignored["store"] = true
	}
	env := &req.Request
	env.Stream = req.Stream
	params := map[string]json.RawMessage{}
	if raw, has := top["instructions"]; has {
		s, ok := text(raw)
		if !ok {
			return answer.Request{}, problem("instructions", "instructions must be a string")
		}
		if s != "" {
			env.Messages = append(env.Messages, providers.TextMessage("system", s))
		}
	}
	in, p := rd.input(top["input"])
	if p != nil {
		return answer.Request{}, p
	}
	env.Messages = append(env.Messages, in...)
	if p := rd.settings(top, params); p != nil {
		return answer.Request{}, p
	}
	if raw, has := top["tools"]; has {
		var tools []json.RawMessage
		if json.Unmarshal(raw, &tools) != nil {
			return answer.Request{}, problem("tools", "tools must be an array of tools")
		}
		for i, t := range tools {
			ft, p := functionTool("tools["+strconv.Itoa(i)+"]", t)
			if p != nil {
				return answer.Request{}, p
			}
			env.Tools = append(env.Tools, ft)
		}
	}
	if raw, has := top["tool_choice"]; has {
		if env.ToolChoice, p = toolChoice(raw); p != nil {
			return answer.Request{}, p
		}
	}
	if raw, has := top["parallel_tool_calls"]; has && len(env.Tools) > 0 {
		// Without tools there are no parallel calls to turn off, and an
		// OpenAI-compatible server refuses the member.
		params["parallel_tool_calls"] = bytes.TrimSpace(raw)
	}
	if raw, has := top["text"]; has {
		if env.ResponseFormat, p = textFormat(raw); p != nil {
			return answer.Request{}, p
		}
	}
	if len(params) > 0 {
		env.Params = params
	}
	// The envelope's own check; its message never quotes a value.
	if err := env.Validate(); err != nil {
		return answer.Request{}, problem("", err.Error())
	}
	return req, nil
}

// settings reads the members that go upstream as params, and those set
// aside.
func (rd *reader) settings(top map[string]json.RawMessage, params map[string]json.RawMessage) *answer.Problem {
	for _, k := range []string{"temperature", "top_p"} {
		if raw, has := top[k]; has {
			var n float64
			if json.Unmarshal(raw, &n) != nil {
				return problem(k, k+" must be a number")
			}
			params[k] = bytes.TrimSpace(raw)
		}
	}
	if raw, has := top["max_output_tokens"]; has {
		var n float64
		if json.Unmarshal(raw, &n) != nil || n < 1 || n != float64(int64(n)) {
			return problem("max_output_tokens", "max_output_tokens must be a whole number of at least 1")
		}
		// max_tokens, the name every OpenAI-compatible server reads, as
		// the Messages surface sends it.
		params["max_tokens"] = bytes.TrimSpace(raw)
	}
	if raw, has := top["user"]; has {
		if _, ok := text(raw); !ok {
			return problem("user", "user must be a string")
		}
		params["user"] = bytes.TrimSpace(raw)
	}
	if raw, has := top["metadata"]; has {
		var md map[string]string
		if json.Unmarshal(raw, &md) != nil {
			return problem("metadata", "metadata must be an object of strings")
		}
		if len(md) > 0 {
			rd.ignored["metadata"] = true
		}
	}
	if raw, has := top["service_tier"]; has {
		if _, ok := text(raw); !ok {
			return problem("service_tier", "service_tier must be a string")
		}
		rd.ignored["service_tier"] = true
	}
	if raw, has := top["stream_options"]; has {
		so, ok := members(raw)
		if !ok {
			return problem("stream_options", "stream_options must be an object")
		}
		if p := only("stream_options", so, "include_obfuscation"); p != nil {
			return p
		}
		if _, has := so["include_obfuscation"]; has {
			rd.ignored["stream_options.include_obfuscation"] = true
		}
	}
	if raw, has := top["truncation"]; has {
		// disabled is the default: the request is sent whole, and one past
		// the model's window gets the provider's refusal.
		if s, _ := text(raw); s != "disabled" {
			return refused("truncation")
		}
	}
	if raw, has := top["include"]; has {
		var inc []string
		if json.Unmarshal(raw, &inc) != nil {
			return problem("include", "include must be an array of strings")
		}
		if len(inc) > 0 {
			return refused("include")
		}
	}
	return nil
}

// The envelope's (OpenAI chat's) content: a part is text or an image_url.
type (
	chatPart struct {
		Type     string    `json:"type"`
		Text     *string   `json:"text,omitempty"`
		ImageURL *imageURL `json:"image_url,omitempty"`
	}
	imageURL struct {
		URL    string `json:"url"`
		Detail string `json:"detail,omitempty"`
	}
	toolCall struct {
		ID       string       `json:"id"`
		Type     string       `json:"type"`
		Function toolCallFunc `json:"function"`
	}
	toolCallFunc struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
)

// input reads input: a string (one user message) or a list of items.
func (rd *reader) input(raw json.RawMessage) ([]providers.Message, *answer.Problem) {
	if len(raw) == 0 {
		return nil, problem("input", "input is required: a string or an array of input items")
	}
	if s, ok := text(raw); ok {
		return []providers.Message{providers.TextMessage("user", s)}, nil
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil || len(items) == 0 {
		return nil, problem("input", "input must be a string or a non-empty array of input items")
	}
	var out []providers.Message
	for i, it := range items {
		path := "input[" + strconv.Itoa(i) + "]"
		m, ok := members(it)
		if !ok {
			return nil, problem(path, "an input item must be an object")
		}
		for _, k := range []string{"id", "status"} {
			if _, has := m[k]; has {
				rd.ignored["input[]."+k] = true
				delete(m, k)
			}
		}
		typ := kind(m)
		if typ == "" {
			if _, has := m["role"]; has {
				typ = "message"
			}
		}
		switch typ {
		case "message":
			msg, p := message(path, m)
			if p != nil {
				return nil, p
			}
			out = append(out, msg)
		case "function_call":
			call, p := functionCall(path, m)
			if p != nil {
				return nil, p
			}
			// Consecutive calls, and the assistant's text before them, are
			// one assistant message, as chat carries them.
			if n := len(out); n > 0 && out[n-1].Role == "assistant" {
				var calls []toolCall
				_ = json.Unmarshal(out[n-1].ToolCalls, &calls)
				out[n-1].ToolCalls, _ = json.Marshal(append(calls, call))
				continue
			}
			calls, _ := json.Marshal([]toolCall{call})
			out = append(out, providers.Message{Role: "assistant", ToolCalls: calls})
		case "function_call_output":
			msg, p := functionOutput(path, m)
			if p != nil {
				return nil, p
			}
			out = append(out, msg)
		default:
			return nil, refused(path + ".type")
		}
	}
	return out, nil
}

// message reads a message item: a user, system or developer message's
// input_text and input_image parts, an assistant message's output_text
// and refusal parts (its refusal carried as its text).
func message(path string, m map[string]json.RawMessage) (providers.Message, *answer.Problem) {
	if p := only(path, m, "type", "role", "content"); p != nil {
		return providers.Message{}, p
	}
	role, _ := text(m["role"])
	switch role {
	case "user", "system", "developer", "assistant":
	default:
		return providers.Message{}, problem(path+".role", "role must be user, assistant, system or developer")
	}
	content, has := m["content"]
	if !has {
		return providers.Message{}, problem(path+".content", "content is required")
	}
	if _, ok := text(content); ok {
		return providers.Message{Role: role, Content: bytes.TrimSpace(content)}, nil
	}
	var parts []json.RawMessage
	if json.Unmarshal(content, &parts) != nil {
		return providers.Message{}, problem(path+".content", "content must be a string or an array of content parts")
	}
	var out []any
	var said strings.Builder
	for j, raw := range parts {
		pp := path + ".content[" + strconv.Itoa(j) + "]"
		pm, ok := members(raw)
		if !ok {
			return providers.Message{}, problem(pp, "a content part must be an object")
		}
		if role == "assistant" {
			s, p := outputPart(pp, pm)
			if p != nil {
				return providers.Message{}, p
			}
			said.WriteString(s)
			continue
		}
		part, p := inputPart(pp, pm)
		if p != nil {
			return providers.Message{}, p
		}
		out = append(out, part)
	}
	if role == "assistant" {
		return providers.TextMessage("assistant", said.String()), nil
	}
	c, _ := json.Marshal(out)
	if out == nil {
		c = json.RawMessage("[]")
	}
	return providers.Message{Role: role, Content: c}, nil
}

// inputPart reads an input_text or input_image part as the envelope's.
func inputPart(path string, m map[string]json.RawMessage) (any, *answer.Problem) {
	switch kind(m) {
	case "input_text":
		if p := only(path, m, "type", "text"); p != nil {
			return nil, p
		}
		s, ok := text(m["text"])
		if !ok {
			return nil, problem(path+".text", "text is required: a string")
		}
		return chatPart{Type: "text", Text: &s}, nil
	case "input_image":
		if p := only(path, m, "type", "image_url", "detail"); p != nil {
			return nil, p
		}
		u, ok := text(m["image_url"])
		if !ok || !(strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "data:")) {
			// A file_id names a file stored at OpenAI, which no route
			// can read.
			return nil, problem(path+".image_url", "image_url is required: an http(s) or data URL")
		}
		img := chatPart{Type: "image_url", ImageURL: &imageURL{URL: u}}
		if raw, has := m["detail"]; has {
			if img.ImageURL.Detail, ok = text(raw); !ok {
				return nil, problem(path+".detail", "detail must be a string")
			}
		}
		return img, nil
	}
	return nil, refused(path + ".type")
}

// outputPart reads an earlier answer's output_text or refusal part as its
// text; the annotations and logprobs it carries are what the model said
// about its text, not something it reads back.
func outputPart(path string, m map[string]json.RawMessage) (string, *answer.Problem) {
	switch kind(m) {
	case "output_text", "input_text":
		if p := only(path, m, "type", "text", "annotations", "logprobs"); p != nil {
			return "", p
		}
		s, ok := text(m["text"])
		if !ok {
			return "", problem(path+".text", "text is required: a string")
		}
		return s, nil
	case "refusal":
		if p := only(path, m, "type", "refusal"); p != nil {
			return "", p
		}
		s, ok := text(m["refusal"])
		if !ok {
			return "", problem(path+".refusal", "refusal is required: a string")
		}
		return s, nil
	}
	return "", refused(path + ".type")
}

// functionCall reads a function_call item as a chat tool call.
func functionCall(path string, m map[string]json.RawMessage) (toolCall, *answer.Problem) {
	if p := only(path, m, "type", "call_id", "name", "arguments"); p != nil {
		return toolCall{}, p
	}
	c := toolCall{Type: "function"}
	var ok bool
	if c.ID, ok = text(m["call_id"]); !ok || c.ID == "" {
		return toolCall{}, problem(path+".call_id", "call_id is required")
	}
	if c.Function.Name, ok = text(m["name"]); !ok || c.Function.Name == "" {
		return toolCall{}, problem(path+".name", "name is required")
	}
	if c.Function.Arguments, ok = text(m["arguments"]); !ok {
		return toolCall{}, problem(path+".arguments", "arguments is required: a string")
	}
	return c, nil
}

// functionOutput reads a function_call_output item as a tool message: its
// output a string, or input_text and input_image parts.
func functionOutput(path string, m map[string]json.RawMessage) (providers.Message, *answer.Problem) {
	// name is the tool's, which the call it answers names already.
	if p := only(path, m, "type", "call_id", "output", "name"); p != nil {
		return providers.Message{}, p
	}
	id, ok := text(m["call_id"])
	if !ok || id == "" {
		return providers.Message{}, problem(path+".call_id", "call_id is required: the call_id of the function_call it answers")
	}
	msg := providers.Message{Role: "tool", ToolCallID: id}
	raw, has := m["output"]
	if !has {
		return providers.Message{}, problem(path+".output", "output is required")
	}
	if _, ok := text(raw); ok {
		msg.Content = bytes.TrimSpace(raw)
		return msg, nil
	}
	var parts []json.RawMessage
	if json.Unmarshal(raw, &parts) != nil {
		return providers.Message{}, problem(path+".output", "output must be a string or an array of content parts")
	}
	out := []any{}
	for j, pr := range parts {
		pp := path + ".output[" + strconv.Itoa(j) + "]"
		pm, ok := members(pr)
		if !ok {
			return providers.Message{}, problem(pp, "a content part must be an object")
		}
		part, p := inputPart(pp, pm)
		if p != nil {
			return providers.Message{}, p
		}
		out = append(out, part)
	}
	msg.Content, _ = json.Marshal(out)
	return msg, nil
}

// declaration is what a function tool and a json_schema format both
// declare, as chat writes them: a name, a description, a JSON schema (a
// tool's parameters, a format's schema) and strict.
type declaration struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Schema      json.RawMessage `json:"schema,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// declared reads a declaration from m at path: a tool's (its schema the
// optional member parameters) or a format's (its schema the required
// member schema).
func declared(path string, m map[string]json.RawMessage, tool bool) (declaration, *answer.Problem) {
	var d declaration
	var ok bool
	if d.Name, ok = text(m["name"]); !ok || d.Name == "" {
		return d, problem(path+".name", "name is required")
	}
	if raw, has := m["description"]; has {
		if d.Description, ok = text(raw); !ok {
			return d, problem(path+".description", "description must be a string")
		}
	}
	member, schema := "schema", &d.Schema
	if tool {
		member, schema = "parameters", &d.Parameters
	}
	if raw, has := m[member]; has || !tool {
		if _, ok := members(raw); !ok {
			return d, problem(path+"."+member, member+" must be a JSON schema object")
		}
		*schema = bytes.TrimSpace(raw)
	}
	if raw, has := m["strict"]; has {
		var b bool
		if json.Unmarshal(raw, &b) != nil {
			return d, problem(path+".strict", "strict must be true or false")
		}
		d.Strict = &b
	}
	return d, nil
}

// functionTool reads a function tool ({type, name, description,
// parameters, strict}) as a chat function tool. Any other tool (web
// search, file search, MCP, code interpreter, ...) runs at OpenAI and has
// no equivalent on a route.
func functionTool(path string, raw json.RawMessage) (json.RawMessage, *answer.Problem) {
	m, ok := members(raw)
	if !ok {
		return nil, problem(path, "a tool must be an object")
	}
	if kind(m) != "function" {
		return nil, refused(path + ".type")
	}
	if p := only(path, m, "type", "name", "description", "parameters", "strict"); p != nil {
		return nil, p
	}
	d, p := declared(path, m, true)
	if p != nil {
		return nil, p
	}
	b, _ := json.Marshal(struct {
		Type     string      `json:"type"`
		Function declaration `json:"function"`
	}{"function", d})
	return b, nil
}

// toolChoice reads tool_choice: none, auto or required, or a function by
// name, as chat's tool_choice.
func toolChoice(raw json.RawMessage) (json.RawMessage, *answer.Problem) {
	if s, ok := text(raw); ok {
		switch s {
		case "none", "auto", "required":
			return bytes.TrimSpace(raw), nil
		}
		return nil, problem("tool_choice", "tool_choice must be none, auto, required or a function")
	}
	m, ok := members(raw)
	if !ok {
		return nil, problem("tool_choice", "tool_choice must be none, auto, required or a function")
	}
	if kind(m) != "function" {
		return nil, refused("tool_choice.type")
	}
	if p := only("tool_choice", m, "type", "name"); p != nil {
		return nil, p
	}
	name, ok := text(m["name"])
	if !ok || name == "" {
		return nil, problem("tool_choice.name", "name is required for a function tool choice")
	}
	type fn struct {
		Name string `json:"name"`
	}
	b, _ := json.Marshal(struct {
		Type     string `json:"type"`
		Function fn     `json:"function"`
	}{"function", fn{name}})
	return b, nil
}

// textFormat reads text: its format as chat's response_format (nil for
// plain text).
func textFormat(raw json.RawMessage) (json.RawMessage, *answer.Problem) {
	t, ok := members(raw)
	if !ok {
		return nil, problem("text", "text must be an object")
	}
	if p := only("text", t, "format"); p != nil {
		return nil, p
	}
	fr, has := t["format"]
	if !has {
		return nil, nil
	}
	f, ok := members(fr)
	if !ok {
		return nil, problem("text.format", "text.format must be an object")
	}
	switch kind(f) {
	case "text":
		return nil, only("text.format", f, "type")
	case "json_object":
		if p := only("text.format", f, "type"); p != nil {
			return nil, p
		}
		return json.RawMessage(`{"type":"json_object"}`), nil
	case "json_schema":
	default:
		return nil, problem("text.format.type", "text.format.type must be text, json_object or json_schema")
	}
	if p := only("text.format", f, "type", "name", "schema", "description", "strict"); p != nil {
		return nil, p
	}
	d, p := declared("text.format", f, false)
	if p != nil {
		return nil, p
	}
	b, _ := json.Marshal(struct {
		Type       string      `json:"type"`
		JSONSchema declaration `json:"json_schema"`
	}{"json_schema", d})
	return b, nil
}
