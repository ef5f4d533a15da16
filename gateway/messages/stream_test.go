package messages

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/durallm/durallm/activities"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/exchange"
)

// ev numbers events as a hub does.
type evs struct{ seq uint64 }

func (n *evs) content(s string) activities.StreamEvent {
	n.seq++
	return activities.StreamEvent{Seq: n.seq, Kind: activities.EventContent, Delta: s}
}

func (n *evs) tool(i int, id, name, args string) activities.StreamEvent {
	n.seq++
	return activities.StreamEvent{Seq: n.seq, Kind: activities.EventToolCall, ToolCall: &exchange.ToolCallDelta{Index: i, ID: id, Type: "function", Name: name, Arguments: args}}
}

func (n *evs) finish(f string) activities.StreamEvent {
	n.seq++
	return activities.StreamEvent{Seq: n.seq, Kind: activities.EventFinish, FinishReason: f}
}

func (n *evs) usage(p, c int) activities.StreamEvent {
	n.seq++
	return activities.StreamEvent{Seq: n.seq, Kind: activities.EventUsage, Usage: &providers.Usage{PromptTokens: p, CompletionTokens: c, TotalTokens: p + c}}
}

func (n *evs) of(k activities.EventKind) activities.StreamEvent {
	n.seq++
	return activities.StreamEvent{Seq: n.seq, Kind: k}
}

// sse renders events as the encoder must: each with its event: line.
func sse(evs ...string) string {
	var b strings.Builder
	for _, e := range evs {
		var typ struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal([]byte(e), &typ)
		b.WriteString("event: " + typ.Type + "\ndata: " + e + "\n\n")
	}
	return b.String()
}

const start = `{"type":"message_start","message":{"id":"act-1","type":"message","role":"assistant","model":"claude","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}}`

