package exchange

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"net/http"
	"net/url"
	"sort"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/shared"
)

// CallOpenAI makes one attempt against an OpenAI-compatible
// chat-completions endpoint: one POST to {BaseURL}/chat/completions, sent
// by the official client (github.com/openai/openai-go/v3) with its retries
// off and rt as its transport, never retried and never redirected.
//
// Its contract (the commit boundary, the timers, how it ends, what is an
// error and what is a Result) is the exchange's, the same for every
// dialect: see call in exchange.go.
func CallOpenAI(ctx context.Context, rt http.RoundTripper, c Call) (Result, error) {
	return call(ctx, rt, c, &openaiDialect)
}

// openaiDialect is the chat-completions API, sent by the official client.
var openaiDialect = dialect{
	kind:      routes.KindOpenAI,
	path:      []string{"chat", "completions"},
	send:      sendChatCompletion,
	whole:     parseCompletion,
	errorBody: parseErrorBody,
	newStream: newStreamAcc,
	signal:    errorSignal,
	records:   true,
}

// sendChatCompletion sends the request with the official OpenAI client
// (github.com/openai/openai-go/v3): it builds and encodes the typed
// ChatCompletionNewParams, sets the URL, the key and its headers, and
// guards the credential's origin. It is configured so that it can never
// send twice or send anywhere else:
//   - retries off (option.WithMaxRetries(0)): the workflow owns the
//     attempt budget (docs/contract.md section 4.3);
//   - the recovery engine as its transport, in an http.Client that does
//     not follow redirects (a redirect would be a second request);
//   - a service built from explicit options only, never from the
//     OPENAI_* environment, so the key is the route's and nothing else;
//   - the request sent with the exchange's context, so no timer of the
//     client's can end a body the exchange reads.
//
// The client does not read the response. A middleware takes the
// provider's response as it arrives and hands the client an empty body,
// so every byte goes through the exchange: the first-byte and idle timers
// need to see keep-alives, the commit boundary needs the first content
// delta, and the parsers need their bounds and their tolerance of drifted
// shapes. The client's own error value is therefore not used either: the
// exchange reads the status and the (bounded) error body, which also
// covers the non-standard error shapes of OpenAI-compatible servers.
func sendChatCompletion(ctx context.Context, rt http.RoundTripper, o outgoing) (*http.Response, error) {
	params, err := chatParams(o.route.Model, o.request)
	if err != nil {
		return nil, err
	}
	return viaClient(ctx, rt, o.route, o.key, func(opts ...option.RequestOption) error {
		opts = append(opts, option.WithHeader("Accept", acceptFor(o.request)))
		if o.request.Stream {
			// As the client's own NewStreaming does.
			opts = append(opts, option.WithJSONSet("stream", true))
		}
		svc := openai.NewChatCompletionService(opts...)
		_, err := svc.New(ctx, params)
		return err
	})
}

// viaClient runs do, one call of the official client, configured as
// sendChatCompletion says, and returns the provider's response with its
// body unread, or the transport's error. The request goes out under ctx,
// whatever context the client derives for it.
func viaClient(ctx context.Context, rt http.RoundTripper, route routes.Route, key string, do func(opts ...option.RequestOption) error) (*http.Response, error) {
	t := &answerTaker{ctx: ctx}
	opts := []option.RequestOption{
		option.WithBaseURL(route.BaseURL),
		option.WithAPIKey(key),
		option.WithHTTPClient(clientHTTP(rt)),
		option.WithMaxRetries(0),
		option.WithMiddleware(t.take),
		// The body stays with the exchange: with **http.Response as the
		// destination the client returns the response unread.
		option.WithResponseBodyInto(new(*http.Response)),
	}
	opts = append(opts, baseQuery(route.BaseURL)...)
	return t.outcome(do(opts...))
}

// baseQuery carries a base URL's query (Azure's api-version, say) over to
// the request: the client resolves the path against the base URL, and a
// relative reference drops the base's query.
func baseQuery(base string) []option.RequestOption {
	u, err := url.Parse(base)
	if err != nil {
		// endpointURL has validated it already.
		return nil
	}
	var opts []option.RequestOption
	q := u.Query()
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		for _, v := range q[k] {
			opts = append(opts, option.WithQueryAdd(k, v))
		}
	}
	return opts
}

// chatParams builds the client's typed request from the envelope. The
// envelope keeps messages, tools, tool_choice and response_format as the
// caller wrote them, unknown members included (a gateway's cache_control
// on a content part, say), so each is given to the client with
// param.Override, which the client sends verbatim; decoding them into the
// typed fields would drop what the SDK does not model. The variant is
// chosen by role or type, so the request reads as the SDK's own. Params
// go in as extra fields, verbatim.
func chatParams(model string, r providers.Request) (openai.ChatCompletionNewParams, error) {
	p := openai.ChatCompletionNewParams{Model: model}
	p.Messages = make([]openai.ChatCompletionMessageParamUnion, 0, len(r.Messages))
	for i, m := range r.Messages {
		raw, err := messageJSON(m)
		if err != nil {
			return p, fmt.Errorf("encode messages[%d]: %w", i, err)
		}
		p.Messages = append(p.Messages, messageParam(m.Role, raw))
	}
	for _, t := range r.Tools {
		p.Tools = append(p.Tools, toolParam(t))
	}
	if len(r.ToolChoice) > 0 {
		p.ToolChoice = toolChoiceParam(r.ToolChoice)
	}
	if len(r.ResponseFormat) > 0 {
		p.ResponseFormat = responseFormatParam(r.ResponseFormat)
	}
	if _, ok := r.Params["stream_options"]; r.Stream && !ok {
		// Without it OpenAI sends no usage on a stream.
		p.StreamOptions.IncludeUsage = openai.Bool(true)
	}
	if len(r.Params) > 0 {
		extra := make(map[string]any, len(r.Params))
		for k, v := range r.Params {
			extra[k] = v
		}
		p.SetExtraFields(extra)
	}
	return p, nil
}

