package responses

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/providers"
)

var who = answer.Identity{ID: "gw-abc", Created: 1700000000, Model: "demo"}

// encode feeds an encoder the deltas, then ends it with end (or fails it
// with fail when end is nil).
func encode(deltas []answer.Delta, end *answer.Answer, fail *answer.Problem) []answer.Event {
	e := Surface{}.Stream(who, nil)
	evs := e.Start()
	for _, d := range deltas {
		evs = append(evs, e.Delta(d)...)
	}
	if end != nil {
		return append(evs, e.End(*end)...)
	}
	return append(evs, e.Fail(*fail)...)
}

func names(evs []answer.Event) string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Name)
	}
	return strings.Join(out, " ")
}

var mixed = []answer.Delta{
	{Kind: answer.Text, Text: "He"}, {Kind: answer.Text, Text: "llo"},
	{Kind: answer.Refusal, Text: "no"},
	{Kind: answer.ToolCall, ToolCall: answer.ToolCallDelta{Index: 0, ID: "c1", Name: "f"}},
	{Kind: answer.ToolCall, ToolCall: answer.ToolCallDelta{Index: 1, ID: "c2", Name: "g"}},
	{Kind: answer.ToolCall, ToolCall: answer.ToolCallDelta{Index: 0, Arguments: `{"a":`}},
	{Kind: answer.ToolCall, ToolCall: answer.ToolCallDelta{Index: 1, Arguments: `{}`}},
	{Kind: answer.ToolCall, ToolCall: answer.ToolCallDelta{Index: 0, Arguments: `1}`}},
}

// Every event is numbered from 0, its number its sequence_number and its
// SSE id; a refusal after text is a second part of the same message;
// interleaved pieces of parallel calls each reach their own item; the
// same deltas encode the same bytes.
func TestTheEncoderNumbersFromZeroAndIsDeterministic(t *testing.T) {
	end := answer.Answer{Identity: who, Response: &providers.Response{Text: "Hello", Refusal: "no", FinishReason: "tool_calls"}}
	evs := encode(mixed, &end, nil)
	for i, e := range evs {
		var n struct {
			SequenceNumber *uint64 `json:"sequence_number"`
			Type           string  `json:"type"`
		}
		if err := json.Unmarshal(e.Data, &n); err != nil || !e.Numbered || e.Seq != uint64(i) || n.SequenceNumber == nil ||
			*n.SequenceNumber != uint64(i) || e.ID != strconv.Itoa(i) || n.Type != e.Name {
			t.Fatalf("event %d: %+v %s", i, e, e.Data)
		}
	}
	want := "response.created response.in_progress response.output_item.added response.content_part.added response.output_text.delta response.output_text.delta " +
		"response.output_text.done response.content_part.done response.content_part.added response.refusal.delta response.refusal.done response.content_part.done response.output_item.done " +
		"response.output_item.added response.output_item.added response.function_call_arguments.delta response.function_call_arguments.delta response.function_call_arguments.delta " +
		"response.function_call_arguments.done response.output_item.done response.function_call_arguments.done response.output_item.done response.completed"
	if got := names(evs); got != want {
		t.Fatalf("events\n got %s\nwant %s", got, want)
	}
	last := string(evs[len(evs)-1].Data)
	for _, s := range []string{`"content":[{"type":"output_text","annotations":[],"logprobs":[],"text":"Hello"},{"type":"refusal","refusal":"no"}]`,
		`"arguments":"{\"a\":1}","call_id":"c1","name":"f"`, `"arguments":"{}","call_id":"c2","name":"g"`, `"usage":null`} {
		if !strings.Contains(last, s) {
			t.Fatalf("response.completed lacks %s: %s", s, last)
		}
	}
	again := encode(mixed, &end, nil)
	for i := range evs {
		if string(again[i].Data) != string(evs[i].Data) {
			t.Fatalf("event %d encodes otherwise", i)
		}
	}
}

