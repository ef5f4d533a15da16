package messages

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/testsuite/providertest"
)

func text(s string) answer.Delta { return answer.Delta{Kind: answer.Text, Text: s} }

func tool(i int, id, name, args string) answer.Delta {
	return answer.Delta{Kind: answer.ToolCall, ToolCall: answer.ToolCallDelta{Index: i, ID: id, Type: "function", Name: name, Arguments: args}}
}

// feed runs an encoder: Start, the deltas, then end.
func feed(e answer.Encoder, deltas []answer.Delta, end func(answer.Encoder) []answer.Event) []answer.Event {
	out := e.Start()
	for _, d := range deltas {
		out = append(out, e.Delta(d)...)
	}
	return append(out, end(e)...)
}

// wire is the events as the core writes them, without their id: lines.
func wire(evs []answer.Event) string {
	var b strings.Builder
	for _, e := range evs {
		b.WriteString("event: " + e.Name + "\ndata: " + string(e.Data) + "\n\n")
	}
	return b.String()
}

// sse renders events as the encoder must: each with its event: line.
var sse = providertest.AnthropicEvents

const start = `{"type":"message_start","message":{"id":"act-1","type":"message","role":"assistant","model":"claude","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}}`

func whole(r providers.Response) func(answer.Encoder) []answer.Event {
	return func(e answer.Encoder) []answer.Event { return e.End(answer.Answer{Identity: who, Response: &r}) }
}

// The exact events of a text answer, of a tool round, of parallel calls
// whose pieces interleave, of a cut answer and of a failure after the 200.
func TestEncoder(t *testing.T) {
	cut := `{"type":"error","error":{"type":"api_error","message":"the answer was cut after it started (idle_timeout): what arrived is all there is, and no second answer follows","details":{"error_code":"durallm_stream_incomplete"}}}`
	canceled := answer.Problem{Kind: answer.Canceled, Code: "user_stop", Message: "the action was canceled (user_stop)"}
	cases := []struct {
		name   string
		deltas []answer.Delta
		end    func(answer.Encoder) []answer.Event
		want   string
	}{
		{
			name:   "text",
			deltas: []answer.Delta{text("Hello"), text("!")},
			end:    whole(providers.Response{Text: "Hello!", FinishReason: "stop", Usage: providers.Usage{PromptTokens: 25, CompletionTokens: 15, TotalTokens: 40}}),
			want: sse(start,
				`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"!"}}`,
				`{"type":"content_block_stop","index":0}`,
				`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":25,"output_tokens":15}}`,
				`{"type":"message_stop"}`),
		},
		{
			name:   "text then a tool call",
			deltas: []answer.Delta{text("Okay."), tool(0, "toolu_1", "get_weather", ""), tool(0, "", "", `{"location":`), tool(0, "", "", ` "SF"}`)},
			end: whole(providers.Response{Text: "Okay.", FinishReason: "tool_calls", Usage: providers.Usage{PromptTokens: 30, CompletionTokens: 89},
				ToolCalls: json.RawMessage(`[{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":"{\"location\": \"SF\"}"}}]`)}),
			want: sse(start,
				`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Okay."}}`,
				`{"type":"content_block_stop","index":0}`,
				`{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}}`,
				`{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"location\":"}}`,
				`{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":" \"SF\"}"}}`,
				`{"type":"content_block_stop","index":1}`,
				`{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"input_tokens":30,"output_tokens":89}}`,
				`{"type":"message_stop"}`),
		},
		{
			name:   "parallel calls whose pieces interleave each reach their open block; streamed calls make a plain stop tool_use",
			deltas: []answer.Delta{tool(0, "c0", "a", `{"x"`), tool(1, "c1", "b", `{"y"`), tool(0, "", "", `:1}`), tool(1, "", "", `:2}`)},
			end:    whole(providers.Response{FinishReason: "stop"}),
			want: sse(start,
				`{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"c0","name":"a","input":{}}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"x\""}}`,
				`{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"c1","name":"b","input":{}}}`,
				`{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"y\""}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":":1}"}}`,
				`{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":":2}"}}`,
				`{"type":"content_block_stop","index":0}`,
				`{"type":"content_block_stop","index":1}`,
				`{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"input_tokens":0,"output_tokens":0}}`,
				`{"type":"message_stop"}`),
		},
		{
			name:   "a stream cut after its content: whole blocks stopped, a cut tool_use left open, the error event, no message_stop",
			deltas: []answer.Delta{text("Hel"), tool(0, "c0", "a", `{"x":1}`), tool(1, "c1", "b", `{"y":`)},
			end: func(e answer.Encoder) []answer.Event {
				return e.End(answer.Answer{Identity: who, Response: &providers.Response{Text: "Hel", Partial: true}, Incomplete: "idle_timeout"})
			},
			want: sse(start,
				`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}`,
				`{"type":"content_block_stop","index":0}`,
				`{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"c0","name":"a","input":{}}}`,
				`{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"x\":1}"}}`,
				`{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"c1","name":"b","input":{}}}`,
				`{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"y\":"}}`,
				`{"type":"content_block_stop","index":1}`,
				cut),
		},
		{
			name: "an answer that is no success after the 200, before content: message_start, then the error",
			end:  func(e answer.Encoder) []answer.Event { return e.Fail(canceled) },
			want: sse(start, string(wireErrorOf(canceled).json())),
		},
		{
			name:   "a cancel after content: the text block stopped, then the error",
			deltas: []answer.Delta{text("Hel")},
			end:    func(e answer.Encoder) []answer.Event { return e.Fail(canceled) },
			want: sse(start,
				`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}`,
				`{"type":"content_block_stop","index":0}`,
				string(wireErrorOf(canceled).json())),
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			evs := feed(Surface{}.Stream(who, nil), tc.deltas, tc.end)
			got := wire(evs)
			if got != tc.want {
				t.Fatalf("got\n%s\nwant\n%s", got, tc.want)
			}
			// The same calls give the same events, numbered alike.
			again := feed(Surface{}.Stream(who, nil), tc.deltas, tc.end)
			for i := range evs {
				if evs[i].Seq != again[i].Seq || evs[i].ID != again[i].ID || string(evs[i].Data) != string(again[i].Data) {
					t.Fatal("not deterministic")
				}
			}
			// Every event has its name; every one but the error is
			// numbered from 1, its number its id.
			for i, e := range evs {
				if e.Name == "" {
					t.Fatalf("event %d has no name", i)
				}
				if e.Name == "error" {
					if e.Numbered || e.ID != "" {
						t.Fatalf("the error is numbered: %+v", e)
					}
					continue
				}
				if !e.Numbered || e.Seq != uint64(i+1) || e.ID != strconv.Itoa(i+1) {
					t.Fatalf("event %d numbered %v seq %d id %q", i, e.Numbered, e.Seq, e.ID)
				}
			}
		})
	}
}
