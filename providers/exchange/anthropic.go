package exchange

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/packages/param"
)

// AnthropicVersion is the anthropic-version header CallAnthropic sends:
// the API version whose request and event shapes it implements.
const AnthropicVersion = "2023-06-01"

// DefaultAnthropicMaxTokens is the max_tokens CallAnthropic sends when
// the request's params carry neither max_tokens nor
// max_completion_tokens. Anthropic requires the member, OpenAI does not,
// so an OpenAI-shaped request that falls back needs one; 1024 is enough
// for a typical chat answer and small enough that a forgotten limit
// cannot run up a bill. Set params.max_tokens for longer answers.
const DefaultAnthropicMaxTokens = 1024

// CallAnthropic makes one attempt against Anthropic's Messages API: one
// POST to {BaseURL}/messages, sent by the official client
// (github.com/anthropics/anthropic-sdk-go/v2) with its retries off and rt
// as its transport, never retried and never redirected, the key in
// x-api-key and "anthropic-version: 2023-06-01" (sendAnthropicMessage says
// how the client is set up). Its contract (the commit
// boundary, timers, partial streams, what is an error and what is a
// Result, no content in errors) is the exchange's, as for CallOpenAI
// (call in exchange.go); only the wire format differs.
//
// The OpenAI-shaped Request is translated before anything is sent:
// system and developer messages become the top-level system prompt (in
// order, wherever they stood), tool calls and tool results become
// tool_use and tool_result blocks, image_url parts become image blocks,
// OpenAI function tools become tools with an input_schema, tool_choice is
// mapped, params.max_tokens (else max_completion_tokens, else
// DefaultAnthropicMaxTokens) becomes max_tokens, and stop becomes
// stop_sequences. What has no equivalent fails with ErrUnsupported naming
// the field, before sending: a response_format other than {"type":
// "text"} (Anthropic has no structured-output mode that keeps OpenAI's
// guarantee; a route without the structured_output capability is what
// the workflow's filter keeps such requests from), n above 1, content
// parts other than text and images, tools other than functions, and
// unknown params. OpenAI tuning params with no effect on the answer's
// shape (seed, frequency_penalty, presence_penalty, logit_bias, logprobs,
// top_logprobs, store, metadata, service_tier, stream_options,
// reasoning_effort, prediction, prompt_cache_key, safety_identifier,
// verbosity) are dropped; user becomes metadata.user_id.
//
// The answer comes back in the OpenAI shape: text blocks joined into
// Text, tool_use blocks as ToolCalls ([{"id", "type": "function",
// "function": {"name", "arguments"}}]), stop_reason as FinishReason
// (end_turn and stop_sequence → "stop", max_tokens and
// model_context_window_exceeded → "length", tool_use → "tool_calls",
// refusal → "content_filter", anything else verbatim), and usage with
// the cache read and write tokens counted in PromptTokens, as OpenAI's
// prompt_tokens counts cached tokens. Errors map to the same signals as
// OpenAI's: overloaded_error and rate_limit_error → SignalOverloaded,
// not_found_error → SignalModelNotFound, a prompt too long →
// SignalContextTooLong.
//
// In a stream, the first text delta or the start of the first tool_use
// block commits the attempt; message_start, ping and an empty text block
// do not. message_stop, or a stop_reason in message_delta, completes it.
func CallAnthropic(ctx context.Context, rt http.RoundTripper, c Call) (Result, error) {
	return call(ctx, rt, c, &anthropicDialect)
}

// anthropicDialect is the Messages API, sent by the official client.
var anthropicDialect = dialect{
	kind:      routes.KindAnthropic,
	path:      []string{"messages"},
	send:      sendAnthropicMessage,
	whole:     parseAnthropicMessage,
	errorBody: parseAnthropicError,
	newStream: newAnthropicStreamAcc,
	signal:    anthropicErrorSignal,
}

