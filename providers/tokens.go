package providers

import (
	"bytes"
	"encoding/json"
	"maps"
	"math"
	"strconv"
)

// An upper bound on a request's prompt tokens, for a budget that reserves
// an attempt's worst case before sending it (docs/contract.md section
// 4.3). No tokenizer is needed: a tokenizer's token stands for at least
// one byte of UTF-8 text (byte-level BPE, and SentencePiece with byte
// fallback), so a text's bytes bound its tokens, and the JSON encoding of
// a text is never shorter than the text. The constants below bound what
// is not text.
const (
	// DefaultImageTokens is what PromptTokenBound counts for an image
	// content part when the route declares no image_tokens of its own.
	// It covers the image token counts OpenAI and Anthropic document for
	// their current models (an image is scaled down before it is
	// counted); a model that counts an image as more (OpenAI's
	// gpt-4o-mini bills a high-detail image as tens of thousands of
	// tokens) needs its route's own image_tokens.
	DefaultImageTokens = 8192
	// MessageOverheadTokens is counted for each message: the chat
	// template's role markers and separators (OpenAI counts 3 or 4).
	MessageOverheadTokens = 16
	// RequestOverheadTokens is counted once: the template's start and the
	// tokens that prime the reply.
	RequestOverheadTokens = 64
	// ToolsOverheadTokens is counted once when the request declares tools:
	// the provider's own instructions for tool use (Anthropic documents
	// up to 346 tokens).
	ToolsOverheadTokens = 512
)

// PromptTokenBound returns an upper bound on the prompt tokens r can
// count at a provider: the bytes of its messages (role, name, content,
// tool calls, tool call id), tools, tool_choice and response_format as
// JSON, with imageTokens (DefaultImageTokens when not positive) for each
// image content part instead of its bytes, plus MessageOverheadTokens
// per message, RequestOverheadTokens, and ToolsOverheadTokens when r
// declares tools. ok is false when r has a part nothing bounds: a file
// part ("file", "input_file"), which a provider turns into pages of
// text and images whatever its size here. It is pure and deterministic,
// so workflow code may call it.
func (r Request) PromptTokenBound(imageTokens int) (n int, ok bool) {
	if imageTokens <= 0 {
		imageTokens = DefaultImageTokens
	}
	n = RequestOverheadTokens + len(r.ToolChoice) + len(r.ResponseFormat)
	if len(r.Tools) > 0 {
		n += ToolsOverheadTokens
	}
	for _, t := range r.Tools {
		n += len(t)
	}
	ok = true
	for _, m := range r.Messages {
		c, bounded := contentBound(m.Content, imageTokens)
		ok = ok && bounded
		n += MessageOverheadTokens + len(m.Role) + len(m.Name) + len(m.ToolCalls) + len(m.ToolCallID) + c
	}
	return n, ok
}

// contentBound bounds one message's content: its bytes, except that an
// image part counts imageTokens and a file part cannot be bounded.
func contentBound(content json.RawMessage, imageTokens int) (int, bool) {
	var parts []json.RawMessage
	if t := bytes.TrimSpace(content); len(t) == 0 || t[0] != '[' || json.Unmarshal(t, &parts) != nil {
		return len(content), true
	}
	n, ok := 2+len(parts), true // the brackets and commas
	for _, part := range parts {
		var typed struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(part, &typed)
		switch typed.Type {
		case "image_url", "image", "input_image":
			n += imageTokens
		case "file", "input_file":
			ok = false
		default:
			n += len(part)
		}
	}
	return n, ok
}

// The params that bound a request's output: max_completion_tokens
// (OpenAI's current name) and max_tokens (its older one, which every
// OpenAI-compatible server and the Anthropic adapter read).
const (
	ParamMaxCompletionTokens = "max_completion_tokens"
	ParamMaxTokens           = "max_tokens"
)

// MaxOutputTokens returns the bound r itself puts on the tokens each
// choice may generate: params.max_completion_tokens or params.max_tokens,
// the larger when both are set (providers differ in which one wins), and
// whether either was a positive integer.
func (r Request) MaxOutputTokens() (int, bool) {
	n, set := 0, false
	for _, k := range []string{ParamMaxCompletionTokens, ParamMaxTokens} {
		if v, ok := positiveInt(r.Params[k]); ok && (!set || v > n) {
			n, set = v, true
		}
	}
	return n, set
}

// Choices returns params.n, how many choices r asks for: 1 when absent
// or not a positive integer.
func (r Request) Choices() int {
	if v, ok := positiveInt(r.Params["n"]); ok {
		return v
	}
	return 1
}

// WithMaxOutputTokens returns a copy of r whose output is bounded by n
// tokens per choice: each of max_completion_tokens and max_tokens that r
// sets is replaced by n, and when it sets neither, max_tokens is set. r
// itself (and its params map) is not changed.
func (r Request) WithMaxOutputTokens(n int) Request {
	params := maps.Clone(r.Params)
	if params == nil {
		params = map[string]json.RawMessage{}
	}
	v := json.RawMessage(strconv.Itoa(n))
	set := false
	for _, k := range []string{ParamMaxCompletionTokens, ParamMaxTokens} {
		if raw, ok := params[k]; ok && !isNullJSON(raw) {
			params[k], set = v, true
		}
	}
	if !set {
		params[ParamMaxTokens] = v
	}
	r.Params = params
	return r
}

// positiveInt reads raw as a positive integer (1024 or 1024.0).
func positiveInt(raw json.RawMessage) (int, bool) {
	var f float64
	if len(raw) == 0 || json.Unmarshal(raw, &f) != nil || f < 1 || f != math.Trunc(f) || f > math.MaxInt32 {
		return 0, false
	}
	return int(f), true
}

func isNullJSON(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}
