package e2e_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/packages/ssestream"
	"golang.org/x/net/http2"

	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// The official anthropic-sdk-go (v2.15.0), on its defaults (two retries),
// against the gateway's Messages surface (POST /v1/messages), on an
// OpenAI-compatible route ("demo": the providertest provider, which speaks
// chat completions) and on an Anthropic route ("claude": the same provider
// returning recorded Messages bodies).

// claude is anthropic-sdk-go pointed at base (the gateway's root, without
// /v1), with its default retries unless opts say otherwise.
func claude(base, token string, opts ...option.RequestOption) *anthropic.Client {
	all := append([]option.RequestOption{option.WithBaseURL(base), option.WithAPIKey(token), option.WithHTTPClient(&http.Client{})}, opts...)
	c := anthropic.NewClient(all...)
	return &c
}

func (s *gwStack) claude(token string, opts ...option.RequestOption) *anthropic.Client {
	return claude(s.srv.URL, token, opts...)
}

func messageParams(model, prompt string) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{Model: anthropic.Model(model), MaxTokens: 256,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(prompt))}}
}

var sseHeader = http.Header{"Content-Type": {"text/event-stream"}}

// A recorded Messages response (API reference example) with members the
// envelope does not carry (cache usage, service_tier, container).
const recordedMessage = `{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","model":"claude-test",
"content":[{"type":"text","text":"I'll check the weather."},
  {"type":"tool_use","id":"toolu_01A09q90qw90lq917835lq9","name":"get_weather","input":{"location":"San Francisco, CA","unit":"celsius"}}],
"stop_reason":"tool_use","stop_sequence":null,
"usage":{"input_tokens":384,"cache_creation_input_tokens":0,"cache_read_input_tokens":100,"output_tokens":77,"service_tier":"standard"},
"container":null}`

// Recorded stream events (the Messages streaming documentation).
const (
	evStart     = `{"type":"message_start","message":{"id":"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY","type":"message","role":"assistant","content":[],"model":"claude-test","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"output_tokens":1}}}`
	evTextStart = `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`
	evPing      = `{"type": "ping"}`
	evHello     = `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`
	evBang      = `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"!"}}`
	evTextStop  = `{"type":"content_block_stop","index":0}`
	evToolStart = `{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"get_weather","input":{}}}`
	evToolArgs1 = `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"location\":"}}`
	evToolArgs2 = `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":" \"San Francisco, CA\"}"}}`
	evToolStop  = `{"type":"content_block_stop","index":1}`
	evEndTurn   = `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}`
	evToolUse   = `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}`
	evStop      = `{"type":"message_stop"}`
)

// On both routes a plain answer is the provider's, under the action's id
// and the model the request named, with request-id naming the action and
// x-should-retry: false; an Anthropic route's own body passes with every
// member it had.
func TestMessagesPlainAnswerIsTheProviders(t *testing.T) {
	s := newGateway(t, func(o *stackOptions) { o.claude = true })
	check := func(t *testing.T, msg *anthropic.Message, raw *http.Response) string {
		t.Helper()
		id := raw.Header.Get("X-Durallm-Action-Id")
		if msg.ID != id || !strings.HasPrefix(id, "gw-") || raw.Header.Get("Request-Id") != id || raw.Header.Get("X-Should-Retry") != "false" ||
			raw.Header.Get("X-Durallm-State") != "completed" {
			t.Fatalf("message %s, headers %v", msg.ID, raw.Header)
		}
		return id
	}
	t.Run("an OpenAI-compatible route", func(t *testing.T) {
		s.p.Push(providertest.Answer("hello from the provider"))
		var raw *http.Response
		msg, err := s.claude(tokenA).Messages.New(testCtx(t), messageParams("demo", "say hello"), option.WithResponseInto(&raw))
		if err != nil {
			t.Fatal(err)
		}
		id := check(t, msg, raw)
		if len(msg.Content) != 1 || msg.Content[0].AsText().Text != "hello from the provider" || msg.Model != "demo" ||
			msg.StopReason != anthropic.StopReasonEndTurn || msg.Usage.OutputTokens == 0 {
			t.Fatalf("message %+v", msg)
		}
		// Upstream, the attempt's Idempotency-Key is the action id.
		if rec := s.p.Received(); rec[len(rec)-1].IdempotencyKey != id || rec[len(rec)-1].Model != "model-primary" {
			t.Fatalf("upstream %+v", rec[len(rec)-1])
		}
	})
	t.Run("an Anthropic route", func(t *testing.T) {
		s.p.Push(providertest.Status(200, nil, recordedMessage))
		var raw *http.Response
		msg, err := s.claude(tokenA).Messages.New(testCtx(t), messageParams("claude", "weather in SF?"), option.WithResponseInto(&raw))
		if err != nil {
			t.Fatal(err)
		}
		id := check(t, msg, raw)
		var got, want map[string]any
		if err := json.Unmarshal([]byte(msg.RawJSON()), &got); err != nil {
			t.Fatal(err)
		}
		_ = json.Unmarshal([]byte(recordedMessage), &want)
		want["id"], want["model"] = id, "claude"
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("message\n got %s\nwant %v", msg.RawJSON(), want)
		}
		if use := msg.Content[1].AsToolUse(); msg.StopReason != anthropic.StopReasonToolUse || use.Name != "get_weather" || msg.Usage.CacheReadInputTokens != 100 {
			t.Fatalf("message %+v", msg)
		}
	})
}

