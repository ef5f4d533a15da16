package messages

import (
	"bytes"
	"encoding/json"
	"sort"
	"strconv"
	"strings"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/exchange"
)

// parsed is a POST /v1/messages body read into the envelope.
type parsed struct {
	// Model names a model of the gateway's configuration.
	Model string
	// Stream asks for the event stream.
	Stream bool
	// Envelope is what the action carries: the request in the OpenAI
	// chat-completions shape every route reads (docs/providers.md), with
	// max_tokens, stop (from stop_sequences), temperature, top_p, top_k,
	// user (from metadata.user_id) and parallel_tool_calls (false, from
	// disable_parallel_tool_use, when there are tools) as params. They go
	// upstream under those names: max_tokens is the one every
	// OpenAI-compatible server reads (OpenAI's reasoning models want
	// max_completion_tokens and refuse it), and top_k is not OpenAI's (its
	// API refuses it; local servers read it).
	Envelope providers.Request
	// Ignored names the members that were read and set aside as harmless
	// (IgnoredMembers), sorted, each once, for the answers' IgnoredHeader.
	Ignored []string
}

// IgnoredHeader is the answers' header that names, comma-separated, the
// members of their request that were set aside, so that leaving them out
// is never silent.
const IgnoredHeader = "X-Durallm-Ignored"

// IgnoredMembers are the members a Messages request may carry that the
// envelope cannot, and that are set aside rather than refused because
// leaving them out changes neither what is asked nor the answer's shape:
//   - cache_control (anywhere): a prompt-caching hint; it changes cost and
//     latency, never the answer;
//   - thinking (the member, and thinking and redacted_thinking blocks in
//     an assistant turn): extended thinking is not asked for upstream (no
//     route could carry it: an OpenAI-compatible one has no such member,
//     and the Anthropic adapter sends only what the envelope holds), so
//     the model answers without thinking first, and earlier turns' thinking
//     is only ever read back by a model that thinks;
//   - citations on a text block of an earlier turn: the text is kept;
//   - is_error on a tool_result: OpenAI's tool messages have no such flag,
//     and the result's content (which says what failed) is kept;
//   - service_tier: a capacity choice, not a request for another answer;
//   - eager_input_streaming on a tool: how finely its input is streamed;
//   - context_management: server-side context editing, which clears
//     earlier tool results or thinking from what the model reads once a
//     conversation grows past a threshold, to save its window: without it
//     the model reads all it was sent (one past the window gets the
//     provider's refusal, never another answer); Claude Code sends it
//     with prompt caching on;
//   - output_config.effort: how much the model thinks before it answers,
//     like thinking, which is not asked for upstream; Claude Code sends it.
//
// output_config.format (a JSON schema the answer must follow) is carried,
// as the envelope's response_format (json_schema, strict). Every other
// member the envelope cannot carry (documents, server tools and their
// blocks, image sources other than base64 and url, container,
// mcp_servers, inference_geo, and any member this list does not name) is
// a 400 naming it: running a request without what it asked for would
// answer another question.
var IgnoredMembers = []string{"cache_control", "citations", "context_management", "eager_input_streaming", "is_error",
	"output_config.effort", "service_tier", "thinking"}

// parseRequest reads a POST /v1/messages body. A problem is an
// InvalidRequest naming the member in Anthropic's dotted form
// (messages.0.content.1.type), never quoting its value.
func parseRequest(body []byte) (parsed, *answer.Problem) {
	p := &parser{ignored: map[string]bool{}}
	req, err := p.request(body)
	if err != nil {
		return parsed{}, err
	}
	for k := range p.ignored {
		req.Ignored = append(req.Ignored, k)
	}
	sort.Strings(req.Ignored)
	return req, nil
}

// parser reads one request; it stops at the first problem.
type parser struct {
	ignored map[string]bool
}

func invalid(param, msg string) *answer.Problem {
	return &answer.Problem{Kind: answer.InvalidRequest, Param: param, Message: msg}
}

// unsupported is the 400 for a member the envelope cannot carry.
func unsupported(param string) *answer.Problem {
	return invalid(param, "not supported by durallm's gateway: the request is refused rather than run without it")
}