// The exact events of a text answer, of a tool round, of parallel calls
// whose pieces interleave, and of an answer the events did not carry.
func TestEncoder(t *testing.T) {
	cases := []struct {
		name   string
		run    func(e *Encoder, n *evs) []byte
		want   string
		stream bool
	}{
		{
			name: "text",
			run: func(e *Encoder, n *evs) []byte {
				out := e.Start()
				for _, ev := range []activities.StreamEvent{n.content("Hello"), n.content("!"), n.finish("stop"), n.usage(25, 15), n.of(activities.EventEnd)} {
					out = append(out, e.Event(ev)...)
				}
				return append(out, e.Complete(&providers.Response{Text: "Hello!", FinishReason: "stop", Usage: providers.Usage{PromptTokens: 25, CompletionTokens: 15, TotalTokens: 40}})...)
			},
			want: sse(start,
				`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"!"}}`,
				`{"type":"content_block_stop","index":0}`,
				`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":25,"output_tokens":15}}`,
				`{"type":"message_stop"}`),
		},
		{
			name: "text then a tool call; usage from the events when the result has none",
			run: func(e *Encoder, n *evs) []byte {
				var out []byte
				for _, ev := range []activities.StreamEvent{n.content("Okay."), n.tool(0, "toolu_1", "get_weather", ""), n.tool(0, "", "", `{"location":`),
					n.tool(0, "", "", ` "SF"}`), n.finish("tool_calls"), n.usage(30, 89)} {
					out = append(out, e.Event(ev)...)
				}
				return append(out, e.Complete(nil)...)
			},
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
			name: "parallel calls whose pieces interleave each reach their open block",
			run: func(e *Encoder, n *evs) []byte {
				var out []byte
				for _, ev := range []activities.StreamEvent{n.tool(0, "c0", "a", `{"x"`), n.tool(1, "c1", "b", `{"y"`), n.tool(0, "", "", `:1}`), n.tool(1, "", "", `:2}`)} {
					out = append(out, e.Event(ev)...)
				}
				return append(out, e.Complete(&providers.Response{FinishReason: "tool_calls"})...)
			},
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
			name: "the result completes what the events did not carry: the rest of the text, then the tool calls",
			run: func(e *Encoder, n *evs) []byte {
				out := e.Event(n.content("Hel"))
				return append(out, e.Complete(&providers.Response{Text: "Hello", FinishReason: "tool_calls",
					ToolCalls: json.RawMessage(`[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]`)})...)
			},
			want: sse(start,
				`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"lo"}}`,
				`{"type":"content_block_stop","index":0}`,
				`{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"c","name":"f","input":{}}}`,
				`{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\":1}"}}`,
				`{"type":"content_block_stop","index":1}`,
				`{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"input_tokens":0,"output_tokens":0}}`,
				`{"type":"message_stop"}`),
		},
		{
			name: "a stream cut after its content: whole blocks stopped, a cut tool_use left open, the error event, no message_stop",
			run: func(e *Encoder, n *evs) []byte {
				var out []byte
				for _, ev := range []activities.StreamEvent{n.content("Hel"), n.tool(0, "c0", "a", `{"x":1}`), n.tool(1, "c1", "b", `{"y":`), n.of(activities.EventIncomplete)} {
					out = append(out, e.Event(ev)...)
				}
				return append(out, e.Incomplete(&providers.Response{Text: "Hel", Partial: true, Incomplete: "idle_timeout"}, "idle_timeout")...)
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
				`{"type":"error","error":{"type":"api_error","message":"the answer was cut after it started (idle_timeout): what arrived is all there is, and no second answer follows","details":{"error_code":"durallm_stream_incomplete"}}}`),
		},
		{
			name: "a text stream cut: its block stopped before the error",
			run: func(e *Encoder, n *evs) []byte {
				out := e.Event(n.content("Hel"))
				return append(out, e.Incomplete(&providers.Response{Text: "Hello", Partial: true}, "reset")...)
			},
			want: sse(start,
				`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"lo"}}`,
				`{"type":"content_block_stop","index":0}`,
				`{"type":"error","error":{"type":"api_error","message":"the answer was cut after it started (reset): what arrived is all there is, and no second answer follows","details":{"error_code":"durallm_stream_incomplete"}}}`),
		},
		{
			name: "an answer that is no success after the 200: one error event",
			run: func(e *Encoder, n *evs) []byte {
				out := e.Ping()
				out = append(out, e.Fail(ErrorFor(Problem{Kind: KindAwaitingVerdict, ActionID: "act-1", Attempt: 1}))...)
				return append(out, e.Complete(&providers.Response{Text: "late"})...)
			},
			want: sse(`{"type":"ping"}`, string(ErrorFor(Problem{Kind: KindAwaitingVerdict, ActionID: "act-1", Attempt: 1}).json())),
		},
		{
			name: "a repeated event renders nothing",
			run: func(e *Encoder, n *evs) []byte {
				first := n.content("a")
				out := e.Event(first)
				out = append(out, e.Event(first)...)
				return append(out, e.Complete(&providers.Response{Text: "a"})...)
			},
			want: sse(start,
				`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
				`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}`,
				`{"type":"content_block_stop","index":0}`,
				`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":0,"output_tokens":0}}`,
				`{"type":"message_stop"}`),
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := string(tc.run(NewEncoder(who), &evs{}))
			if got != tc.want {
				t.Fatalf("got\n%s\nwant\n%s", got, tc.want)
			}
			// The same calls give the same bytes.
			if again := string(tc.run(NewEncoder(who), &evs{})); again != got {
				t.Fatal("not deterministic")
			}
			// Every event has its event: line.
			for _, ev := range strings.Split(strings.TrimSuffix(got, "\n\n"), "\n\n") {
				if !strings.HasPrefix(ev, "event: ") || strings.Count(ev, "\ndata: ") != 1 {
					t.Fatalf("an event without its event: line: %q", ev)
				}
			}
		})
	}
}

// Nothing renders after the end.
func TestEncoderEndsOnce(t *testing.T) {
	e := NewEncoder(who)
	if e.Streamed() {
		t.Fatal("streamed before anything")
	}
	e.Event(activities.StreamEvent{Seq: 1, Kind: activities.EventContent, Delta: "x"})
	if !e.Streamed() || e.LastSeq() != 1 {
		t.Fatalf("streamed %v last %d", e.Streamed(), e.LastSeq())
	}
	if e.Complete(nil) == nil {
		t.Fatal("no end")
	}
	for _, b := range [][]byte{e.Complete(nil), e.Incomplete(nil, "reset"), e.Fail(ErrorFor(Problem{Kind: KindInternal})),
		e.Event(activities.StreamEvent{Seq: 2, Kind: activities.EventContent, Delta: "y"}), e.Start()} {
		if b != nil {
			t.Fatalf("rendered after the end: %q", b)
		}
	}
}