// accumulate reads a stream to its end with the SDK's accumulator,
// returning the message and the events' types.
func accumulate(t *testing.T, s *ssestream.Stream[anthropic.MessageStreamEventUnion]) (anthropic.Message, []string, error) {
	t.Helper()
	var msg anthropic.Message
	var kinds []string
	for s.Next() {
		ev := s.Current()
		kinds = append(kinds, ev.Type)
		if err := msg.Accumulate(ev); err != nil {
			t.Fatal(err)
		}
	}
	return msg, kinds, s.Err()
}

// On both routes a streamed answer, accumulated by the SDK, is the
// provider's, from message_start to message_stop.
func TestMessagesStreamedAnswerIsTheProviders(t *testing.T) {
	s := newGateway(t, func(o *stackOptions) { o.claude = true })
	for _, tc := range []struct {
		name, model string
		behavior    providertest.Behavior
		text        string
		usage       int64
	}{
		{"an OpenAI-compatible route", "demo", providertest.Answer("one two three four"), "one two three four", 0},
		{"an Anthropic route", "claude", providertest.Status(200, sseHeader, providertest.AnthropicEvents(evStart, evTextStart, evPing, evHello, evBang, evTextStop, evEndTurn, evStop)), "Hello!", 15},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s.p.Push(tc.behavior)
			msg, kinds, err := accumulate(t, s.claude(tokenA).Messages.NewStreaming(testCtx(t), messageParams(tc.model, "count")))
			if err != nil {
				t.Fatal(err)
			}
			if kinds[0] != "message_start" || kinds[len(kinds)-2] != "message_delta" || kinds[len(kinds)-1] != "message_stop" {
				t.Fatalf("events %q", kinds)
			}
			if len(msg.Content) != 1 || msg.Content[0].AsText().Text != tc.text || msg.StopReason != anthropic.StopReasonEndTurn ||
				!strings.HasPrefix(msg.ID, "gw-") || msg.Model != anthropic.Model(tc.model) || msg.Usage.OutputTokens == 0 ||
				(tc.usage != 0 && msg.Usage.OutputTokens != tc.usage) {
				t.Fatalf("accumulated %+v", msg)
			}
			if rec := s.p.Received(); !rec[len(rec)-1].Stream {
				t.Fatalf("upstream did not stream: %+v", rec[len(rec)-1])
			}
		})
	}
}