// object reads raw as a JSON object; nil, false for anything else.
func object(raw json.RawMessage) (map[string]json.RawMessage, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		return nil, false
	}
	return m, true
}

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// allow checks that m has no member other than allowed ones and the
// ignored ones named, recording those it ignores.
func (p *parser) allow(path string, m map[string]json.RawMessage, allowed []string, ignorable ...string) *answer.Problem {
	for k := range m {
		if contains(allowed, k) {
			continue
		}
		if contains(ignorable, k) {
			if !empty(m[k]) {
				p.ignored[k] = true
			}
			continue
		}
		return unsupported(join(path, k))
	}
	return nil
}

// empty reports a value that asks for nothing: null, false, [] or {}.
func empty(raw json.RawMessage) bool {
	switch string(bytes.TrimSpace(raw)) {
	case "", "null", "false", "[]", "{}":
		return true
	}
	return false
}

func contains(list []string, s string) bool {
	for _, l := range list {
		if l == s {
			return true
		}
	}
	return false
}

func join(path string, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

func str(raw json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// typeOf is a block's type member.
func typeOf(m map[string]json.RawMessage) string {
	s, _ := str(m["type"])
	return s
}

// The top-level members parseRequest reads.
var topMembers = []string{"model", "max_tokens", "messages", "system", "stream", "stop_sequences",
	"temperature", "top_p", "top_k", "metadata", "tools", "tool_choice", "output_config"}

func (p *parser) request(body []byte) (parsed, *answer.Problem) {
	var top map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&top); err != nil || top == nil || dec.More() {
		return parsed{}, invalid("", "the request body must be a JSON object")
	}
	for k, v := range top {
		if isNull(v) {
			delete(top, k)
		}
	}
	if raw, ok := top["thinking"]; ok {
		th, ok := object(raw)
		if !ok {
			return parsed{}, invalid("thinking", "must be an object")
		}
		switch typeOf(th) {
		case "disabled":
		case "enabled", "adaptive":
			p.ignored["thinking"] = true
		default:
			return parsed{}, invalid("thinking.type", "must be enabled, adaptive or disabled")
		}
		delete(top, "thinking")
	}
	if raw, ok := top["context_management"]; ok {
		if _, ok := object(raw); !ok {
			return parsed{}, invalid("context_management", "must be an object")
		}
	}
	if err := p.allow("", top, topMembers, "cache_control", "service_tier", "context_management"); err != nil {
		return parsed{}, err
	}
	var req parsed
	r := &req.Envelope
	params := map[string]json.RawMessage{}
	var ok bool
	if req.Model, ok = str(top["model"]); !ok || strings.TrimSpace(req.Model) == "" {
		return parsed{}, invalid("model", "required: a model of the gateway's (GET /v1/models)")
	}
	if raw, has := top["stream"]; has {
		if json.Unmarshal(raw, &req.Stream) != nil {
			return parsed{}, invalid("stream", "must be true or false")
		}
	}
	r.Stream = req.Stream
	raw, has := top["max_tokens"]
	var n float64
	if !has || json.Unmarshal(raw, &n) != nil || n < 1 || n != float64(int64(n)) {
		return parsed{}, invalid("max_tokens", "required: a whole number of at least 1")
	}
	params["max_tokens"] = bytes.TrimSpace(raw)
	for _, k := range []string{"temperature", "top_p", "top_k"} {
		if raw, has := top[k]; has {
			if json.Unmarshal(raw, &n) != nil {
				return parsed{}, invalid(k, "must be a number")
			}
			params[k] = bytes.TrimSpace(raw)
		}
	}
	if raw, has := top["stop_sequences"]; has {
		var stops []string
		if json.Unmarshal(raw, &stops) != nil {
			return parsed{}, invalid("stop_sequences", "must be an array of strings")
		}
		if len(stops) > 0 {
			params["stop"], _ = json.Marshal(stops)
		}
	}
	if raw, has := top["metadata"]; has {
		md, ok := object(raw)
		if !ok {
			return parsed{}, invalid("metadata", "must be an object")
		}
		if err := p.allow("metadata", md, []string{"user_id"}); err != nil {
			return parsed{}, err
		}
		if raw, has := md["user_id"]; has && !isNull(raw) {
			if _, ok := str(raw); !ok {
				return parsed{}, invalid("metadata.user_id", "must be a string")
			}
			params["user"] = bytes.TrimSpace(raw)
		}
	}
	if raw, has := top["system"]; has {
		m, err := p.systemMessage("system", raw)
		if err != nil {
			return parsed{}, err
		}
		if m != nil {
			r.Messages = append(r.Messages, *m)
		}
	}
	var turns []json.RawMessage
	if json.Unmarshal(top["messages"], &turns) != nil || len(turns) == 0 {
		return parsed{}, invalid("messages", "required: a non-empty array of messages")
	}
	for i, t := range turns {
		ms, err := p.message("messages."+strconv.Itoa(i), t)
		if err != nil {
			return parsed{}, err
		}
		r.Messages = append(r.Messages, ms...)
	}
	if raw, has := top["tools"]; has {
		var tools []json.RawMessage
		if json.Unmarshal(raw, &tools) != nil {
			return parsed{}, invalid("tools", "must be an array of tools")
		}
		for i, t := range tools {
			tool, err := p.tool("tools."+strconv.Itoa(i), t)
			if err != nil {
				return parsed{}, err
			}
			r.Tools = append(r.Tools, tool)
		}
	}
	if raw, has := top["tool_choice"]; has {
		choice, parallel, err := p.toolChoice(raw)
		if err != nil {
			return parsed{}, err
		}
		r.ToolChoice = choice
		if !parallel {
			params["parallel_tool_calls"] = json.RawMessage("false")
		}
	}
	if raw, has := top["output_config"]; has {
		format, err := p.outputConfig(raw)
		if err != nil {
			return parsed{}, err
		}
		r.ResponseFormat = format
	}
	if len(r.Tools) == 0 {
		// Without tools there are no parallel calls to turn off, and an
		// OpenAI-compatible server refuses the member.
		delete(params, "parallel_tool_calls")
	}
	r.Params = params
	// The envelope's own check; its message never quotes a value.
	if err := r.Validate(); err != nil {
		return parsed{}, invalid("", err.Error())
	}
	return req, nil
}

// systemMessage reads a system prompt, top-level or a role: "system"
// message's content: a string, or text blocks. Nil for an empty one.
func (p *parser) systemMessage(path string, raw json.RawMessage) (*providers.Message, *answer.Problem) {
	if s, ok := str(raw); ok {
		if s == "" {
			return nil, nil
		}
		m := providers.TextMessage("system", s)
		return &m, nil
	}
	var blocks []json.RawMessage
	if json.Unmarshal(raw, &blocks) != nil {
		return nil, invalid(path, "must be a string or an array of text blocks")
	}
	var parts []textPart
	for j, b := range blocks {
		bp := path + "." + strconv.Itoa(j)
		m, ok := object(b)
		if !ok {
			return nil, invalid(bp, "must be a content block")
		}
		if typeOf(m) != "text" {
			return nil, invalid(bp+".type", "a system prompt holds text blocks only")
		}
		t, err := p.text(bp, m)
		if err != nil {
			return nil, err
		}
		parts = append(parts, t)
	}
	if len(parts) == 0 {
		return nil, nil
	}
	content, _ := json.Marshal(parts)
	return &providers.Message{Role: "system", Content: content}, nil
}

// The envelope's (OpenAI's) content parts.
type (
	textPart struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	imagePart struct {
		Type     string   `json:"type"`
		ImageURL imageURL `json:"image_url"`
	}
	imageURL struct {
		URL string `json:"url"`
	}
)

// text reads a text block.
func (p *parser) text(path string, m map[string]json.RawMessage) (textPart, *answer.Problem) {
	if err := p.allow(path, m, []string{"type", "text"}, "cache_control", "citations"); err != nil {
		return textPart{}, err
	}
	s, ok := str(m["text"])
	if !ok {
		return textPart{}, invalid(path+".text", "required: a string")
	}
	return textPart{Type: "text", Text: s}, nil
}

// image reads an image block: a base64 source becomes a data URL, a url
// source the URL, as the envelope's image_url part.
func (p *parser) image(path string, m map[string]json.RawMessage) (imagePart, *answer.Problem) {
	if err := p.allow(path, m, []string{"type", "source"}, "cache_control"); err != nil {
		return imagePart{}, err
	}
	src, ok := object(m["source"])
	if !ok {
		return imagePart{}, invalid(path+".source", "required: an object")
	}
	sp := path + ".source"
	switch typeOf(src) {
	case "base64":
		if err := p.allow(sp, src, []string{"type", "media_type", "data"}); err != nil {
			return imagePart{}, err
		}
		mt, ok1 := str(src["media_type"])
		data, ok2 := str(src["data"])
		if !ok1 || mt == "" || !ok2 || data == "" {
			return imagePart{}, invalid(sp, "a base64 source needs media_type and data")
		}
		return imagePart{Type: "image_url", ImageURL: imageURL{URL: "data:" + mt + ";base64," + data}}, nil
	case "url":
		if err := p.allow(sp, src, []string{"type", "url"}); err != nil {
			return imagePart{}, err
		}
		u, ok := str(src["url"])
		if !ok || !(strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "http://")) {
			return imagePart{}, invalid(sp+".url", "must be an http(s) URL")
		}
		return imagePart{Type: "image_url", ImageURL: imageURL{URL: u}}, nil
	}
	return imagePart{}, unsupported(sp + ".type")
}

