package responses_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"

	"github.com/durallm/durallm/gateway/answer"
	gwresponses "github.com/durallm/durallm/gateway/responses"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/exchange"
)

// The official Go SDK (openai-go/v3, its Responses client on its
// defaults) against a server made of the surface's functions, written to
// the wire as the gateway's core writes them: the SDK builds the requests
// the surface parses and reads the answers and events it renders, and its
// Responses accumulator checks the events' protocol. (gateway/e2e runs
// the same SDK against the real gateway.)

var surface gwresponses.Surface

var who = answer.Identity{ID: "gw-42", Created: 1700000000, Model: "demo"}

// sdkDoor serves POST /v1/responses with the surface: a request that
// parses is answered with resp, as JSON or, streamed, as its deltas in
// pieces of three bytes and its end. got is the last request parsed.
type sdkDoor struct {
	mu   sync.Mutex
	got  answer.Request
	resp providers.Response
}

func (d *sdkDoor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	req, p := surface.Parse(body)
	if p != nil {
		pr := surface.Problem(*p)
		maps.Copy(w.Header(), pr.Header)
		w.WriteHeader(pr.Status)
		_, _ = w.Write(pr.Body)
		return
	}
	d.mu.Lock()
	d.got = req
	resp := d.resp
	d.mu.Unlock()
	a := answer.Answer{Identity: who, Response: &resp, Incomplete: resp.Incomplete}
	if req.Stream {
		writeStream(w, a)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(surface.Answer(a))
}

// writeStream writes the stream of a's response, in pieces, as the core
// writes a stream: each event's id:, event: and data: lines.
func writeStream(w http.ResponseWriter, a answer.Answer) {
	enc := surface.Stream(who, nil)
	var out strings.Builder
	add := func(evs []answer.Event) {
		for _, e := range evs {
			if e.ID != "" {
				out.WriteString("id: " + e.ID + "\n")
			}
			if e.Name != "" {
				out.WriteString("event: " + e.Name + "\n")
			}
			out.WriteString("data: " + string(e.Data) + "\n\n")
		}
	}
	add(enc.Start())
	for _, d := range pieces(*a.Response) {
		add(enc.Delta(d))
	}
	add(enc.End(a))
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, out.String())
}

// pieces is r's content as an attempt streams it: text, refusal and each
// call's arguments in pieces of three bytes.
func pieces(r providers.Response) []answer.Delta {
	var out []answer.Delta
	cut := func(s string, f func(string)) {
		for i := 0; i < len(s); i += 3 {
			f(s[i:min(i+3, len(s))])
		}
	}
	cut(r.Text, func(s string) { out = append(out, answer.Delta{Kind: answer.Text, Text: s}) })
	cut(r.Refusal, func(s string) { out = append(out, answer.Delta{Kind: answer.Refusal, Text: s}) })
	for _, c := range exchange.WholeChunk(r).ToolCalls {
		out = append(out, answer.Delta{Kind: answer.ToolCall, ToolCall: answer.ToolCallDelta{Index: c.Index, ID: c.ID, Type: "function", Name: c.Name}})
		cut(c.Arguments, func(s string) {
			out = append(out, answer.Delta{Kind: answer.ToolCall, ToolCall: answer.ToolCallDelta{Index: c.Index, Arguments: s}})
		})
	}
	return out
}

func newSDKDoor(t *testing.T, resp providers.Response) (*sdkDoor, openai.Client) {
	d := &sdkDoor{resp: resp}
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close)
	return d, openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("sk-door"))
}

var weather = providers.Response{Text: "Let me check.", FinishReason: "tool_calls",
	ToolCalls: json.RawMessage(`[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
		{"id":"call_2","type":"function","function":{"name":"get_time","arguments":"{}"}}]`),
	Usage: providers.Usage{PromptTokens: 30, CompletionTokens: 12, TotalTokens: 42, CachedTokens: 8}}