// A tool_use round trip on an OpenAI-compatible route: the model (a
// provider that calls a declared tool once, then answers) asks for the
// tool; the SDK's own ToParam and a tool_result make the next turn, which
// reaches the provider as the tool's result (else it would call the tool
// again). Streamed, the call accumulates as the JSON answer has it.
func TestMessagesToolUseRoundTrip(t *testing.T) {
	s := newGateway(t)
	s.p.SetDefault(providertest.AnswerOrCallTool("it is sunny"))
	c := s.claude(tokenA)
	weather := anthropic.ToolUnionParam{OfTool: &anthropic.ToolParam{Name: "get_weather", Description: anthropic.String("The weather in a city"),
		InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"city": map[string]any{"type": "string"}}, Required: []string{"city"}}}}
	q := anthropic.NewUserMessage(anthropic.NewTextBlock("weather in Paris?"))
	params := anthropic.MessageNewParams{Model: "demo", MaxTokens: 256, Messages: []anthropic.MessageParam{q}, Tools: []anthropic.ToolUnionParam{weather}}
	msg, err := c.Messages.New(testCtx(t), params)
	if err != nil {
		t.Fatal(err)
	}
	if msg.StopReason != anthropic.StopReasonToolUse || len(msg.Content) != 1 {
		t.Fatalf("message %+v", msg)
	}
	use := msg.Content[0].AsToolUse()
	if use.Type != "tool_use" || use.Name != "get_weather" || string(use.Input) != `{"city":"demo"}` || use.ID == "" {
		t.Fatalf("tool use %+v", use)
	}
	streamed, _, err := accumulate(t, c.Messages.NewStreaming(testCtx(t), params))
	if err != nil {
		t.Fatal(err)
	}
	if su := streamed.Content[0].AsToolUse(); streamed.StopReason != anthropic.StopReasonToolUse || su.Name != use.Name || string(su.Input) != string(use.Input) {
		t.Fatalf("streamed %+v", streamed)
	}
	params.Messages = append(params.Messages, msg.ToParam(), anthropic.NewUserMessage(anthropic.NewToolResultBlock(use.ID, "18C and sunny", false)))
	final, err := c.Messages.New(testCtx(t), params)
	if err != nil {
		t.Fatal(err)
	}
	if final.StopReason != anthropic.StopReasonEndTurn || len(final.Content) != 1 || final.Content[0].AsText().Text != "it is sunny" {
		t.Fatalf("final %+v", final)
	}
}

