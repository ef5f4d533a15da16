package messages

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/durallm/durallm/gateway/answer"
)

func compact(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatalf("compact %s: %v", s, err)
	}
	return b.String()
}

// Each Messages member lands where the envelope carries it.
func TestParseRequest(t *testing.T) {
	cases := []struct {
		name    string
		body    string
		stream  bool
		want    string // the envelope
		ignored []string
	}{
		{
			name: "minimal",
			body: `{"model":"claude","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`,
			want: `{"messages":[{"role":"user","content":"hi"}],"params":{"max_tokens":64}}`,
		},
		{
			name: "system as a string, sampling, stop sequences, metadata, stream",
			body: `{"model":"claude","max_tokens":1024,"system":"be brief","stream":true,
				"messages":[{"role":"user","content":"hi"}],
				"temperature":0.2,"top_p":0.9,"top_k":40,"stop_sequences":["END","STOP"],"metadata":{"user_id":"u-42"}}`,
			stream: true,
			want: `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"stream":true,
				"params":{"max_tokens":1024,"stop":["END","STOP"],"temperature":0.2,"top_k":40,"top_p":0.9,"user":"u-42"}}`,
		},
		{
			name: "system as text blocks, with cache_control set aside",
			body: `{"model":"claude","max_tokens":8,"system":[{"type":"text","text":"one"},{"type":"text","text":"two","cache_control":{"type":"ephemeral"}}],
				"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral","ttl":"1h"}}]}]}`,
			want: `{"messages":[{"role":"system","content":[{"type":"text","text":"one"},{"type":"text","text":"two"}]},
				{"role":"user","content":[{"type":"text","text":"hi"}]}],"params":{"max_tokens":8}}`,
			ignored: []string{"cache_control"},
		},
		{
			name: "what Claude Code sends: adaptive thinking, effort and context editing set aside, a format carried as a strict JSON schema",
			body: `{"model":"claude","max_tokens":32000,"temperature":1,"thinking":{"type":"adaptive"},
				"output_config":{"effort":"high","format":{"type":"json_schema","schema":{"type":"object","properties":{"title":{"type":"string"}}}}},
				"context_management":{"edits":[{"type":"clear_thinking_20251015","keep":"all"}]},
				"messages":[{"role":"user","content":"name this"}]}`,
			want: `{"messages":[{"role":"user","content":"name this"}],
				"response_format":{"type":"json_schema","json_schema":{"name":"output","schema":{"type":"object","properties":{"title":{"type":"string"}}},"strict":true}},
				"params":{"max_tokens":32000,"temperature":1}}`,
			ignored: []string{"context_management", "output_config.effort", "thinking"},
		},
		{
			name: "images: base64 and url",
			body: `{"model":"claude","max_tokens":8,"messages":[{"role":"user","content":[
				{"type":"text","text":"what is this?"},
				{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},
				{"type":"image","source":{"type":"url","url":"https://example.com/cat.jpg"}}]}]}`,
			want: `{"messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},
				{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}},
				{"type":"image_url","image_url":{"url":"https://example.com/cat.jpg"}}]}],"params":{"max_tokens":8}}`,
		},
		{
			name: "a tool round trip: tools, a named choice without parallel calls, tool_use, tool_result as a string and as blocks",
			body: `{"model":"claude","max_tokens":100,
				"tools":[{"name":"get_weather","description":"Current weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}},
				         {"type":"custom","name":"now","input_schema":{"type":"object"},"strict":true,"cache_control":{"type":"ephemeral"}}],
				"tool_choice":{"type":"tool","name":"get_weather","disable_parallel_tool_use":true},
				"messages":[
					{"role":"user","content":"weather in SF and NYC?"},
					{"role":"assistant","content":[{"type":"text","text":"Checking."},
						{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city": "SF"}},
						{"type":"tool_use","id":"toolu_2","name":"get_weather","input":{"city":"NYC"}}]},
					{"role":"user","content":[
						{"type":"tool_result","tool_use_id":"toolu_1","content":"18C"},
						{"type":"tool_result","tool_use_id":"toolu_2","content":[{"type":"text","text":"unknown city"}],"is_error":true},
						{"type":"text","text":"thanks"}]}]}`,
			want: `{"messages":[
					{"role":"user","content":"weather in SF and NYC?"},
					{"role":"assistant","content":"Checking.","tool_calls":[
						{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"SF\"}"}},
						{"id":"toolu_2","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"NYC\"}"}}]},
					{"role":"tool","content":"18C","tool_call_id":"toolu_1"},
					{"role":"tool","content":[{"type":"text","text":"unknown city"}],"tool_call_id":"toolu_2"},
					{"role":"user","content":[{"type":"text","text":"thanks"}]}],
				"tools":[
					{"type":"function","function":{"name":"get_weather","description":"Current weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},
					{"type":"function","function":{"name":"now","parameters":{"type":"object"},"strict":true}}],
				"tool_choice":{"type":"function","function":{"name":"get_weather"}},
				"params":{"max_tokens":100,"parallel_tool_calls":false}}`,
			ignored: []string{"cache_control", "is_error"},
		},
		{
			name: "tool choices any, auto and none; a tool_use-only turn; a tool_result with no content",
			body: `{"model":"claude","max_tokens":8,"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"},
				"messages":[{"role":"user","content":"go"},
					{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]},
					{"role":"user","content":[{"type":"tool_result","tool_use_id":"t"}]}]}`,
			want: `{"messages":[{"role":"user","content":"go"},
				{"role":"assistant","tool_calls":[{"id":"t","type":"function","function":{"name":"f","arguments":"{}"}}]},
				{"role":"tool","content":"","tool_call_id":"t"}],
				"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"required","params":{"max_tokens":8}}`,
		},
		{
			name: "role system entries where they stand; several assistant text blocks; thinking set aside",
			body: `{"model":"claude","max_tokens":8,"thinking":{"type":"enabled","budget_tokens":1024},"tool_choice":{"type":"none"},
				"messages":[{"role":"user","content":"hi"},
					{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"s"},{"type":"text","text":"a"},{"type":"text","text":"b","citations":[]}]},
					{"role":"system","content":[{"type":"text","text":"be kind"}]},
					{"role":"user","content":"again"}]}`,
			want: `{"messages":[{"role":"user","content":"hi"},
				{"role":"assistant","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
				{"role":"system","content":[{"type":"text","text":"be kind"}]},
				{"role":"user","content":"again"}],"tool_choice":"none","params":{"max_tokens":8}}`,
			ignored: []string{"thinking"},
		},
		{
			name: "disabled thinking, null members and an auto choice are nothing to announce",
			body: `{"model":"claude","max_tokens":8,"thinking":{"type":"disabled"},"system":null,"temperature":null,"service_tier":null,
				"tool_choice":{"type":"auto"},"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"x","is_error":false}]}]}`,
			want: `{"messages":[{"role":"tool","content":"x","tool_call_id":"t"}],"tool_choice":"auto","params":{"max_tokens":8}}`,
		},
		{
			name: "parallel tool use turned off without tools is nothing to send",
			body: `{"model":"claude","max_tokens":8,"tool_choice":{"type":"auto","disable_parallel_tool_use":true},"messages":[{"role":"user","content":"hi"}]}`,
			want: `{"messages":[{"role":"user","content":"hi"}],"tool_choice":"auto","params":{"max_tokens":8}}`,
		},
		{
			name:    "service_tier set aside",
			body:    `{"model":"claude","max_tokens":8,"service_tier":"standard_only","messages":[{"role":"user","content":"hi"}]}`,
			want:    `{"messages":[{"role":"user","content":"hi"}],"params":{"max_tokens":8}}`,
			ignored: []string{"service_tier"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, err := parseRequest([]byte(tc.body))
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if req.Model != "claude" || req.Stream != tc.stream {
				t.Fatalf("model %q stream %v", req.Model, req.Stream)
			}
			got, _ := json.Marshal(req.Envelope)
			if string(got) != compact(t, tc.want) {
				t.Fatalf("envelope\n got %s\nwant %s", got, compact(t, tc.want))
			}
			if strings.Join(req.Ignored, ",") != strings.Join(tc.ignored, ",") {
				t.Fatalf("ignored %q, want %q", req.Ignored, tc.ignored)
			}
		})
	}
}