// part reads a text or image block as the envelope's content part; any
// other block is refused.
func (p *parser) part(path string, m map[string]json.RawMessage) (any, *answer.Problem) {
	switch typeOf(m) {
	case "text":
		return p.text(path, m)
	case "image":
		return p.image(path, m)
	}
	return nil, unsupported(path + ".type")
}

// message reads one entry of messages into envelope messages: a user turn
// becomes its tool results (one tool message each, in order) and user
// messages for the blocks between them; an assistant turn one assistant
// message with its text and tool calls; a system entry a system message
// where it stands.
func (p *parser) message(path string, raw json.RawMessage) ([]providers.Message, *answer.Problem) {
	m, ok := object(raw)
	if !ok {
		return nil, invalid(path, "must be a message object")
	}
	if err := p.allow(path, m, []string{"role", "content"}); err != nil {
		return nil, err
	}
	role, _ := str(m["role"])
	content, has := m["content"]
	if !has || isNull(content) {
		return nil, invalid(path+".content", "required")
	}
	cp := path + ".content"
	switch role {
	case "system":
		sm, err := p.systemMessage(cp, content)
		if err != nil || sm == nil {
			return nil, err
		}
		return []providers.Message{*sm}, nil
	case "user", "assistant":
	default:
		return nil, invalid(path+".role", "must be user, assistant or system")
	}
	if _, ok := str(content); ok {
		return []providers.Message{{Role: role, Content: bytes.TrimSpace(content)}}, nil
	}
	var blocks []json.RawMessage
	if json.Unmarshal(content, &blocks) != nil {
		return nil, invalid(cp, "must be a string or an array of content blocks")
	}
	if role == "assistant" {
		msg, err := p.assistant(cp, content, blocks)
		if err != nil {
			return nil, err
		}
		return []providers.Message{msg}, nil
	}
	return p.user(cp, blocks)
}