// sendAnthropicMessage sends the request with the official Anthropic
// client (github.com/anthropics/anthropic-sdk-go/v2), configured as the
// OpenAI client is (sendChatCompletion) so that it can never send twice or
// anywhere else: retries off, the recovery engine as its transport with
// redirects not followed, a service built from explicit options only
// (never ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL, a profile or any other
// part of the SDK's credential chain), the request sent with the
// exchange's context, and its OpenTelemetry spans off (a span would carry
// the request's content when the environment asks for it, and the trace
// headers would go upstream).
//
// What differs from the OpenAI adapter, and why (docs/providers.md):
//   - The body is this adapter's own encoding (anthropicRequestBody), given
//     to the client as the params' JSON. The SDK's MessageNewParams has no
//     temperature, top_p or top_k (its API version refuses them), its
//     extra fields are written in map order (the same request gave 4
//     different bodies in 200 marshals), and it has no string form of a
//     message's, the system prompt's or a tool result's content.
//   - The key goes in x-api-key and anthropic-version is AnthropicVersion:
//     the client's own WithAPIKey sends Authorization: Bearer and its
//     default version is one whose request shape this adapter does not
//     speak, and Anthropic-compatible servers read x-api-key.
//   - The URL is the route's endpoint ({base_url}/messages): the client's
//     path is fixed at v1/messages under its base URL, and a route's
//     base_url already names the version (https://api.anthropic.com/v1).
//   - The exchange's context matters here: for a non-streamed request the
//     client arms a timer of its own (ten minutes, when the attempt may run
//     longer) and cancels it as soon as it hands back an error status,
//     which under its context would end the request before the exchange
//     read the provider's error body
//     (TestAnthropicErrorBodyIsReadOnALongAttempt).
//
// As with the OpenAI client, the response is not read by the client.
func sendAnthropicMessage(ctx context.Context, rt http.RoundTripper, o outgoing) (*http.Response, error) {
	body, err := anthropicRequestBody(o.route.Model, o.request)
	if err != nil {
		return nil, err
	}
	endpoint, err := url.Parse(o.url)
	if err != nil {
		return nil, err
	}
	t := &answerTaker{ctx: ctx, url: endpoint}
	opts := []option.RequestOption{
		option.WithBaseURL(o.route.BaseURL),
		option.WithHTTPClient(clientHTTP(rt)),
		option.WithMaxRetries(0),
		option.WithoutOpenTelemetry(),
		option.WithHeader("anthropic-version", AnthropicVersion),
		option.WithHeader("Accept", acceptFor(o.request)),
		option.WithMiddleware(t.take),
	}
	if o.key != "" {
		opts = append(opts, option.WithHeader("x-api-key", o.key))
	}
	var params anthropic.MessageNewParams
	param.SetJSON(body, &params)
	svc := anthropic.NewMessageService(opts...)
	if o.request.Stream {
		s := svc.NewStreaming(ctx, params)
		err = s.Err()
		// It holds the empty body the middleware gave the client.
		_ = s.Close()
	} else {
		// The body stays with the exchange: with **http.Response as the
		// destination the client returns the response unread.
		_, err = svc.New(ctx, params, option.WithResponseBodyInto(new(*http.Response)))
	}
	return t.outcome(err)
}

// anthropicRequest is the Messages request body. Fields are in the order
// the API reference lists them, so the JSON reads predictably.
type anthropicRequest struct {
	Model         string             `json:"model"`
	MaxTokens     int                `json:"max_tokens"`
	System        any                `json:"system,omitempty"`
	Messages      []anthropicMessage `json:"messages"`
	Tools         []anthropicTool    `json:"tools,omitempty"`
	ToolChoice    *anthropicChoice   `json:"tool_choice,omitempty"`
	StopSequences json.RawMessage    `json:"stop_sequences,omitempty"`
	Temperature   json.RawMessage    `json:"temperature,omitempty"`
	TopP          json.RawMessage    `json:"top_p,omitempty"`
	TopK          json.RawMessage    `json:"top_k,omitempty"`
	Metadata      *anthropicMetadata `json:"metadata,omitempty"`
	Stream        bool               `json:"stream,omitempty"`
}

type anthropicMessage struct {
	Role string `json:"role"`
	// Content is a string or a []any of blocks.
	Content any `json:"content"`
}

type anthropicTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type anthropicChoice struct {
	Type                   string `json:"type"`
	Name                   string `json:"name,omitempty"`
	DisableParallelToolUse bool   `json:"disable_parallel_tool_use,omitempty"`
}

type anthropicMetadata struct {
	UserID string `json:"user_id"`
}

type textBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type imageSource struct {
	Type      string `json:"type"`
	MediaType string `json:"media_type,omitempty"`
	Data      string `json:"data,omitempty"`
	URL       string `json:"url,omitempty"`
}

type imageBlock struct {
	Type   string      `json:"type"`
	Source imageSource `json:"source"`
}

type toolUseBlock struct {
	Type  string          `json:"type"`
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
}

type toolResultBlock struct {
	Type      string `json:"type"`
	ToolUseID string `json:"tool_use_id"`
	// Content is a string or a []any of blocks; nil is omitted.
	Content any `json:"content,omitempty"`
}

// anthropicDroppedParams are OpenAI params with no Messages equivalent
// that change neither what the answer says nor its shape, so an
// OpenAI-shaped request may fall back without them.
var anthropicDroppedParams = map[string]bool{
	"frequency_penalty": true, "presence_penalty": true, "seed": true, "logit_bias": true,
	"logprobs": true, "top_logprobs": true, "store": true, "metadata": true, "service_tier": true,
	"stream_options": true, "reasoning_effort": true, "prediction": true, "prompt_cache_key": true,
	"safety_identifier": true, "verbosity": true,
}

// anthropicTx translates one Request, collecting every problem.
type anthropicTx struct {
	errs []error
}

// unsupported records something the Messages API cannot express. Neither
// it nor invalid quotes a value: a value may be part of a prompt.
func (t *anthropicTx) unsupported(field, problem string) {
	t.errs = append(t.errs, fmt.Errorf("%w: anthropic: %s: %s", ErrUnsupported, field, problem))
}

func (t *anthropicTx) invalid(field, problem string) {
	t.errs = append(t.errs, fmt.Errorf("%w: %s: %s", providers.ErrInvalidRequest, field, problem))
}

