package responses

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3/responses"

	"github.com/durallm/durallm/gateway/answer"
)

// A string input is one user message; instructions come first; a stream
// asks the envelope for one; no member means no param.
func TestParseAStringInput(t *testing.T) {
	req, p := Surface{}.Parse([]byte(`{"model":"demo","input":"hi","instructions":"be brief","stream":true,"store":true}`))
	if p != nil {
		t.Fatal(p)
	}
	got, _ := json.Marshal(req.Request)
	if req.Model != "demo" || !req.Stream || string(got) != `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"stream":true}` {
		t.Fatalf("%+v %s", req, got)
	}
	if req.Header.Get(IgnoredHeader) != "store" {
		t.Fatalf("header %v", req.Header)
	}
}

// Every member the envelope cannot carry is a 400 naming it, never quoting
// the request; what only the stored responses serve says so.
func TestParseRefusals(t *testing.T) {
	for _, tc := range []struct {
		name, body, param, says string
	}{
		{"not JSON", `{`, "", "JSON object"},
		{"not an object", `[1]`, "", "JSON object"},
		{"no model", `{"input":"hi"}`, "model", "required"},
		{"no input", `{"model":"m"}`, "input", "required"},
		{"an empty input", `{"model":"m","input":[]}`, "input", "non-empty"},
		{"an unknown member", `{"model":"m","input":"hi","prompt":{"id":"p"}}`, "prompt", "not supported"},
		{"conversation", `{"model":"m","input":"hi","conversation":"conv_1"}`, "conversation", "not supported"},
		{"reasoning", `{"model":"m","input":"hi","reasoning":{"effort":"high"}}`, "reasoning", "not supported"},
		{"a built-in tool", `{"model":"m","input":"hi","tools":[{"type":"web_search"}]}`, "tools[0].type", "not supported"},
		{"a tool's unknown member", `{"model":"m","input":"hi","tools":[{"type":"function","name":"f","defer_loading":true}]}`, "tools[0].defer_loading", "not supported"},
		{"a built-in tool choice", `{"model":"m","input":"hi","tool_choice":{"type":"file_search"}}`, "tool_choice.type", "not supported"},
		{"an item type", `{"model":"m","input":[{"type":"reasoning","summary":[]}]}`, "input[0].type", "not supported"},
		{"a file part", `{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]}`, "input[0].content[0].type", "not supported"},
		{"an image by file id", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","file_id":"f"}]}]}`, "input[0].content[0].file_id", "not supported"},
		{"a bad role", `{"model":"m","input":[{"role":"secret text","content":"x"}]}`, "input[0].role", "role"},
		{"a call without call_id", `{"model":"m","input":[{"type":"function_call","name":"f","arguments":"{}"}]}`, "input[0].call_id", "required"},
		{"an output without output", `{"model":"m","input":[{"type":"function_call_output","call_id":"c"}]}`, "input[0].output", "required"},
		{"include", `{"model":"m","input":"hi","include":["message.output_text.logprobs"]}`, "include", "not supported"},
		{"truncation auto", `{"model":"m","input":"hi","truncation":"auto"}`, "truncation", "not supported"},
		{"text verbosity", `{"model":"m","input":"hi","text":{"verbosity":"low"}}`, "text.verbosity", "not supported"},
		{"max_output_tokens of 0", `{"model":"m","input":"hi","max_output_tokens":0}`, "max_output_tokens", "whole number"},
		{"stream not a bool", `{"model":"m","input":"hi","stream":"yes"}`, "stream", "true or false"},
		{"previous_response_id", `{"model":"m","input":"hi","previous_response_id":"gw-1"}`, "previous_response_id", "served only through the gateway's stored responses"},
		{"background", `{"model":"m","input":"hi","background":true}`, "background", "served only through the gateway's stored responses"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, p := Surface{}.Parse([]byte(tc.body))
			if p == nil {
				t.Fatal("accepted")
			}
			r := Surface{}.Problem(*p)
			if p.Kind != answer.InvalidRequest || r.Status != 400 || p.Param != tc.param || !strings.Contains(p.Message, tc.says) {
				t.Fatalf("kind %s status %d param %q message %q", p.Kind, r.Status, p.Param, p.Message)
			}
			if strings.Contains(p.Message, "secret text") {
				t.Fatalf("the message quotes the request: %s", p.Message)
			}
		})
	}
}

// What is harmless is set aside and named; null members, background:
// false, an empty include and truncation: disabled ask for nothing.
func TestParseSetsAsideWhatIsHarmless(t *testing.T) {
	req, p := Surface{}.Parse([]byte(`{"model":"m","input":[{"type":"message","id":"msg_1","status":"completed","role":"assistant",
		"content":[{"type":"output_text","text":"earlier","annotations":[]}]},{"role":"user","content":"now"}],
		"metadata":{"k":"v"},"service_tier":"auto","stream_options":{"include_obfuscation":false},"background":false,
		"include":[],"truncation":"disabled","reasoning":null,"previous_response_id":null,"user":"u1"}`))
	if p != nil {
		t.Fatal(p)
	}
	got, _ := json.Marshal(req.Request)
	if string(got) != `{"messages":[{"role":"assistant","content":"earlier"},{"role":"user","content":"now"}],"params":{"user":"u1"}}` {
		t.Fatalf("%s", got)
	}
	if h := req.Header.Get(IgnoredHeader); h != "input[].id, input[].status, metadata, service_tier, stream_options.include_obfuscation" {
		t.Fatalf("ignored %q", h)
	}
}

// openai-go's request params cannot read a request for this surface: they
// keep no trace of a member they do not know, so a request could not be
// refused for it, and they read a member of the wrong type as absent. Its
// answer types marshal members OpenAI never sends (an output_text's
// annotations as null, which the AI SDK refuses). So the surface reads
// and writes its own wire structs, and the SDK judges them (sdk_test.go).
func TestWhyRequestsAndAnswersUseTheirOwnWireStructs(t *testing.T) {
	var params responses.ResponseNewParams
	if err := json.Unmarshal([]byte(`{"model":"m","input":"hi","conversation_typo":"c"}`), &params); err != nil {
		t.Fatal(err)
	}
	again, _ := json.Marshal(params)
	if strings.Contains(string(again), "conversation_typo") {
		t.Fatal("openai-go's params now keep an unknown member: reconsider reading with them")
	}
	b, _ := json.Marshal(responses.ResponseOutputText{Text: "x"})
	if !strings.Contains(string(b), `"annotations":null`) {
		t.Fatal("openai-go's output_text now marshals as OpenAI sends it: reconsider writing with it")
	}
}