// A tool_use round trip on an Anthropic route: the streamed tool call
// accumulates as the provider sent it, and the next turn reaches the
// provider as Messages again, its tool_use and tool_result blocks as the
// SDK wrote them.
func TestMessagesToolUseOnAnAnthropicRoute(t *testing.T) {
	s := newGateway(t, func(o *stackOptions) { o.claude = true })
	var mu sync.Mutex
	var bodies []string
	s.p.Script(func(r providertest.Request) (providertest.Behavior, bool) {
		mu.Lock()
		defer mu.Unlock()
		bodies = append(bodies, string(r.Body))
		if len(bodies) == 1 {
			return providertest.Status(200, sseHeader, providertest.AnthropicEvents(evStart, evTextStart, evHello, evTextStop, evToolStart, evToolArgs1, evToolArgs2, evToolStop, evToolUse, evStop)), true
		}
		return providertest.Status(200, sseHeader, providertest.AnthropicEvents(evStart, evTextStart, evHello, evBang, evTextStop, evEndTurn, evStop)), true
	})
	c := s.claude(tokenA)
	params := messageParams("claude", "weather in SF?")
	params.Tools = []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{Name: "get_weather",
		InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"location": map[string]any{"type": "string"}}}}}}
	msg, _, err := accumulate(t, c.Messages.NewStreaming(testCtx(t), params))
	if err != nil {
		t.Fatal(err)
	}
	use := msg.Content[1].AsToolUse()
	if msg.StopReason != anthropic.StopReasonToolUse || msg.Content[0].AsText().Text != "Hello" || use.ID != "toolu_01T1x1fJ34qAmk2tNTrN7Up6" ||
		string(use.Input) != `{"location": "San Francisco, CA"}` {
		t.Fatalf("accumulated %+v", msg)
	}
	params.Messages = append(params.Messages, msg.ToParam(), anthropic.NewUserMessage(anthropic.NewToolResultBlock(use.ID, "18C", false)))
	final, _, err := accumulate(t, c.Messages.NewStreaming(testCtx(t), params))
	if err != nil || final.Content[0].AsText().Text != "Hello!" {
		t.Fatalf("final %+v %v", final, err)
	}
	mu.Lock()
	defer mu.Unlock()
	var next struct {
		Model    string `json:"model"`
		Messages []struct {
			Role    string            `json:"role"`
			Content []json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal([]byte(bodies[1]), &next); err != nil || next.Model != "claude-test" || len(next.Messages) != 3 {
		t.Fatalf("upstream %s", bodies[1])
	}
	var block struct {
		Type, ID, Name, ToolUseID string
		Input                     map[string]string
		Content                   json.RawMessage
	}
	if json.Unmarshal(next.Messages[1].Content[1], &block) != nil || block.Type != "tool_use" || block.ID != use.ID || block.Name != "get_weather" ||
		block.Input["location"] != "San Francisco, CA" {
		t.Fatalf("the tool_use upstream: %s", next.Messages[1].Content[1])
	}
	block.ToolUseID = ""
	if json.Unmarshal(next.Messages[2].Content[0], &block) != nil || block.Type != "tool_result" || !strings.Contains(string(next.Messages[2].Content[0]), `"tool_use_id":"`+use.ID+`"`) ||
		!strings.Contains(string(block.Content), "18C") {
		t.Fatalf("the tool_result upstream: %s", next.Messages[2].Content[0])
	}
}

// Errors come in Anthropic's shape, and the SDK raises its typed error
// with the status, type, message and request id: a refusal before any
// start, the provider's own rejection, a 501 for count_tokens; GET
// /v1/models answers in Anthropic's shape to an Anthropic client.
func TestMessagesErrorsInAnthropicsShape(t *testing.T) {
	s := newGateway(t)
	ctx := testCtx(t)
	apiErr := func(t *testing.T, err error, status int, typ string, says string) *anthropic.Error {
		t.Helper()
		var ae *anthropic.Error
		if !errors.As(err, &ae) || ae.StatusCode != status || string(ae.Type()) != typ || !strings.Contains(ae.Message, says) ||
			ae.Response.Header.Get("X-Should-Retry") != "false" {
			t.Fatalf("error %v, want %d %s saying %q", err, status, typ, says)
		}
		return ae
	}
	t.Run("an unknown key", func(t *testing.T) {
		_, err := s.claude("not-a-token").Messages.New(ctx, messageParams("demo", "x"))
		apiErr(t, err, 401, "authentication_error", "API key")
	})
	t.Run("a model not served", func(t *testing.T) {
		_, err := s.claude(tokenA).Messages.New(ctx, messageParams("claude-nope", "x"))
		apiErr(t, err, 404, "not_found_error", "model: ")
	})
	t.Run("a member the envelope cannot carry", func(t *testing.T) {
		_, err := s.claude(tokenA).Messages.New(ctx, messageParams("demo", "x"), option.WithJSONSet("container", "c"))
		apiErr(t, err, 400, "invalid_request_error", "container: not supported")
	})
	t.Run("the provider's rejection", func(t *testing.T) {
		s.p.Push(providertest.Status(400, nil, `{"error":{"type":"invalid_request_error","code":"invalid_value","message":"temperature is out of range","param":"temperature"}}`))
		_, err := s.claude(tokenA).Messages.New(ctx, messageParams("demo", "x"))
		ae := apiErr(t, err, 400, "invalid_request_error", "temperature is out of range")
		if ae.ErrorCode() != "invalid_value" || ae.RequestID == "" || ae.RequestID != ae.Response.Header.Get("X-Durallm-Action-Id") {
			t.Fatalf("code %q, request id %q", ae.ErrorCode(), ae.RequestID)
		}
	})
	t.Run("count_tokens", func(t *testing.T) {
		_, err := s.claude(tokenA).Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{Model: "demo",
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("x"))}})
		apiErr(t, err, 501, "api_error", "count_tokens is not served")
	})
	t.Run("the models, in Anthropic's shape", func(t *testing.T) {
		var ids []string
		it := s.claude(tokenA).Models.ListAutoPaging(ctx, anthropic.ModelListParams{})
		for it.Next() {
			ids = append(ids, it.Current().ID)
		}
		if it.Err() != nil || strings.Join(ids, ",") != "demo,primary" {
			t.Fatalf("models %q %v", ids, it.Err())
		}
		m, err := s.claude(tokenA).Models.Get(ctx, "demo", anthropic.ModelGetParams{})
		if err != nil || m.ID != "demo" || m.Type != "model" {
			t.Fatalf("model %+v %v", m, err)
		}
		_, err = s.claude(tokenA).Models.Get(ctx, "nope", anthropic.ModelGetParams{})
		apiErr(t, err, 404, "not_found_error", "model")
	})
	t.Run("a path nobody serves, in Anthropic's shape to an Anthropic client", func(t *testing.T) {
		r, b := s.do(ctx, http.MethodPost, "/v1/complete", tokenA, `{}`, map[string]string{"Anthropic-Version": "2023-06-01"})
		if r.StatusCode != 404 || !strings.Contains(string(b), `"type":"not_found_error"`) || !strings.Contains(string(b), "/v1/messages") {
			t.Fatalf("%d %s", r.StatusCode, b)
		}
	})
	t.Run("an OpenAI client still gets OpenAI's shape", func(t *testing.T) {
		r, b := s.do(ctx, http.MethodGet, "/v1/models", tokenA, "", nil)
		if r.StatusCode != 200 || !strings.Contains(string(b), `"object":"list"`) {
			t.Fatalf("%d %s", r.StatusCode, b)
		}
	})
	t.Run("the key as @anthropic-ai/sdk sends it: Authorization: Bearer", func(t *testing.T) {
		r, b := s.do(ctx, http.MethodGet, "/v1/models", tokenA, "", map[string]string{"Anthropic-Version": "2026-10-21"})
		if r.StatusCode != 200 || !strings.Contains(string(b), `"has_more":false`) {
			t.Fatalf("%d %s", r.StatusCode, b)
		}
	})
}

