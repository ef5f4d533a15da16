package gateway

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/providers"
)

func text(s string) answer.Delta    { return answer.Delta{Kind: answer.Text, Text: s} }
func refusal(s string) answer.Delta { return answer.Delta{Kind: answer.Refusal, Text: s} }
func toolDelta(t answer.ToolCallDelta) answer.Delta {
	return answer.Delta{Kind: answer.ToolCall, ToolCall: t}
}

// An answer's deltas, rebuilt from its response alone: its recorded
// pieces, then what they did not carry.
func TestAnswerDeltasFromTheResponse(t *testing.T) {
	calls := json.RawMessage(`[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}},{"id":"c2","type":"function","function":{"name":"g","arguments":"{}"}}]`)
	for _, tc := range []struct {
		name string
		r    providers.Response
		want []answer.Delta
	}{
		{"nothing streamed: the text whole", providers.Response{Text: "hello"}, []answer.Delta{text("hello")}},
		{"the pieces it streamed in", providers.Response{Text: "```go\n```", Pieces: "t3 t3 t3"}, []answer.Delta{text("```"), text("go\n"), text("```")}},
		{"multi-byte text", providers.Response{Text: "héllo", Pieces: "t3 t3"}, []answer.Delta{text("hé"), text("llo")}},
		{"text past the pieces", providers.Response{Text: "abcdef", Pieces: "t2"}, []answer.Delta{text("ab"), text("cdef")}},
		{"pieces past the text are cut to it", providers.Response{Text: "ab", Pieces: "t1 t5 t1"}, []answer.Delta{text("a"), text("b"), text("")}},
		{"refusal", providers.Response{Refusal: "no way", Pieces: "r2 r4"}, []answer.Delta{refusal("no"), refusal(" way")}},
		{"tool calls streamed", providers.Response{ToolCalls: calls, Pieces: "c0:iyn:0 c0::4 c1:iyn:2 c0::2"}, []answer.Delta{
			toolDelta(answer.ToolCallDelta{Index: 0, ID: "c1", Type: "function", Name: "f"}),
			toolDelta(answer.ToolCallDelta{Index: 0, Arguments: `{"a"`}),
			toolDelta(answer.ToolCallDelta{Index: 1, ID: "c2", Type: "function", Name: "g", Arguments: "{}"}),
			toolDelta(answer.ToolCallDelta{Index: 0, Arguments: `:1`}),
			toolDelta(answer.ToolCallDelta{Index: 0, Arguments: `}`}),
		}},
		{"tool calls not streamed", providers.Response{Text: "x", ToolCalls: calls}, []answer.Delta{
			text("x"),
			toolDelta(answer.ToolCallDelta{Index: 0, ID: "c1", Type: "function", Name: "f", Arguments: `{"a":1}`}),
			toolDelta(answer.ToolCallDelta{Index: 1, ID: "c2", Type: "function", Name: "g", Arguments: "{}"}),
		}},
		{"a record that does not parse", providers.Response{Text: "abc", Pieces: "t1 zz"}, []answer.Delta{text("abc")}},
		{"empty", providers.Response{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := answerDeltas(&tc.r); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// What a stream still owes once its answer is known: the rebuilt deltas
// after the ones fed live; by content for an answer without a record.
func TestFedDeltasRest(t *testing.T) {
	feed := func(ds ...answer.Delta) *fedDeltas {
		f := &fedDeltas{}
		for _, d := range ds {
			f.add(d)
		}
		return f
	}
	r := &providers.Response{Text: "```go\n```", Pieces: "t3 t3 t3"}
	if got := feed(text("```")).rest(r); !reflect.DeepEqual(got, []answer.Delta{text("go\n"), text("```")}) {
		t.Fatalf("after one piece: %+v", got)
	}
	if got := feed(text("```"), text("go\n"), text("```")).rest(r); got != nil {
		t.Fatalf("after all: %+v", got)
	}
	// Without a record: what the fed text did not carry.
	if got := feed(text("he")).rest(&providers.Response{Text: "hello"}); !reflect.DeepEqual(got, []answer.Delta{text("llo")}) {
		t.Fatalf("by content: %+v", got)
	}
}