// What the envelope cannot carry is a 400 naming the member, never
// dropped; so is what is malformed.
func TestParseRequestRefusals(t *testing.T) {
	user := `"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		name, body, param string
	}{
		{"not an object", `[1]`, ""},
		{"two objects", `{} {}`, ""},
		{"no model", `{"max_tokens":8,` + user + `}`, "model"},
		{"no max_tokens", `{"model":"m",` + user + `}`, "max_tokens"},
		{"zero max_tokens", `{"model":"m","max_tokens":0,` + user + `}`, "max_tokens"},
		{"fractional max_tokens", `{"model":"m","max_tokens":1.5,` + user + `}`, "max_tokens"},
		{"no messages", `{"model":"m","max_tokens":8}`, "messages"},
		{"empty messages", `{"model":"m","max_tokens":8,"messages":[]}`, "messages"},
		{"an unknown member", `{"model":"m","max_tokens":8,"frobnicate":1,` + user + `}`, "frobnicate"},
		{"container", `{"model":"m","max_tokens":8,"container":"c",` + user + `}`, "container"},
		{"mcp_servers", `{"model":"m","max_tokens":8,"mcp_servers":[],` + user + `}`, "mcp_servers"},
		{"output_config not an object", `{"model":"m","max_tokens":8,"output_config":"low",` + user + `}`, "output_config"},
		{"an output_config member it does not know", `{"model":"m","max_tokens":8,"output_config":{"task_budget":{}},` + user + `}`, "output_config.task_budget"},
		{"an output format other than a JSON schema", `{"model":"m","max_tokens":8,"output_config":{"format":{"type":"grammar"}},` + user + `}`, "output_config.format.type"},
		{"an output format without its schema", `{"model":"m","max_tokens":8,"output_config":{"format":{"type":"json_schema"}},` + user + `}`, "output_config.format.schema"},
		{"inference_geo", `{"model":"m","max_tokens":8,"inference_geo":"us",` + user + `}`, "inference_geo"},
		{"context_management not an object", `{"model":"m","max_tokens":8,"context_management":[1],` + user + `}`, "context_management"},
		{"stream not a boolean", `{"model":"m","max_tokens":8,"stream":"yes",` + user + `}`, "stream"},
		{"temperature not a number", `{"model":"m","max_tokens":8,"temperature":"hot",` + user + `}`, "temperature"},
		{"stop_sequences not strings", `{"model":"m","max_tokens":8,"stop_sequences":[1],` + user + `}`, "stop_sequences"},
		{"metadata other than user_id", `{"model":"m","max_tokens":8,"metadata":{"user_id":"u","tenant":"t"},` + user + `}`, "metadata.tenant"},
		{"thinking of an unknown type", `{"model":"m","max_tokens":8,"thinking":{"type":"deep"},` + user + `}`, "thinking.type"},
		{"a role it does not know", `{"model":"m","max_tokens":8,"messages":[{"role":"tool","content":"x"}]}`, "messages.0.role"},
		{"a message member it does not know", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"x","name":"ann"}]}`, "messages.0.name"},
		{"no content", `{"model":"m","max_tokens":8,"messages":[{"role":"user"}]}`, "messages.0.content"},
		{"a document", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":"x"}}]}]}`, "messages.0.content.0.type"},
		{"a file image source", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"file","file_id":"f"}}]}]}`, "messages.0.content.0.source.type"},
		{"an image by path", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"file:///etc/passwd"}}]}]}`, "messages.0.content.0.source.url"},
		{"a base64 image without a media type", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"AAAA"}}]}]}`, "messages.0.content.0.source"},
		{"an image in an assistant turn", `{"model":"m","max_tokens":8,"messages":[{"role":"assistant","content":[{"type":"image","source":{"type":"url","url":"https://x/y.png"}}]}]}`, "messages.0.content.0.type"},
		{"tool_use in a user turn", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]}]}`, "messages.0.content.0.type"},
		{"tool_use input not an object", `{"model":"m","max_tokens":8,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":[1]}]}]}`, "messages.0.content.0.input"},
		{"a server tool's block", `{"model":"m","max_tokens":8,"messages":[{"role":"assistant","content":[{"type":"server_tool_use","id":"s","name":"web_search","input":{}}]}]}`, "messages.0.content.0.type"},
		{"a tool_result without its id", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"tool_result","content":"x"}]}]}`, "messages.0.content.0.tool_use_id"},
		{"a document in a tool_result", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"document"}]}]}]}`, "messages.0.content.0.content.0.type"},
		{"an image in the system prompt", `{"model":"m","max_tokens":8,"system":[{"type":"image","source":{}}],` + user + `}`, "system.0.type"},
		{"a server tool", `{"model":"m","max_tokens":8,"tools":[{"type":"web_search_20250305","name":"web_search"}],` + user + `}`, "tools.0.type"},
		{"a tool without a schema", `{"model":"m","max_tokens":8,"tools":[{"name":"f"}],` + user + `}`, "tools.0.input_schema"},
		{"a tool member it does not know", `{"model":"m","max_tokens":8,"tools":[{"name":"f","input_schema":{},"input_examples":[]}],` + user + `}`, "tools.0.input_examples"},
		{"a tool choice of an unknown type", `{"model":"m","max_tokens":8,"tool_choice":{"type":"all"},` + user + `}`, "tool_choice.type"},
		{"a tool choice without its name", `{"model":"m","max_tokens":8,"tool_choice":{"type":"tool"},` + user + `}`, "tool_choice.name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseRequest([]byte(tc.body))
			if err == nil {
				t.Fatal("accepted")
			}
			if err.Kind != answer.InvalidRequest || err.Param != tc.param {
				t.Fatalf("problem %+v, want the param %q", err, tc.param)
			}
			if r := render(*err); r.Status != 400 || r.Header.Get("X-Should-Retry") != "false" ||
				(tc.param != "" && !strings.Contains(string(r.Body), `"message":"`+tc.param+`: `)) {
				t.Fatalf("answer %d %s", r.Status, r.Body)
			}
		})
	}
}

// A refusal names the member, never its value: a value may be a prompt.
func TestParseRequestRefusalsQuoteNoValue(t *testing.T) {
	const canary = "CANARY-PROMPT-7f3a"
	for _, body := range []string{
		`{"model":"m","max_tokens":8,"messages":[{"role":"` + canary + `","content":"x"}]}`,
		`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"` + canary + `"}]}]}`,
		`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"ftp://` + canary + `"}}]}]}`,
		`{"model":"m","max_tokens":"` + canary + `","messages":[{"role":"user","content":"x"}]}`,
	} {
		_, err := parseRequest([]byte(body))
		if err == nil || strings.Contains(err.Message, canary) || strings.Contains(string(render(*err).Body), canary) {
			t.Fatalf("err %v", err)
		}
	}
}