// A stream cut after its content: the SDK accumulates what arrived and
// raises the in-band error, durallm_stream_incomplete.
func TestMessagesPartialStreamIsAnError(t *testing.T) {
	s := newGateway(t)
	s.p.Push(providertest.StreamCut(2, providertest.CutReset))
	msg, _, err := accumulate(t, s.claude(tokenA).Messages.NewStreaming(testCtx(t), messageParams("demo", "x")))
	var ae *anthropic.Error
	if !errors.As(err, &ae) || string(ae.Type()) != "api_error" || ae.ErrorCode() != "durallm_stream_incomplete" || !strings.Contains(ae.Message, "(reset)") {
		t.Fatalf("error %v", err)
	}
	if len(msg.Content) != 1 || msg.Content[0].AsText().Text != "chunk1 chunk2" {
		t.Fatalf("accumulated %+v", msg)
	}
	if n := s.requests.Load(); n != 1 {
		t.Fatalf("%d requests reached the gateway", n)
	}
}

// The same Idempotency-Key, sent as the SDK sends any header (a default
// header of the client, or per request): the provider runs once, the
// second answer is the first, replayed; streamed, the same message. The
// same key with another body is a 422.
func TestMessagesSameKeyRunsOnce(t *testing.T) {
	s := newGateway(t)
	s.p.SetDefault(providertest.Answer("only once"))
	c := s.claude(tokenA, option.WithHeader("Idempotency-Key", "order-42"))
	first, err := c.Messages.New(testCtx(t), messageParams("demo", "say hello"))
	if err != nil {
		t.Fatal(err)
	}
	var raw *http.Response
	second, err := c.Messages.New(testCtx(t), messageParams("demo", "say hello"), option.WithResponseInto(&raw))
	if err != nil || second.RawJSON() != first.RawJSON() || raw.Header.Get("X-Durallm-Replayed") != "true" {
		t.Fatalf("second %s %v, first %s", second.RawJSON(), err, first.RawJSON())
	}
	streamed, _, err := accumulate(t, c.Messages.NewStreaming(testCtx(t), messageParams("demo", "say hello")))
	if err != nil || streamed.ID != first.ID || streamed.Content[0].AsText().Text != "only once" {
		t.Fatalf("streamed replay %+v %v", streamed, err)
	}
	if n := s.executed(); n != 1 {
		t.Fatalf("the provider ran %d times", n)
	}
	_, err = c.Messages.New(testCtx(t), messageParams("demo", "another question"))
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != 422 || ae.ErrorCode() != "idempotency_key_reused" {
		t.Fatalf("error %v", err)
	}
}

// A proxy cuts the connection after forwarding the request. With a key,
// the SDK's own retry (a connection error, retried by default) attaches
// to the running action: the provider runs once. Without one the retry is
// a new action: the provider runs twice, and the gateway counts a keyless
// retry.
func TestMessagesCutConnectionRetry(t *testing.T) {
	cutConnectionRetry(t, func(s *gwStack, root, key string) (string, error) {
		var opts []option.RequestOption
		if key != "" {
			opts = append(opts, option.WithHeader("Idempotency-Key", key))
		}
		msg, err := claude(root, tokenA, opts...).Messages.New(testCtx(t), messageParams("demo", "x"))
		if err != nil {
			return "", err
		}
		return msg.Content[0].AsText().Text, nil
	})
}

