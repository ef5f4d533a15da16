package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"
	"golang.org/x/net/http2"

	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// The official openai-go (v3.99.0) Responses client, on its defaults (two
// retries), against the gateway's Responses surface (POST /v1/responses)
// on an OpenAI-compatible route ("demo": the providertest provider, which
// speaks chat completions).

func responseParams(model, prompt string) responses.ResponseNewParams {
	return responses.ResponseNewParams{Model: model, Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(prompt)}}
}

// readResponseStream reads a stream to its end with the SDK, checking that
// the sequence numbers count from first, and feeds each event to the
// SDK's Responses accumulator, which refuses an event out of the protocol.
func readResponseStream(t *testing.T, s *ssestream.Stream[responses.ResponseStreamEventUnion], first int64) ([]responses.ResponseStreamEventUnion, *responses.ResponseAccumulator, error) {
	t.Helper()
	acc := &responses.ResponseAccumulator{}
	var evs []responses.ResponseStreamEventUnion
	for n := first; s.Next(); n++ {
		ev := s.Current()
		if ev.SequenceNumber != n {
			t.Fatalf("event %d (%s) has sequence_number %d", n, ev.Type, ev.SequenceNumber)
		}
		evs = append(evs, ev)
		if first > 0 {
			continue // the accumulator needs the stream from its start
		}
		var sev responses.ResponsesServerEventUnion
		if err := json.Unmarshal([]byte(ev.RawJSON()), &sev); err != nil {
			t.Fatal(err)
		}
		if err := acc.AddEvent(sev); err != nil {
			t.Fatalf("event %s: %v", ev.RawJSON(), err)
		}
	}
	return evs, acc, s.Err()
}