// user reads a user turn's blocks.
func (p *parser) user(path string, blocks []json.RawMessage) ([]providers.Message, *answer.Problem) {
	var out []providers.Message
	var parts []any
	flush := func() {
		if len(parts) > 0 {
			c, _ := json.Marshal(parts)
			out = append(out, providers.Message{Role: "user", Content: c})
			parts = nil
		}
	}
	for j, b := range blocks {
		bp := path + "." + strconv.Itoa(j)
		m, ok := object(b)
		if !ok {
			return nil, invalid(bp, "must be a content block")
		}
		switch typeOf(m) {
		case "text", "image":
			part, err := p.part(bp, m)
			if err != nil {
				return nil, err
			}
			parts = append(parts, part)
		case "tool_result":
			flush()
			tm, err := p.toolResult(bp, m)
			if err != nil {
				return nil, err
			}
			out = append(out, tm)
		case "tool_use":
			return nil, invalid(bp+".type", "a tool_use block belongs in an assistant turn")
		default:
			return nil, unsupported(bp + ".type")
		}
	}
	flush()
	if len(out) == 0 {
		// An empty array: the envelope keeps it, the provider judges.
		out = append(out, providers.Message{Role: "user", Content: json.RawMessage("[]")})
	}
	return out, nil
}

// toolResult reads a tool_result block as a tool message.
func (p *parser) toolResult(path string, m map[string]json.RawMessage) (providers.Message, *answer.Problem) {
	if err := p.allow(path, m, []string{"type", "tool_use_id", "content"}, "cache_control", "is_error"); err != nil {
		return providers.Message{}, err
	}
	if raw, has := m["is_error"]; has && !isNull(raw) {
		var b bool
		if json.Unmarshal(raw, &b) != nil {
			return providers.Message{}, invalid(path+".is_error", "must be true or false")
		}
	}
	id, ok := str(m["tool_use_id"])
	if !ok || id == "" {
		return providers.Message{}, invalid(path+".tool_use_id", "required: the id of the tool_use it answers")
	}
	msg := providers.Message{Role: "tool", ToolCallID: id, Content: json.RawMessage(`""`)}
	raw, has := m["content"]
	if !has || isNull(raw) {
		return msg, nil
	}
	if _, ok := str(raw); ok {
		msg.Content = bytes.TrimSpace(raw)
		return msg, nil
	}
	var blocks []json.RawMessage
	if json.Unmarshal(raw, &blocks) != nil {
		return providers.Message{}, invalid(path+".content", "must be a string or an array of text and image blocks")
	}
	var parts []any
	for k, b := range blocks {
		bp := path + ".content." + strconv.Itoa(k)
		bm, ok := object(b)
		if !ok {
			return providers.Message{}, invalid(bp, "must be a content block")
		}
		part, err := p.part(bp, bm)
		if err != nil {
			return providers.Message{}, err
		}
		parts = append(parts, part)
	}
	if len(parts) > 0 {
		msg.Content, _ = json.Marshal(parts)
	}
	return msg, nil
}