// anthropicRequestBody translates the envelope into a Messages request
// for model; see CallAnthropic for the rules. The error joins every
// problem, each wrapping ErrUnsupported or ErrInvalidRequest.
func anthropicRequestBody(model string, r providers.Request) ([]byte, error) {
	t := &anthropicTx{}
	out := anthropicRequest{Model: model, MaxTokens: DefaultAnthropicMaxTokens, Stream: r.Stream}
	var system []string
	lastTool := -1 // index in out.Messages of the user message holding tool results
	for i, m := range r.Messages {
		field := "messages[" + strconv.Itoa(i) + "]"
		switch m.Role {
		case "system", "developer":
			system = append(system, t.systemText(field+".content", m.Content)...)
		case "user":
			out.Messages = append(out.Messages, anthropicMessage{Role: "user", Content: t.content(field+".content", m.Content, true, nil)})
		case "assistant":
			uses := t.toolUses(field+".tool_calls", m.ToolCalls)
			out.Messages = append(out.Messages, anthropicMessage{Role: "assistant", Content: t.content(field+".content", m.Content, false, uses)})
		case "tool":
			res := t.toolResult(field, m)
			if lastTool >= 0 && lastTool == len(out.Messages)-1 {
				// Parallel calls' results belong in one user turn.
				msg := &out.Messages[lastTool]
				msg.Content = append(msg.Content.([]any), res)
				continue
			}
			out.Messages = append(out.Messages, anthropicMessage{Role: "user", Content: []any{res}})
			lastTool = len(out.Messages) - 1
		default:
			t.unsupported(field+".role", "not system, developer, user, assistant or tool")
		}
	}
	if len(out.Messages) == 0 {
		t.unsupported("messages", "no user, assistant or tool message (the Messages API needs one besides the system prompt)")
	}
	switch len(system) {
	case 0:
	case 1:
		out.System = system[0]
	default:
		blocks := make([]textBlock, len(system))
		for i, s := range system {
			blocks[i] = textBlock{Type: "text", Text: s}
		}
		out.System = blocks
	}
	for j, raw := range r.Tools {
		if tool, ok := t.tool("tools["+strconv.Itoa(j)+"]", raw); ok {
			out.Tools = append(out.Tools, tool)
		}
	}
	out.ToolChoice = t.toolChoice(r.ToolChoice)
	if !isNull(r.ResponseFormat) {
		var w struct {
			Type json.RawMessage `json:"type"`
		}
		if !obj(r.ResponseFormat, &w) || str(w.Type) != "text" {
			t.unsupported("response_format", "no Messages equivalent keeps OpenAI's schema guarantee; "+
				"an action that sends one should declare needs.structured_output, which no anthropic route offers")
		}
	}
	t.params(&out, r.Params, len(out.Tools) > 0)
	if err := errors.Join(t.errs...); err != nil {
		return nil, err
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	return b, nil
}

// systemText reads a system or developer message: a string, or text
// parts (the only kind the system prompt takes).
func (t *anthropicTx) systemText(field string, raw json.RawMessage) []string {
	var out []string
	for _, b := range t.blocks(field, raw, false) {
		if tb, ok := b.(textBlock); ok {
			out = append(out, tb.Text)
		}
	}
	return out
}

// content translates message content. A plain string with nothing to add
// stays a string, the Messages API's short form; otherwise it is blocks,
// followed by extra.
func (t *anthropicTx) content(field string, raw json.RawMessage, images bool, extra []any) any {
	if tr := bytes.TrimSpace(raw); len(extra) == 0 && len(tr) > 0 && tr[0] == '"' {
		return str(tr)
	}
	blocks := append(t.blocks(field, raw, images), extra...)
	if blocks == nil {
		// An empty array, not null: the API then names the problem.
		blocks = []any{}
	}
	return blocks
}

// blocks translates content into Anthropic blocks: text (empty text is
// skipped; the API refuses empty text blocks) and, where images is set,
// images.
func (t *anthropicTx) blocks(field string, raw json.RawMessage, images bool) []any {
	tr := bytes.TrimSpace(raw)
	if isNull(tr) {
		return nil
	}
	switch tr[0] {
	case '"':
		if s := str(tr); s != "" {
			return []any{textBlock{Type: "text", Text: s}}
		}
		return nil
	case '[':
	default:
		t.unsupported(field, "not a string or an array of content parts")
		return nil
	}
	var out []any
	for j, part := range arr(tr) {
		pf := field + "[" + strconv.Itoa(j) + "]"
		if p := bytes.TrimSpace(part); len(p) > 0 && p[0] == '"' {
			if s := str(p); s != "" {
				out = append(out, textBlock{Type: "text", Text: s})
			}
			continue
		}
		var w struct {
			Type     json.RawMessage `json:"type"`
			Text     json.RawMessage `json:"text"`
			Refusal  json.RawMessage `json:"refusal"`
			ImageURL json.RawMessage `json:"image_url"`
		}
		if !obj(part, &w) {
			t.unsupported(pf, "not a content part object")
			continue
		}
		switch typ := str(w.Type); {
		case typ == "text" || (typ == "" && !isNull(w.Text)):
			if s := str(w.Text); s != "" {
				out = append(out, textBlock{Type: "text", Text: s})
			}
		case typ == "refusal":
			// An earlier answer's refusal, replayed as history.
			if s := str(w.Refusal); s != "" {
				out = append(out, textBlock{Type: "text", Text: s})
			}
		case typ == "image_url" && images:
			if b, ok := t.image(pf+".image_url", w.ImageURL); ok {
				out = append(out, b)
			}
		case typ == "image_url":
			t.unsupported(pf, "an image is not allowed in this role")
		default:
			t.unsupported(pf+".type", "no Anthropic equivalent for this content part type")
		}
	}
	return out
}

// image translates an image_url ({"url": ...} or the URL itself): a
// base64 data URL becomes a base64 source, an http(s) URL a url source.
func (t *anthropicTx) image(field string, raw json.RawMessage) (imageBlock, bool) {
	u := str(raw)
	var w struct {
		URL json.RawMessage `json:"url"`
	}
	if obj(raw, &w) {
		u = str(w.URL)
	}
	if rest, ok := strings.CutPrefix(u, "data:"); ok {
		meta, data, _ := strings.Cut(rest, ",")
		mt, b64 := strings.CutSuffix(meta, ";base64")
		if !b64 || mt == "" || data == "" {
			t.unsupported(field, "a data URL must be base64 with a media type")
			return imageBlock{}, false
		}
		return imageBlock{Type: "image", Source: imageSource{Type: "base64", MediaType: mt, Data: data}}, true
	}
	if strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "http://") {
		return imageBlock{Type: "image", Source: imageSource{Type: "url", URL: u}}, true
	}
	t.unsupported(field, "not a base64 data URL or an http(s) URL")
	return imageBlock{}, false
}