// What the SDK sends, every member this package reads, lands in the
// envelope: instructions as the system message, the items as chat
// messages (calls merged into the assistant's message), the function
// tools, tool_choice, text.format and the settings as params.
func TestTheSDKsRequestReachesTheEnvelope(t *testing.T) {
	d, client := newSDKDoor(t, providers.Response{Text: "ok", FinishReason: "stop"})
	schema := map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}}
	params := responses.ResponseNewParams{
		Model:        "demo",
		Instructions: openai.String("be brief"),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			responses.ResponseInputItemParamOfMessage(responses.ResponseInputMessageContentListParam{
				responses.ResponseInputContentParamOfInputText("what is this, and the weather there?"),
				{OfInputImage: &responses.ResponseInputImageParam{ImageURL: openai.String("https://example.com/cat.jpg"), Detail: responses.ResponseInputImageDetailLow}},
			}, responses.EasyInputMessageRoleUser),
			responses.ResponseInputItemParamOfMessage("A cat. Checking.", responses.EasyInputMessageRoleAssistant),
			responses.ResponseInputItemParamOfFunctionCall(`{"city":"Paris"}`, "call_1", "get_weather"),
			responses.ResponseInputItemParamOfFunctionCallOutput("18C"),
			responses.ResponseInputItemParamOfMessage("thanks", responses.EasyInputMessageRoleUser),
		}},
		Tools:             []responses.ToolUnionParam{responses.ToolParamOfFunction("get_weather", schema, true)},
		ToolChoice:        responses.ResponseNewParamsToolChoiceUnion{OfFunctionTool: &responses.ToolChoiceFunctionParam{Name: "get_weather"}},
		ParallelToolCalls: openai.Bool(false),
		MaxOutputTokens:   openai.Int(256),
		Temperature:       openai.Float(0.2),
		TopP:              openai.Float(0.9),
		Text:              responses.ResponseTextConfigParam{Format: responses.ResponseFormatTextConfigParamOfJSONSchema("answer", schema)},
		Metadata:          map[string]string{"order": "42"},
		Store:             openai.Bool(false),
	}
	// The SDK's function_call_output helper names no call: set it.
	params.Input.OfInputItemList[3].OfFunctionCallOutput.CallID = openai.String("call_1")
	resp, err := client.Responses.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	if resp.OutputText() != "ok" {
		t.Fatalf("response %s", resp.RawJSON())
	}
	want := `{"messages":[
		{"role":"system","content":"be brief"},
		{"role":"user","content":[{"type":"text","text":"what is this, and the weather there?"},{"type":"image_url","image_url":{"url":"https://example.com/cat.jpg","detail":"low"}}]},
		{"role":"assistant","content":"A cat. Checking.","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
		{"role":"tool","content":"18C","tool_call_id":"call_1"},
		{"role":"user","content":"thanks"}],
		"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"properties":{"city":{"type":"string"}},"type":"object"},"strict":true}}],
		"tool_choice":{"type":"function","function":{"name":"get_weather"}},
		"response_format":{"type":"json_schema","json_schema":{"name":"answer","schema":{"properties":{"city":{"type":"string"}},"type":"object"}}},
		"params":{"max_tokens":256,"parallel_tool_calls":false,"temperature":0.2,"top_p":0.9}}`
	var b bytes.Buffer
	_ = json.Compact(&b, []byte(want))
	d.mu.Lock()
	defer d.mu.Unlock()
	got, _ := json.Marshal(d.got.Request)
	if string(got) != b.String() {
		t.Fatalf("envelope\n got %s\nwant %s", got, b.String())
	}
	if h := d.got.Header.Get(gwresponses.IgnoredHeader); h != "metadata, store" {
		t.Fatalf("ignored %q", h)
	}
}

