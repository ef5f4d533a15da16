package chat

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/durallm/durallm/gateway/answer"
)

func TestParseChatRequest(t *testing.T) {
	cr, e := parse([]byte(`{"model":"demo","stream":true,"stream_options":{"include_usage":true},"n":1,
		"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],
		"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"auto","response_format":{"type":"json_object"},
		"temperature":0.2,"max_tokens":5,"user":null}`))
	if e != nil {
		t.Fatal(e)
	}
	r := cr.Request
	if cr.Model != "demo" || !cr.Stream || !cr.Options.(Options).IncludeUsage || !r.Stream || len(r.Messages) != 2 || len(r.Tools) != 1 ||
		string(r.ToolChoice) != `"auto"` || string(r.ResponseFormat) != `{"type":"json_object"}` {
		t.Fatalf("%+v", cr)
	}
	// Other members pass through; n and model do not; usage is always
	// asked for upstream; null members are dropped.
	if string(r.Params["temperature"]) != "0.2" || string(r.Params["max_tokens"]) != "5" || string(r.Params["stream_options"]) != `{"include_usage":true}` {
		t.Fatalf("params %v", r.Params)
	}
	for _, k := range []string{"n", "model", "messages", "user"} {
		if _, ok := r.Params[k]; ok {
			t.Fatalf("param %s passed through", k)
		}
	}

	// Not streamed, no usage option: none upstream either.
	cr, e = parse([]byte(`{"model":"demo","messages":[{"role":"user","content":"hi"}]}`))
	if e != nil || cr.Stream || cr.Options.(Options).IncludeUsage || cr.Request.Params != nil {
		t.Fatalf("%+v %v", cr, e)
	}
	// Asked for a stream without usage: usage upstream, not to the caller.
	cr, _ = parse([]byte(`{"model":"demo","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if cr.Options.(Options).IncludeUsage || string(cr.Request.Params["stream_options"]) != `{"include_usage":true}` {
		t.Fatalf("%+v", cr)
	}
}

func TestParseChatRequestRefusals(t *testing.T) {
	for _, tc := range []struct {
		name, body, param string
	}{
		{"not JSON", `{`, ""},
		{"not an object", `[1]`, ""},
		{"null", `null`, ""},
		{"no model", `{"messages":[{"role":"user","content":"hi"}]}`, "model"},
		{"model not a string", `{"model":3,"messages":[{"role":"user","content":"hi"}]}`, "model"},
		{"n of 2", `{"model":"m","n":2,"messages":[{"role":"user","content":"hi"}]}`, "n"},
		{"n not a number", `{"model":"m","n":"1","messages":[{"role":"user","content":"hi"}]}`, "n"},
		{"no messages", `{"model":"m"}`, "messages"},
		{"empty messages", `{"model":"m","messages":[]}`, "messages"},
		{"messages not an array", `{"model":"m","messages":"hi"}`, "messages"},
		{"a message without a role", `{"model":"m","messages":[{"role":"user","content":"a"},{"content":"secret text"}]}`, "messages[1].role"},
		{"stream not a bool", `{"model":"m","stream":"yes","messages":[{"role":"user","content":"hi"}]}`, "stream"},
		{"stream_options not an object", `{"model":"m","stream_options":3,"messages":[{"role":"user","content":"hi"}]}`, "stream_options"},
		{"tools not an array", `{"model":"m","tools":{},"messages":[{"role":"user","content":"hi"}]}`, "tools"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, e := parse([]byte(tc.body))
			if e == nil {
				t.Fatal("accepted")
			}
			r := Surface{}.Problem(*e)
			if e.Kind != answer.InvalidRequest || r.Status != http.StatusBadRequest || e.Param != tc.param {
				t.Fatalf("kind %s status %d param %q, want 400 %q", e.Kind, r.Status, e.Param, tc.param)
			}
			if strings.Contains(e.Message, "secret text") {
				t.Fatalf("the message quotes the request: %s", e.Message)
			}
			var wire map[string]map[string]any
			if err := json.Unmarshal(r.Body, &wire); err != nil || wire["error"]["type"] != "invalid_request_error" {
				t.Fatalf("error body %s: %v", r.Body, err)
			}
		})
	}
}