// A failure after content: the open message done as incomplete, a cut
// call left out, a whole one done; response.failed numbered, then the
// in-band error object, not numbered.
func TestTheEncoderFailsAfterWhatIsWhole(t *testing.T) {
	deltas := []answer.Delta{{Kind: answer.Text, Text: "Hi"},
		{Kind: answer.ToolCall, ToolCall: answer.ToolCallDelta{Index: 0, ID: "c1", Name: "f", Arguments: `{}`}},
		{Kind: answer.ToolCall, ToolCall: answer.ToolCallDelta{Index: 1, ID: "c2", Name: "g", Arguments: `{"cut`}}}
	evs := encode(deltas, nil, &answer.Problem{Kind: answer.StreamIncomplete, Code: "idle_timeout", Message: "cut"})
	// The last four numbered events: c2's cut piece, c1 done, failed.
	if tail := names(evs[len(evs)-5 : len(evs)-1]); tail != "response.function_call_arguments.delta response.function_call_arguments.done response.output_item.done response.failed" {
		t.Fatalf("events %s", names(evs))
	}
	failed, errEv := evs[len(evs)-2], evs[len(evs)-1]
	if !strings.Contains(string(failed.Data), `"status":"failed","error":{"code":"idle_timeout","message":"cut"}`) ||
		!strings.Contains(string(failed.Data), `"id":"msg_gw-abc_0","type":"message","status":"incomplete"`) ||
		!strings.Contains(string(failed.Data), `"status":"completed","arguments":"{}"`) || !strings.Contains(string(failed.Data), `"status":"incomplete","arguments":"{\"cut"`) {
		t.Fatalf("response.failed %s", failed.Data)
	}
	if errEv.Numbered || errEv.Name != "" || !strings.HasPrefix(string(errEv.Data), `{"error":{"message":"cut","type":"durallm_stream_incomplete"`) {
		t.Fatalf("error event %+v %s", errEv, errEv.Data)
	}
	// A partial answer's end is the same failure.
	end := answer.Answer{Identity: who, Response: &providers.Response{Text: "Hi", Partial: true}, Incomplete: "reset"}
	if got := encode(deltas[:1], &end, nil); !strings.Contains(string(got[len(got)-2].Data), `"code":"reset"`) {
		t.Fatalf("partial end %s", names(got))
	}
}

// A JSON answer is what a stream of it ends with: a length finish is
// incomplete (max_output_tokens), a partial answer too; no usage is null.
func TestTheJSONAnswer(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    providers.Response
		want []string
	}{
		{"whole", providers.Response{Text: "hi", FinishReason: "stop", Usage: providers.Usage{PromptTokens: 2, CompletionTokens: 1, TotalTokens: 3}},
			[]string{`"status":"completed"`, `"incomplete_details":null`, `"usage":{"input_tokens":2,"input_tokens_details":{"cached_tokens":0},"output_tokens":1,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":3}`}},
		{"cut at the token limit", providers.Response{Text: "hi", FinishReason: "length"},
			[]string{`"status":"incomplete"`, `"incomplete_details":{"reason":"max_output_tokens"}`, `"status":"incomplete","content"`, `"usage":null`}},
		{"filtered", providers.Response{FinishReason: "content_filter"}, []string{`"incomplete_details":{"reason":"content_filter"}`, `"output":[]`}},
		{"partial", providers.Response{Text: "h", Partial: true}, []string{`"incomplete_details":{"reason":"max_output_tokens"}`}},
		{"a call without an id", providers.Response{ToolCalls: json.RawMessage(`[{"type":"function","function":{"name":"f","arguments":"{}"}}]`)},
			[]string{`"call_id":"call_gw-abc_0"`, `"id":"fc_gw-abc_0"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := string(RenderResponse(who, &tc.r))
			for _, w := range tc.want {
				if !strings.Contains(b, w) {
					t.Fatalf("%s lacks %s", b, w)
				}
			}
			if !strings.HasPrefix(b, `{"id":"gw-abc","object":"response","created_at":1700000000,`) || b != string(RenderResponse(who, &tc.r)) {
				t.Fatalf("%s", b)
			}
		})
	}
}