// A JSON answer reads as the SDK's Response: the text, each call as a
// function_call item with its call_id, name and arguments, the usage.
func TestTheSDKReadsTheJSONAnswer(t *testing.T) {
	_, client := newSDKDoor(t, weather)
	resp, err := client.Responses.New(context.Background(), responses.ResponseNewParams{Model: "demo",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("weather?")}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.ID != who.ID || resp.Model != "demo" || resp.CreatedAt != 1700000000 || resp.Status != responses.ResponseStatusCompleted ||
		resp.OutputText() != "Let me check." || len(resp.Output) != 3 || resp.Usage.InputTokens != 30 || resp.Usage.OutputTokens != 12 ||
		resp.Usage.TotalTokens != 42 || resp.Usage.InputTokensDetails.CachedTokens != 8 {
		t.Fatalf("response %s", resp.RawJSON())
	}
	for i, want := range []struct{ callID, name, args string }{{"call_1", "get_weather", `{"city":"Paris"}`}, {"call_2", "get_time", "{}"}} {
		c := resp.Output[i+1].AsFunctionCall()
		if c.Type != "function_call" || c.CallID != want.callID || c.Name != want.name || c.Arguments != want.args || c.Status != "completed" {
			t.Fatalf("item %d: %s", i+1, resp.Output[i+1].RawJSON())
		}
	}
	if text := resp.Output[0].AsMessage().Content[0]; !text.JSON.Annotations.Valid() || text.Annotations == nil {
		t.Fatalf("output_text without annotations: %s", text.RawJSON())
	}
}

// stream reads a stream with the SDK, feeding each event to its Responses
// accumulator, which refuses an event out of the protocol.
func stream(t *testing.T, s *ssestream.Stream[responses.ResponseStreamEventUnion]) (kinds []string, acc *responses.ResponseAccumulator, err error) {
	t.Helper()
	acc = &responses.ResponseAccumulator{}
	for n := int64(0); s.Next(); n++ {
		ev := s.Current()
		if ev.SequenceNumber != n {
			t.Fatalf("event %d (%s) has sequence_number %d", n, ev.Type, ev.SequenceNumber)
		}
		kinds = append(kinds, ev.Type)
		var sev responses.ResponsesServerEventUnion
		if err := json.Unmarshal([]byte(ev.RawJSON()), &sev); err != nil {
			t.Fatal(err)
		}
		if err := acc.AddEvent(sev); err != nil {
			t.Fatalf("event %d %s: %v", n, ev.RawJSON(), err)
		}
	}
	return kinds, acc, s.Err()
}

// A streamed answer: the events in OpenAI's order, numbered from 0; the
// accumulator rebuilds the text and the calls, and the response it ends
// with is the JSON answer.
func TestTheSDKReadsTheStream(t *testing.T) {
	_, client := newSDKDoor(t, weather)
	params := responses.ResponseNewParams{Model: "demo", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("weather?")}}
	kinds, acc, err := stream(t, client.Responses.NewStreaming(context.Background(), params))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"response.created", "response.in_progress",
		"response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.delta", "response.output_text.delta", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
		"response.function_call_arguments.delta", "response.function_call_arguments.delta", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
		"response.output_item.added", "response.function_call_arguments.delta",
		"response.function_call_arguments.done", "response.output_item.done", "response.function_call_arguments.done", "response.output_item.done",
		"response.completed"}
	if strings.Join(kinds, " ") != strings.Join(want, " ") {
		t.Fatalf("events\n got %q\nwant %q", kinds, want)
	}
	snap := acc.Snapshot()
	if snap.OutputText() != "Let me check." || snap.TerminalEvent != "response.completed" || len(snap.Output) != 3 ||
		snap.Output[1].Arguments != `{"city":"Paris"}` || snap.Output[1].CallID != "call_1" || snap.Output[2].Name != "get_time" {
		t.Fatalf("snapshot %+v", snap)
	}
	final, err := acc.ReconstructedResponse()
	if err != nil {
		t.Fatal(err)
	}
	r := weather
	if want := strings.TrimSpace(string(surface.Answer(answer.Answer{Identity: who, Response: &r}))); final.RawJSON() != want {
		t.Fatalf("the stream's response\n%s\nis not the JSON answer\n%s", final.RawJSON(), want)
	}
}

// A stream cut after its content started ends with response.failed and
// the in-band error, which the SDK raises after what arrived.
func TestTheSDKRaisesACutStream(t *testing.T) {
	_, client := newSDKDoor(t, providers.Response{Text: "Hello wor", Partial: true, Incomplete: "idle_timeout"})
	params := responses.ResponseNewParams{Model: "demo", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}}
	kinds, acc, err := stream(t, client.Responses.NewStreaming(context.Background(), params))
	var se *ssestream.StreamError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "durallm_stream_incomplete") {
		t.Fatalf("error %v", err)
	}
	if kinds[len(kinds)-1] != "response.failed" || acc.Snapshot().OutputText() != "Hello wor" {
		t.Fatalf("events %q", kinds)
	}
	final, rerr := acc.ReconstructedResponse()
	if rerr != nil || final.Status != responses.ResponseStatusFailed || final.Error.Code != "idle_timeout" {
		t.Fatalf("response %v %v", final, rerr)
	}
}

// A member the envelope cannot carry is a 400 the SDK raises, naming it;
// previous_response_id and background, which only the stored responses
// serve, are refused by Parse alone (this door has no stored ops).
func TestTheSDKRaisesARefusal(t *testing.T) {
	_, client := newSDKDoor(t, providers.Response{Text: "ok"})
	for _, tc := range []struct {
		name, param string
		params      responses.ResponseNewParams
	}{
		{"a built-in tool", "tools[0].type", responses.ResponseNewParams{Tools: []responses.ToolUnionParam{{OfWebSearch: &responses.WebSearchToolParam{Type: "web_search"}}}}},
		{"reasoning", "reasoning", responses.ResponseNewParams{Reasoning: openai.ReasoningParam{Effort: openai.ReasoningEffortHigh}}},
		{"previous_response_id", "previous_response_id", responses.ResponseNewParams{PreviousResponseID: openai.String("gw-1")}},
		{"background", "background", responses.ResponseNewParams{Background: openai.Bool(true)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.params
			p.Model, p.Input = "demo", responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}
			_, err := client.Responses.New(context.Background(), p)
			var ae *openai.Error
			if !errors.As(err, &ae) || ae.StatusCode != 400 || ae.Param != tc.param || !strings.Contains(ae.Message, tc.param) {
				t.Fatalf("error %v", err)
			}
		})
	}
}