// An ambiguous keyless request (the provider may have run it, and its
// answer was lost), sent by the SDK with its default retries, reaches the
// gateway once and the provider once: the answer is a 403 conflict_error
// awaiting a verdict, which the SDK does not send again.
func TestMessagesAmbiguousKeylessRequestRunsTheProviderOnce(t *testing.T) {
	s := newGateway(t)
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream %v", stream), func(t *testing.T) {
			before, beforeExec := s.requests.Load(), s.executed()
			s.p.Push(providertest.GoAwayAfterProcessing(http2.ErrCodeNo))
			var err error
			if stream {
				_, _, err = accumulate(t, s.claude(tokenA).Messages.NewStreaming(testCtx(t), messageParams("demo", "x")))
			} else {
				_, err = s.claude(tokenA).Messages.New(testCtx(t), messageParams("demo", "x"))
			}
			var ae *anthropic.Error
			if !errors.As(err, &ae) || ae.StatusCode != http.StatusForbidden || string(ae.Type()) != "conflict_error" ||
				ae.ErrorCode() != "durallm_awaiting_reconciliation" || !strings.Contains(ae.Message, "/reconcile") {
				t.Fatalf("error %v", err)
			}
			if n := s.requests.Load() - before; n != 1 {
				t.Fatalf("%d requests reached the gateway, want 1", n)
			}
			if n := s.executed() - beforeExec; n != 1 {
				t.Fatalf("the provider ran %d times", n)
			}
			if res := s.waitState(ae.RequestID, workflows.StateAwaitingReconciliation); res.AwaitingAttempt != 1 {
				t.Fatalf("status %+v", res)
			}
		})
	}
}

// A 200 whose body is cut on its way: anthropic-sdk-go would send the
// request again (a dropped body is a connection error to it), which
// without a key would run the model again; the gateway's x-should-retry:
// false on every Messages answer keeps it from resending, so one request
// reaches the gateway and the provider runs once. The cut is made in
// front of the gateway: its whole answer, then only the head and the
// first bytes of the body to the client, and the connection closed.
func TestMessagesA200WhoseBodyIsCutIsNotResent(t *testing.T) {
	s := newGateway(t)
	s.p.SetDefault(providertest.Answer("a whole answer that is cut on its way"))
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		rec := httptest.NewRecorder()
		s.g.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.Header().Set("Content-Length", strconv.Itoa(rec.Body.Len()))
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes()[:10])
		_ = http.NewResponseController(w).Flush()
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			c.Close()
		}
	}))
	t.Cleanup(srv.Close)
	_, err := claude(srv.URL, tokenA).Messages.New(testCtx(t), messageParams("demo", "x"))
	if err == nil {
		t.Fatal("a cut body read as an answer")
	}
	if n := requests.Load(); n != 1 {
		t.Fatalf("%d requests reached the gateway, want 1", n)
	}
	if n := s.executed(); n != 1 {
		t.Fatalf("the provider ran %d times", n)
	}
}