// assistant reads an assistant turn: its text blocks as the content (a
// string for one, text parts for several), its tool_use blocks as tool
// calls, read as the upstream adapter reads an answer's.
func (p *parser) assistant(path string, content json.RawMessage, blocks []json.RawMessage) (providers.Message, *answer.Problem) {
	var parts []textPart
	for j, b := range blocks {
		bp := path + "." + strconv.Itoa(j)
		m, ok := object(b)
		if !ok {
			return providers.Message{}, invalid(bp, "must be a content block")
		}
		switch typeOf(m) {
		case "text":
			t, err := p.text(bp, m)
			if err != nil {
				return providers.Message{}, err
			}
			parts = append(parts, t)
		case "tool_use":
			if err := p.allow(bp, m, []string{"type", "id", "name", "input"}, "cache_control"); err != nil {
				return providers.Message{}, err
			}
			if id, ok := str(m["id"]); !ok || id == "" {
				return providers.Message{}, invalid(bp+".id", "required")
			}
			if name, ok := str(m["name"]); !ok || name == "" {
				return providers.Message{}, invalid(bp+".name", "required")
			}
			if _, ok := object(m["input"]); !ok {
				return providers.Message{}, invalid(bp+".input", "required: an object")
			}
		case "thinking", "redacted_thinking":
			p.ignored["thinking"] = true
		default:
			return providers.Message{}, unsupported(bp + ".type")
		}
	}
	msg := providers.Message{Role: "assistant", ToolCalls: exchange.AnthropicToolCalls(content)}
	switch {
	case len(parts) == 1:
		msg.Content, _ = json.Marshal(parts[0].Text)
	case len(parts) > 1:
		msg.Content, _ = json.Marshal(parts)
	case msg.ToolCalls == nil:
		msg.Content = json.RawMessage(`""`)
	}
	return msg, nil
}

// outputConfig reads output_config: its effort is set aside
// (IgnoredMembers), its format, a JSON schema the answer must follow, is
// the envelope's response_format (nil for none).
func (p *parser) outputConfig(raw json.RawMessage) (json.RawMessage, *answer.Problem) {
	m, ok := object(raw)
	if !ok {
		return nil, invalid("output_config", "must be an object")
	}
	if err := p.allow("output_config", m, []string{"effort", "format"}); err != nil {
		return nil, err
	}
	if raw, has := m["effort"]; has && !isNull(raw) {
		if _, ok := str(raw); !ok {
			return nil, invalid("output_config.effort", "must be a string")
		}
		p.ignored["output_config.effort"] = true
	}
	raw, has := m["format"]
	if !has || isNull(raw) {
		return nil, nil
	}
	f, ok := object(raw)
	if !ok {
		return nil, invalid("output_config.format", "must be an object")
	}
	if err := p.allow("output_config.format", f, []string{"type", "schema"}); err != nil {
		return nil, err
	}
	if typeOf(f) != "json_schema" {
		return nil, invalid("output_config.format.type", "must be json_schema")
	}
	if _, ok := object(f["schema"]); !ok {
		return nil, invalid("output_config.format.schema", "required: a JSON schema object")
	}
	type jsonSchema struct {
		Name   string          `json:"name"`
		Schema json.RawMessage `json:"schema"`
		Strict bool            `json:"strict"`
	}
	// Anthropic's structured output holds the answer to the schema, as
	// OpenAI's strict mode does; the name is OpenAI's, required there.
	b, _ := json.Marshal(struct {
		Type       string     `json:"type"`
		JSONSchema jsonSchema `json:"json_schema"`
	}{"json_schema", jsonSchema{Name: "output", Schema: bytes.TrimSpace(f["schema"]), Strict: true}})
	return b, nil
}