// toolUses translates an assistant message's tool_calls into tool_use
// blocks.
func (t *anthropicTx) toolUses(field string, raw json.RawMessage) []any {
	if isNull(raw) {
		return nil
	}
	if tr := bytes.TrimSpace(raw); tr[0] != '[' {
		t.unsupported(field, "not an array")
		return nil
	}
	var out []any
	for j, c := range arr(raw) {
		cf := field + "[" + strconv.Itoa(j) + "]"
		var w wireToolCall
		var f wireFunction
		if !obj(c, &w) {
			t.unsupported(cf, "not a tool call object")
			continue
		}
		obj(w.Function, &f)
		if typ := str(w.Type); typ != "" && typ != "function" {
			t.unsupported(cf+".type", "only function tool calls have an Anthropic equivalent")
			continue
		}
		id, name := str(w.ID), str(f.Name)
		if id == "" {
			t.invalid(cf+".id", "required by the Messages API")
		}
		if name == "" {
			t.invalid(cf+".function.name", "required")
		}
		input, ok := AnthropicToolInput(f.Arguments)
		if !ok {
			t.unsupported(cf+".function.arguments", "not a JSON object (tool_use input must be one)")
			continue
		}
		out = append(out, toolUseBlock{Type: "tool_use", ID: id, Name: name, Input: input})
	}
	return out
}

// toolResult translates a tool message into a tool_result block.
func (t *anthropicTx) toolResult(field string, m providers.Message) toolResultBlock {
	if m.ToolCallID == "" {
		t.invalid(field+".tool_call_id", "required by the Messages API")
	}
	res := toolResultBlock{Type: "tool_result", ToolUseID: m.ToolCallID}
	if tr := bytes.TrimSpace(m.Content); len(tr) > 0 && tr[0] == '"' {
		if s := str(tr); s != "" {
			res.Content = s
		}
	} else if blocks := t.blocks(field+".content", m.Content, true); len(blocks) > 0 {
		res.Content = blocks
	}
	return res
}