// messageJSON is m as json.Marshal writes it, its members in the same
// order, except that content and tool_calls are only HTML-escaped, as
// json.Marshal does, not compacted: the client compacts the whole body as
// it encodes it, so the bytes sent are the same, and a long content is
// scanned by encoding/json once, not twice. A content that is not JSON is
// an error, as it is for json.Marshal.
func messageJSON(m providers.Message) (json.RawMessage, error) {
	var b bytes.Buffer
	b.Grow(len(m.Content) + len(m.ToolCalls) + len(m.Role) + len(m.Name) + len(m.ToolCallID) + 64)
	member := func(name string) {
		if b.Len() == 0 {
			b.WriteByte('{')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(`"` + name + `":`)
	}
	str := func(name, v string) {
		member(name)
		s, _ := json.Marshal(v) // a string always encodes
		b.Write(s)
	}
	raw := func(name string, v json.RawMessage) error {
		if len(v) == 0 {
			return nil
		}
		if !providers.ValidJSON(v) {
			return fmt.Errorf("%s: %w: invalid JSON", name, providers.ErrInvalidRequest)
		}
		member(name)
		json.HTMLEscape(&b, v)
		return nil
	}
	str("role", m.Role)
	if err := raw("content", m.Content); err != nil {
		return nil, err
	}
	if m.Name != "" {
		str("name", m.Name)
	}
	if err := raw("tool_calls", m.ToolCalls); err != nil {
		return nil, err
	}
	if m.ToolCallID != "" {
		str("tool_call_id", m.ToolCallID)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// messageParam is one message, verbatim, in the variant its role names. A
// role the SDK does not model is sent verbatim too (as a user-message
// variant, which only decides the Go type): the provider judges it.
func messageParam(role string, raw json.RawMessage) openai.ChatCompletionMessageParamUnion {
	switch role {
	case "developer":
		v := param.Override[openai.ChatCompletionDeveloperMessageParam](raw)
		return openai.ChatCompletionMessageParamUnion{OfDeveloper: &v}
	case "system":
		v := param.Override[openai.ChatCompletionSystemMessageParam](raw)
		return openai.ChatCompletionMessageParamUnion{OfSystem: &v}
	case "assistant":
		v := param.Override[openai.ChatCompletionAssistantMessageParam](raw)
		return openai.ChatCompletionMessageParamUnion{OfAssistant: &v}
	case "tool":
		v := param.Override[openai.ChatCompletionToolMessageParam](raw)
		return openai.ChatCompletionMessageParamUnion{OfTool: &v}
	case "function":
		v := param.Override[openai.ChatCompletionFunctionMessageParam](raw)
		return openai.ChatCompletionMessageParamUnion{OfFunction: &v}
	default:
		v := param.Override[openai.ChatCompletionUserMessageParam](raw)
		return openai.ChatCompletionMessageParamUnion{OfUser: &v}
	}
}

// toolParam is one tool definition, verbatim.
func toolParam(raw json.RawMessage) openai.ChatCompletionToolUnionParam {
	if typeOf(raw) == "custom" {
		v := param.Override[openai.ChatCompletionCustomToolParam](raw)
		return openai.ChatCompletionToolUnionParam{OfCustom: &v}
	}
	v := param.Override[openai.ChatCompletionFunctionToolParam](raw)
	return openai.ChatCompletionToolUnionParam{OfFunction: &v}
}

// toolChoiceParam is tool_choice, verbatim: a string ("auto", "none",
// "required") or an object.
func toolChoiceParam(raw json.RawMessage) openai.ChatCompletionToolChoiceOptionUnionParam {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String(s)}
	}
	switch typeOf(raw) {
	case "allowed_tools":
		v := param.Override[openai.ChatCompletionAllowedToolChoiceParam](raw)
		return openai.ChatCompletionToolChoiceOptionUnionParam{OfAllowedTools: &v}
	case "custom":
		v := param.Override[openai.ChatCompletionNamedToolChoiceCustomParam](raw)
		return openai.ChatCompletionToolChoiceOptionUnionParam{OfCustomToolChoice: &v}
	default:
		v := param.Override[openai.ChatCompletionNamedToolChoiceParam](raw)
		return openai.ChatCompletionToolChoiceOptionUnionParam{OfFunctionToolChoice: &v}
	}
}

// responseFormatParam is response_format, verbatim.
func responseFormatParam(raw json.RawMessage) openai.ChatCompletionNewParamsResponseFormatUnion {
	switch typeOf(raw) {
	case "text":
		v := param.Override[shared.ResponseFormatTextParam](raw)
		return openai.ChatCompletionNewParamsResponseFormatUnion{OfText: &v}
	case "json_object":
		v := param.Override[shared.ResponseFormatJSONObjectParam](raw)
		return openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &v}
	default:
		v := param.Override[shared.ResponseFormatJSONSchemaParam](raw)
		return openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &v}
	}
}

// typeOf is an object's "type" member, "" when it has none.
func typeOf(raw json.RawMessage) string {
	var v struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(raw, &v)
	return v.Type
}