// A plain answer is the provider's, under the action's id and the model
// the request named, with x-request-id naming the action; streamed, the
// SDK's accumulator rebuilds the same text from the events, and the
// response the stream ends with is the one the JSON answer is.
func TestResponsesAnswerIsTheProviders(t *testing.T) {
	s := newGateway(t)
	s.p.Push(providertest.Answer("hello from the provider"))
	var raw *http.Response
	resp, err := s.client(tokenA).Responses.New(testCtx(t), responseParams("demo", "say hello"), option.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	id := raw.Header.Get("X-Durallm-Action-Id")
	if resp.ID != id || !strings.HasPrefix(id, "gw-") || raw.Header.Get("X-Request-Id") != id || resp.Status != responses.ResponseStatusCompleted ||
		resp.OutputText() != "hello from the provider" || resp.Model != "demo" || resp.Usage.OutputTokens == 0 || resp.Usage.TotalTokens == 0 {
		t.Fatalf("response %s, headers %v", resp.RawJSON(), raw.Header)
	}
	if rec := s.p.Received(); rec[len(rec)-1].IdempotencyKey != id || rec[len(rec)-1].Model != "model-primary" {
		t.Fatalf("upstream %+v", rec[len(rec)-1])
	}

	s.p.Push(providertest.Answer("one two three four"))
	evs, acc, err := readResponseStream(t, s.client(tokenA).Responses.NewStreaming(testCtx(t), responseParams("demo", "count")), 0)
	if err != nil {
		t.Fatal(err)
	}
	if evs[0].Type != "response.created" || evs[len(evs)-1].Type != "response.completed" || acc.Snapshot().OutputText() != "one two three four" {
		t.Fatalf("events %d, text %q", len(evs), acc.Snapshot().OutputText())
	}
	if rec := s.p.Received(); !rec[len(rec)-1].Stream {
		t.Fatalf("upstream did not stream: %+v", rec[len(rec)-1])
	}
	final := evs[len(evs)-1].Response
	got, err := s.client(tokenA).Responses.Get(testCtx(t), final.ID, responses.ResponseGetParams{})
	if err != nil || got.RawJSON() != strings.TrimSpace(string(mustJSON(t, final.RawJSON()))) {
		t.Fatalf("retrieved %v %v\nstreamed %s", got, err, final.RawJSON())
	}
}

func mustJSON(t *testing.T, s string) []byte {
	t.Helper()
	if !json.Valid([]byte(s)) {
		t.Fatalf("not JSON: %s", s)
	}
	return []byte(s)
}

// A function tool round trip: the model (a provider that calls a declared
// tool once, then answers) asks for the tool; the next request carries the
// function_call item (the SDK's own ToParam of it) and a
// function_call_output, which reach the provider as the tool's result
// (else it would call the tool again). Streamed, the call accumulates as
// the JSON answer has it.
func TestResponsesFunctionToolRoundTrip(t *testing.T) {
	s := newGateway(t)
	s.p.SetDefault(providertest.AnswerOrCallTool("it is sunny"))
	var mu sync.Mutex
	var last []byte
	s.p.Script(func(r providertest.Request) (providertest.Behavior, bool) {
		mu.Lock()
		defer mu.Unlock()
		last = append([]byte(nil), r.Body...)
		return providertest.Behavior{}, false
	})
	c := s.client(tokenA)
	params := responseParams("demo", "weather in Paris?")
	params.Tools = []responses.ToolUnionParam{responses.ToolParamOfFunction("get_weather",
		map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}}, false)}
	resp, err := c.Responses.New(testCtx(t), params)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Output) != 1 || resp.Output[0].Type != "function_call" {
		t.Fatalf("response %s", resp.RawJSON())
	}
	call := resp.Output[0].AsFunctionCall()
	if call.Name != "get_weather" || call.Arguments != `{"city":"demo"}` || call.CallID == "" {
		t.Fatalf("call %s", resp.Output[0].RawJSON())
	}
	_, acc, err := readResponseStream(t, c.Responses.NewStreaming(testCtx(t), params), 0)
	if err != nil {
		t.Fatal(err)
	}
	if out := acc.Snapshot().Output; len(out) != 1 || out[0].Name != call.Name || out[0].Arguments != call.Arguments {
		t.Fatalf("streamed %+v", out)
	}
	params.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
		responses.ResponseInputItemParamOfMessage("weather in Paris?", responses.EasyInputMessageRoleUser),
		{OfFunctionCall: &responses.ResponseFunctionToolCallParam{CallID: call.CallID, Name: call.Name, Arguments: call.Arguments}},
		{OfFunctionCallOutput: &responses.ResponseInputItemFunctionCallOutputParam{CallID: openai.String(call.CallID),
			Output: responses.ResponseInputItemFunctionCallOutputOutputUnionParam{OfString: openai.String("18C and sunny")}}},
	}}
	final, err := c.Responses.New(testCtx(t), params)
	if err != nil {
		t.Fatal(err)
	}
	if final.OutputText() != "it is sunny" || len(final.Output) != 1 {
		t.Fatalf("final %s", final.RawJSON())
	}
	var upstream struct {
		Messages []struct {
			Role       string          `json:"role"`
			ToolCalls  json.RawMessage `json:"tool_calls"`
			ToolCallID string          `json:"tool_call_id"`
			Content    json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	mu.Lock()
	defer mu.Unlock()
	if err := json.Unmarshal(last, &upstream); err != nil || len(upstream.Messages) != 3 ||
		upstream.Messages[1].Role != "assistant" || !strings.Contains(string(upstream.Messages[1].ToolCalls), `"id":"`+call.CallID+`"`) ||
		upstream.Messages[2].Role != "tool" || upstream.Messages[2].ToolCallID != call.CallID || string(upstream.Messages[2].Content) != `"18C and sunny"` {
		t.Fatalf("upstream %s", last)
	}
}

// A stream cut after its events 0 to 3 resumes with the SDK's own
// retrieve (GET /v1/responses/{id}?stream=true&starting_after=3): exactly
// the events after 3 follow, numbered on from 4, and with the four read
// they are the whole stream; the text read and resumed is the answer.
func TestResponsesStreamCutAfterThreeResumesWithTheRest(t *testing.T) {
	s := newGateway(t)
	chunks := []string{"```", "go\n", "x := 1\n", "```"}
	s.p.Push(scripted(chunks...))
	c := s.client(tokenA)
	full, _, err := readResponseStream(t, c.Responses.NewStreaming(testCtx(t), responseParams("demo", "a fence")), 0)
	if err != nil {
		t.Fatal(err)
	}
	id := full[0].Response.ID
	// The cut: a reader that read events 0 to 3 and was cut off. Keyed, so
	// that its leaving does not cancel the action.
	s.p.Push(scripted(chunks...))
	ctxCut, cut := context.WithCancel(testCtx(t))
	st := c.Responses.NewStreaming(ctxCut, responseParams("demo", "a fence"), option.WithHeader("Idempotency-Key", "cut-after-3"))
	var read []responses.ResponseStreamEventUnion
	for len(read) < 4 && st.Next() {
		read = append(read, st.Current())
	}
	cut()
	_ = st.Close()
	if len(read) != 4 || read[3].SequenceNumber != 3 {
		t.Fatalf("read %d events", len(read))
	}
	cutID := read[0].Response.ID
	rest, _, err := readResponseStream(t, c.Responses.GetStreaming(testCtx(t), cutID, responses.ResponseGetParams{StartingAfter: openai.Int(3)}), 4)
	if err != nil {
		t.Fatal(err)
	}
	whole, _, err := readResponseStream(t, c.Responses.GetStreaming(testCtx(t), cutID, responses.ResponseGetParams{}), 0)
	if err != nil {
		t.Fatal(err)
	}
	all := append(append([]responses.ResponseStreamEventUnion{}, read...), rest...)
	if len(all) != len(whole) || len(whole) != len(full) {
		t.Fatalf("read %d + resumed %d events, the whole stream has %d (the first stream %d)", len(read), len(rest), len(whole), len(full))
	}
	var text strings.Builder
	for i := range whole {
		if all[i].RawJSON() != whole[i].RawJSON() {
			t.Fatalf("event %d:\n got %s\nwant %s", i, all[i].RawJSON(), whole[i].RawJSON())
		}
		// The same stream as the first request's, but for the action's id
		// and the second it was created in.
		if sameButCreated(strings.ReplaceAll(whole[i].RawJSON(), cutID, id)) != sameButCreated(full[i].RawJSON()) {
			t.Fatalf("event %d differs from the first stream's:\n%s\n%s", i, whole[i].RawJSON(), full[i].RawJSON())
		}
		if all[i].Type == "response.output_text.delta" {
			text.WriteString(all[i].Delta)
		}
	}
	if text.String() != "```go\nx := 1\n```" {
		t.Fatalf("text %q", text.String())
	}
	if n := s.executed(); n != 2 {
		t.Fatalf("the provider ran %d times", n)
	}
}

// The same Idempotency-Key: the provider runs once; every later request
// with it, JSON or streamed, gets the first response, replayed. The same
// key with another body is a 422.
func TestResponsesSameKeyRunsOnce(t *testing.T) {
	s := newGateway(t)
	s.p.SetDefault(providertest.Answer("only once"))
	c := s.client(tokenA, option.WithHeader("Idempotency-Key", "order-42"))
	var ids []string
	for i, streamed := range []bool{false, false, true} {
		var raw *http.Response
		if streamed {
			evs, _, err := readResponseStream(t, c.Responses.NewStreaming(testCtx(t), responseParams("demo", "say hello"), option.WithResponseInto(&raw)), 0)
			if err != nil || evs[len(evs)-1].Response.OutputText() != "only once" {
				t.Fatalf("streamed %d: %v", i, err)
			}
			ids = append(ids, evs[0].Response.ID)
		} else {
			resp, err := c.Responses.New(testCtx(t), responseParams("demo", "say hello"), option.WithResponseInto(&raw))
			if err != nil || resp.OutputText() != "only once" {
				t.Fatalf("request %d: %v", i, err)
			}
			ids = append(ids, resp.ID)
		}
		if replayed := raw.Header.Get("X-Durallm-Replayed") == "true"; replayed != (i > 0) || ids[i] != ids[0] {
			t.Fatalf("request %d: response %s, replayed %v", i, ids[i], replayed)
		}
	}
	if n := s.executed(); n != 1 {
		t.Fatalf("the provider ran %d times", n)
	}
	_, err := c.Responses.New(testCtx(t), responseParams("demo", "another question"))
	var ae *openai.Error
	if !errors.As(err, &ae) || ae.StatusCode != 422 || ae.Code != "idempotency_key_reused" {
		t.Fatalf("error %v", err)
	}
}

// An ambiguous keyless request (the provider may have run it, and its
// answer was lost), sent by the SDK with its default retries, reaches the
// gateway once and the provider once: the answer is chat's, a 403
// durallm_awaiting_reconciliation with x-should-retry: false, which the
// SDK does not send again.
func TestResponsesAmbiguousKeylessRequestRunsTheProviderOnce(t *testing.T) {
	s := newGateway(t)
	c := s.client(tokenA)
	for _, tc := range []struct {
		name string
		send func(t *testing.T) error
	}{
		{"as JSON", func(t *testing.T) error {
			_, err := c.Responses.New(testCtx(t), responseParams("demo", "x"))
			return err
		}},
		{"streamed", func(t *testing.T) error {
			_, _, err := readResponseStream(t, c.Responses.NewStreaming(testCtx(t), responseParams("demo", "x")), 0)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s.p.Push(providertest.GoAwayAfterProcessing(http2.ErrCodeNo))
			before, beforeExec := s.requests.Load(), s.executed()
			err := tc.send(t)
			var ae *openai.Error
			if !errors.As(err, &ae) || ae.StatusCode != http.StatusForbidden || ae.Type != "durallm_awaiting_reconciliation" ||
				ae.Response.Header.Get("X-Should-Retry") != "false" {
				t.Fatalf("error %v", err)
			}
			if n := s.requests.Load() - before; n != 1 {
				t.Fatalf("%d requests reached the gateway, want 1", n)
			}
			if n := s.executed() - beforeExec; n != 1 {
				t.Fatalf("the provider ran %d times", n)
			}
			id := ae.Response.Header.Get("X-Durallm-Action-Id")
			if res := s.waitState(id, workflows.StateAwaitingReconciliation); res.AwaitingAttempt != 1 {
				t.Fatalf("status %+v", res)
			}
		})
	}
}

// A stream cut after its content: the events that arrived, then
// response.failed naming why, then the in-band error the SDK raises.
func TestResponsesPartialStreamIsAnError(t *testing.T) {
	s := newGateway(t)
	s.p.Push(providertest.StreamCut(2, providertest.CutReset))
	evs, acc, err := readResponseStream(t, s.client(tokenA).Responses.NewStreaming(testCtx(t), responseParams("demo", "x")), 0)
	var se *ssestream.StreamError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "durallm_stream_incomplete") {
		t.Fatalf("error %v", err)
	}
	if last := evs[len(evs)-1]; last.Type != "response.failed" || last.Response.Error.Code != "reset" || acc.Snapshot().OutputText() != "chunk1 chunk2" {
		t.Fatalf("last event %s, text %q", last.RawJSON(), acc.Snapshot().OutputText())
	}
	if n := s.requests.Load(); n != 1 {
		t.Fatalf("%d requests reached the gateway", n)
	}
}