// A Messages stream resumes after any of its events: GET
// /v1/messages/{id}?stream=true&starting_after=N gives exactly the events
// after N, each with its id, and the SDK's own decoder and accumulator
// read the whole of it as the message; the message itself reads as JSON
// by its id.
func TestMessagesStreamResumesAfterAnyEvent(t *testing.T) {
	s := newGateway(t)
	s.p.Push(providertest.Answer("one two three four"))
	var raw *http.Response
	msg, _, err := accumulate(t, s.claude(tokenA).Messages.NewStreaming(testCtx(t), messageParams("demo", "count"), option.WithResponseInto(&raw)))
	if err != nil {
		t.Fatal(err)
	}
	id := msg.ID
	get := func(query string) (*http.Response, []byte) {
		return s.do(testCtx(t), http.MethodGet, "/v1/messages/"+id+query, "", "", map[string]string{"X-Api-Key": tokenA, "Anthropic-Version": "2023-06-01"})
	}
	r, b := get("?stream=true")
	if r.StatusCode != 200 {
		t.Fatalf("%d %s", r.StatusCode, b)
	}
	all := readAll(t, strings.NewReader(string(b)))
	if len(all) < 6 || !strings.HasPrefix(all[0].data, `{"type":"message_start"`) || all[len(all)-1].data != `{"type":"message_stop"}` {
		t.Fatalf("events %+v", all)
	}
	for i, e := range all {
		if e.id != strconv.Itoa(i+1) {
			t.Fatalf("event %d has id %q", i, e.id)
		}
	}
	for n := range all {
		r, b := get("?stream=true&starting_after=" + strconv.Itoa(n))
		if got := readAll(t, strings.NewReader(string(b))); r.StatusCode != 200 || fmt.Sprint(got) != fmt.Sprint(all[n:]) {
			t.Fatalf("after %d: %d\n got %+v\nwant %+v", n, r.StatusCode, got, all[n:])
		}
	}
	// The SDK reads the resumed stream from the start with its own decoder.
	resp, _ := http.NewRequestWithContext(testCtx(t), http.MethodGet, s.srv.URL+"/v1/messages/"+id+"?stream=true&starting_after=0", nil)
	resp.Header.Set("X-Api-Key", tokenA)
	res, err := http.DefaultClient.Do(resp)
	if err != nil {
		t.Fatal(err)
	}
	again, _, err := accumulate(t, ssestream.NewStream[anthropic.MessageStreamEventUnion](ssestream.NewDecoder(res), nil))
	if err != nil || again.Content[0].AsText().Text != msg.Content[0].AsText().Text || again.ID != id {
		t.Fatalf("resumed %+v %v", again, err)
	}
	// As JSON, by its id.
	r, b = get("")
	var m anthropic.Message
	if r.StatusCode != 200 || json.Unmarshal(b, &m) != nil || m.ID != id || m.Content[0].AsText().Text != "one two three four" {
		t.Fatalf("%d %s", r.StatusCode, b)
	}
	// Another caller's is a 404 in Anthropic's shape.
	r2, b2 := s.do(testCtx(t), http.MethodGet, "/v1/messages/"+id, "", "", map[string]string{"X-Api-Key": tokenB})
	if r2.StatusCode != 404 || !strings.Contains(string(b2), `"type":"not_found_error"`) {
		t.Fatalf("%d %s", r2.StatusCode, b2)
	}
}

// A request shaped as Claude Code sends one (the beta path, its beta
// header, thinking, effort, context editing, cache hints, its tools,
// temperature and metadata) is served on an OpenAI-compatible route: what
// no route can carry is set aside and named.
func TestMessagesAsClaudeCodeSendsThem(t *testing.T) {
	s := newGateway(t)
	s.p.Push(providertest.Answer("done"))
	body := `{"model":"demo","max_tokens":32000,"stream":true,"temperature":1,
		"thinking":{"type":"adaptive"},"output_config":{"effort":"high"},
		"context_management":{"edits":[{"type":"clear_thinking_20251015","keep":"all"}]},
		"metadata":{"user_id":"user_abc_account_def_session_ghi"},
		"system":[{"type":"text","text":"You are Claude Code."},{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}],
		"tools":[{"name":"Bash","description":"Run a command","input_schema":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}],
		"messages":[{"role":"user","content":[{"type":"text","text":"list the files","cache_control":{"type":"ephemeral"}}]}]}`
	r, b := s.do(testCtx(t), http.MethodPost, "/v1/messages?beta=true", "", body, map[string]string{"Authorization": "Bearer " + tokenA,
		"Anthropic-Version": "2023-06-01", "Anthropic-Beta": "claude-code-20250219,context-management-2025-06-27,interleaved-thinking-2025-05-14"})
	if r.StatusCode != 200 || !strings.HasSuffix(strings.TrimSpace(string(b)), `data: {"type":"message_stop"}`) || !strings.Contains(string(b), `"text":"done"`) {
		t.Fatalf("%d %s", r.StatusCode, b)
	}
	if got := r.Header.Get("X-Durallm-Ignored"); got != "cache_control, context_management, output_config.effort, thinking" {
		t.Fatalf("x-durallm-ignored %q", got)
	}
}