// tool translates an OpenAI function tool.
func (t *anthropicTx) tool(field string, raw json.RawMessage) (anthropicTool, bool) {
	var w struct {
		Type     json.RawMessage `json:"type"`
		Function json.RawMessage `json:"function"`
	}
	var f struct {
		Name        json.RawMessage `json:"name"`
		Description json.RawMessage `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	}
	if !obj(raw, &w) || !obj(w.Function, &f) {
		t.unsupported(field, "not an OpenAI function tool")
		return anthropicTool{}, false
	}
	if typ := str(w.Type); typ != "function" && typ != "" {
		t.unsupported(field+".type", "only function tools have an Anthropic equivalent")
		return anthropicTool{}, false
	}
	name := str(f.Name)
	if name == "" {
		t.invalid(field+".function.name", "required")
		return anthropicTool{}, false
	}
	schema := bytes.TrimSpace(f.Parameters)
	switch {
	case isNull(schema):
		// A function without parameters: input_schema is required.
		schema = []byte(`{"type":"object","properties":{}}`)
	case schema[0] != '{':
		t.unsupported(field+".function.parameters", "not a JSON schema object")
		return anthropicTool{}, false
	}
	return anthropicTool{Name: name, Description: str(f.Description), InputSchema: json.RawMessage(schema)}, true
}

// toolChoice maps OpenAI's tool_choice: "auto", "none", "required" (any)
// or a named function (tool).
func (t *anthropicTx) toolChoice(raw json.RawMessage) *anthropicChoice {
	tr := bytes.TrimSpace(raw)
	if isNull(tr) {
		return nil
	}
	if tr[0] == '"' {
		if mode, ok := AnthropicToolChoice(str(tr)); ok {
			return &anthropicChoice{Type: mode}
		}
		t.unsupported("tool_choice", `not "auto", "none", "required" or a function`)
		return nil
	}
	var w struct {
		Type     json.RawMessage `json:"type"`
		Function json.RawMessage `json:"function"`
	}
	var f struct {
		Name json.RawMessage `json:"name"`
	}
	if !obj(tr, &w) || str(w.Type) != "function" || !obj(w.Function, &f) || str(f.Name) == "" {
		t.unsupported("tool_choice", `not "auto", "none", "required" or a function`)
		return nil
	}
	return &anthropicChoice{Type: "tool", Name: str(f.Name)}
}

// params maps Request.Params onto out; see CallAnthropic.
func (t *anthropicTx) params(out *anthropicRequest, p map[string]json.RawMessage, hasTools bool) {
	keys := make([]string, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	// Sorted so the joined error reads the same on every run.
	sort.Strings(keys)
	var stop json.RawMessage
	for _, k := range keys {
		v := bytes.TrimSpace(p[k])
		field := "params[" + strconv.Quote(k) + "]"
		if isNull(v) {
			continue // null is OpenAI's "default"
		}
		switch k {
		case "max_tokens", "max_completion_tokens":
			n, ok := num(v)
			if !ok || n <= 0 {
				t.invalid(field, "not a positive integer")
				continue
			}
			// max_tokens wins when both are set.
			if k == "max_tokens" || isNull(p["max_tokens"]) {
				out.MaxTokens = n
			}
		case "temperature":
			out.Temperature = json.RawMessage(v)
		case "top_p":
			out.TopP = json.RawMessage(v)
		case "top_k":
			out.TopK = json.RawMessage(v)
		case "stop", "stop_sequences":
			if stop != nil {
				t.unsupported(field, "stop and stop_sequences are both set")
				continue
			}
			stop = stopSequences(v)
			if stop == nil {
				t.unsupported(field, "not a string or an array of strings")
			}
		case "user":
			switch {
			case v[0] != '"':
				t.invalid(field, "not a string")
			case str(v) != "":
				out.Metadata = &anthropicMetadata{UserID: str(v)}
			}
		case "parallel_tool_calls":
			switch string(v) {
			case "false":
				if !hasTools {
					continue
				}
				if out.ToolChoice == nil {
					out.ToolChoice = &anthropicChoice{Type: "auto"}
				}
				if out.ToolChoice.Type != "none" {
					out.ToolChoice.DisableParallelToolUse = true
				}
			case "true":
			default:
				t.invalid(field, "not a boolean")
			}
		case "n":
			if n, ok := num(v); !ok || n != 1 {
				t.unsupported(field, "the Messages API returns one choice")
			}
		default:
			if !anthropicDroppedParams[k] {
				t.unsupported(field, "no Anthropic equivalent")
			}
		}
	}
	out.StopSequences = stop
}

// stopSequences reads OpenAI's stop (a string or an array of strings) as
// Anthropic's stop_sequences array; nil when it is neither.
func stopSequences(v json.RawMessage) json.RawMessage {
	if v[0] == '"' {
		b, err := json.Marshal([]string{str(v)})
		if err != nil {
			return nil
		}
		return b
	}
	var ss []string
	if json.Unmarshal(v, &ss) != nil {
		return nil
	}
	b, err := json.Marshal(ss)
	if err != nil {
		return nil
	}
	return b
}