// What the envelope cannot carry is a 400 the SDK raises, naming the
// member; another caller's response is a 404.
func TestResponsesRefusals(t *testing.T) {
	s := newGateway(t)
	_, err := s.client(tokenA).Responses.New(testCtx(t), responseParams("demo", "x"), option.WithJSONSet("conversation", "conv_1"))
	var ae *openai.Error
	if !errors.As(err, &ae) || ae.StatusCode != 400 || ae.Param != "conversation" {
		t.Fatalf("error %v", err)
	}
	s.p.Push(providertest.Answer("mine"))
	resp, err := s.client(tokenA).Responses.New(testCtx(t), responseParams("demo", "x"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.client(tokenB).Responses.Get(testCtx(t), resp.ID, responses.ResponseGetParams{})
	if !errors.As(err, &ae) || ae.StatusCode != 404 {
		t.Fatalf("another caller's: %v", err)
	}
	if _, err := s.client(tokenA).Responses.Get(testCtx(t), resp.ID+"x", responses.ResponseGetParams{StartingAfter: openai.Int(1)}); !errors.As(err, &ae) || ae.StatusCode != 404 {
		t.Fatalf("no such response: %v", err)
	}
}

// On an Anthropic route the gateway translates both ways: the Responses
// request goes upstream as Messages, and the provider's answer (a text
// and a tool_use block) comes back as a message item and a function_call
// item, streamed or not; input_tokens counts the cache reads, as OpenAI's
// do (Anthropic's input_tokens do not).
func TestResponsesOnAnAnthropicRoute(t *testing.T) {
	s := newGateway(t, func(o *stackOptions) { o.claude = true })
	c := s.client(tokenA)
	s.p.Push(providertest.Status(200, nil, recordedMessage))
	resp, err := c.Responses.New(testCtx(t), responseParams("claude", "weather in SF?"))
	if err != nil {
		t.Fatal(err)
	}
	call := resp.Output[1].AsFunctionCall()
	if resp.OutputText() != "I'll check the weather." || call.CallID != "toolu_01A09q90qw90lq917835lq9" || call.Name != "get_weather" ||
		call.Arguments != `{"location":"San Francisco, CA","unit":"celsius"}` || resp.Usage.InputTokens != 484 || resp.Usage.InputTokensDetails.CachedTokens != 100 {
		t.Fatalf("response %s", resp.RawJSON())
	}
	s.p.Push(providertest.Status(200, sseHeader, providertest.AnthropicEvents(evStart, evTextStart, evHello, evTextStop, evToolStart, evToolArgs1, evToolArgs2, evToolStop, evToolUse, evStop)))
	_, acc, err := readResponseStream(t, c.Responses.NewStreaming(testCtx(t), responseParams("claude", "weather in SF?")), 0)
	if err != nil {
		t.Fatal(err)
	}
	if snap := acc.Snapshot(); snap.OutputText() != "Hello" || len(snap.Output) != 2 || snap.Output[1].CallID != "toolu_01T1x1fJ34qAmk2tNTrN7Up6" ||
		snap.Output[1].Arguments != `{"location": "San Francisco, CA"}` {
		t.Fatalf("snapshot %+v", snap)
	}
}

// createdAt is a response's created_at member.
var createdAt = regexp.MustCompile(`"created_at":[0-9]+`)

// sameButCreated is an event with its response's created_at set aside:
// two actions started a second apart stream the same events otherwise.
func sameButCreated(event string) string {
	return createdAt.ReplaceAllString(event, `"created_at":0`)
}