// functionTool is an OpenAI function tool, the envelope's.
type functionTool struct {
	Type     string       `json:"type"`
	Function functionDecl `json:"function"`
}

type functionDecl struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      *bool           `json:"strict,omitempty"`
}

// tool reads a client tool (name, description, input_schema) as an
// OpenAI function tool. Anthropic's own tools (web search, code
// execution, computer use, ...) run at Anthropic and have no equivalent.
func (p *parser) tool(path string, raw json.RawMessage) (json.RawMessage, *answer.Problem) {
	m, ok := object(raw)
	if !ok {
		return nil, invalid(path, "must be a tool object")
	}
	if typ, has := m["type"]; has && !isNull(typ) {
		if s, _ := str(typ); s != "custom" {
			return nil, unsupported(path + ".type")
		}
	}
	if err := p.allow(path, m, []string{"type", "name", "description", "input_schema", "strict"}, "cache_control", "eager_input_streaming"); err != nil {
		return nil, err
	}
	var f functionDecl
	var ok1 bool
	if f.Name, ok1 = str(m["name"]); !ok1 || f.Name == "" {
		return nil, invalid(path+".name", "required")
	}
	if raw, has := m["description"]; has && !isNull(raw) {
		if f.Description, ok = str(raw); !ok {
			return nil, invalid(path+".description", "must be a string")
		}
	}
	if _, ok := object(m["input_schema"]); !ok {
		return nil, invalid(path+".input_schema", "required: a JSON schema object")
	}
	f.Parameters = bytes.TrimSpace(m["input_schema"])
	if raw, has := m["strict"]; has && !isNull(raw) {
		var b bool
		if json.Unmarshal(raw, &b) != nil {
			return nil, invalid(path+".strict", "must be true or false")
		}
		f.Strict = &b
	}
	b, _ := json.Marshal(functionTool{Type: "function", Function: f})
	return b, nil
}

// toolChoice reads tool_choice: auto, any, none, or tool with a name, as
// OpenAI's tool_choice; parallel is false when it disables parallel tool
// use.
func (p *parser) toolChoice(raw json.RawMessage) (choice json.RawMessage, parallel bool, err *answer.Problem) {
	m, ok := object(raw)
	if !ok {
		return nil, true, invalid("tool_choice", "must be an object")
	}
	if err := p.allow("tool_choice", m, []string{"type", "name", "disable_parallel_tool_use"}); err != nil {
		return nil, true, err
	}
	parallel = true
	if raw, has := m["disable_parallel_tool_use"]; has && !isNull(raw) {
		var off bool
		if json.Unmarshal(raw, &off) != nil {
			return nil, true, invalid("tool_choice.disable_parallel_tool_use", "must be true or false")
		}
		parallel = !off
	}
	typ := typeOf(m)
	if mode, ok := exchange.OpenAIToolChoice(typ); ok {
		if _, has := m["name"]; has {
			return nil, true, unsupported("tool_choice.name")
		}
		choice, _ = json.Marshal(mode)
		return choice, parallel, nil
	}
	if typ != "tool" {
		return nil, true, invalid("tool_choice.type", "must be auto, any, none or tool")
	}
	name, ok := str(m["name"])
	if !ok || name == "" {
		return nil, true, invalid("tool_choice.name", "required for a tool choice of type tool")
	}
	type fn struct {
		Name string `json:"name"`
	}
	choice, _ = json.Marshal(struct {
		Type     string `json:"type"`
		Function fn     `json:"function"`
	}{"function", fn{name}})
	return choice, parallel, nil
}
