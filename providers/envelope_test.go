package providers

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestRequestValidate(t *testing.T) {
	ok := Request{Messages: []Message{TextMessage("user", "hi")}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid request: %v", err)
	}
	withTools := Request{
		Messages: []Message{
			TextMessage("user", "weather?"),
			{Role: "assistant", ToolCalls: json.RawMessage(`[{"id":"c","type":"function","function":{"name":"w","arguments":"{}"}}]`)},
			{Role: "tool", ToolCallID: "c", Content: json.RawMessage(`"sunny"`)},
			{Role: "user", Content: json.RawMessage(`[{"type":"text","text":"and"},{"type":"image_url","image_url":{"url":"data:,"}}]`)},
		},
		Tools:          []json.RawMessage{json.RawMessage(`{"type":"function","function":{"name":"w"}}`)},
		ToolChoice:     json.RawMessage(`"auto"`),
		ResponseFormat: json.RawMessage(`{"type":"json_object"}`),
		Params:         map[string]json.RawMessage{"temperature": json.RawMessage(`0.2`), "stream_options": json.RawMessage(`{"include_usage":false}`)},
	}
	if err := withTools.Validate(); err != nil {
		t.Fatalf("valid request with tools: %v", err)
	}

	const secret = "CANARY-prompt-5512"
	bad := Request{
		Messages: []Message{
			{Role: "", Content: json.RawMessage(`"x"`)},
			{Role: "user", Content: json.RawMessage(secret)},
			{Role: "assistant", ToolCalls: json.RawMessage(`[{`)},
		},
		Tools:          []json.RawMessage{nil, json.RawMessage(`{`)},
		ToolChoice:     json.RawMessage(`auto`),
		ResponseFormat: json.RawMessage(`{"type":`),
		Params: map[string]json.RawMessage{
			"model": json.RawMessage(`"other"`), "stream": json.RawMessage(`true`),
			"top_p": json.RawMessage(secret), "seed": nil,
		},
	}
	err := bad.Validate()
	if !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("err = %v", err)
	}
	for _, field := range []string{
		"messages[0].role", "messages[1].content", "messages[2].tool_calls", "tools[0]", "tools[1]",
		"tool_choice", "response_format", `params["model"]`, `params["stream"]`, `params["top_p"]`, `params["seed"]`,
	} {
		if !strings.Contains(err.Error(), field+":") {
			t.Errorf("problem with %s not named in:\n%v", field, err)
		}
	}
	if strings.Contains(err.Error(), secret) {
		t.Fatalf("validation error quotes a value: %v", err)
	}
	if err := (Request{}).Validate(); err == nil || !strings.Contains(err.Error(), "messages: empty") {
		t.Fatalf("empty request: %v", err)
	}
}

func TestTextMessage(t *testing.T) {
	m := TextMessage("user", "say \"hi\"\n")
	if m.Role != "user" || string(m.Content) != `"say \"hi\"\n"` {
		t.Fatalf("TextMessage = %+v (%s)", m, m.Content)
	}
}

// sentBody sends r with the OpenAI adapter's send (the official client)
// through a transport that records the request and answers 200, and
// returns the request.
func TestResponseJSONIsSnakeCase(t *testing.T) {
	b, err := json.Marshal(Response{ID: "i", FinishReason: "stop", ToolCalls: json.RawMessage(`[]`), Usage: Usage{PromptTokens: 1, CompletionTokens: 2, TotalTokens: 3}, Partial: true, Incomplete: "reset"})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"finish_reason"`, `"tool_calls"`, `"prompt_tokens"`, `"completion_tokens"`, `"total_tokens"`, `"partial"`, `"incomplete"`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("%s missing from %s", k, b)
		}
	}
	var back Response
	if err := json.Unmarshal(b, &back); err != nil || back.Usage.TotalTokens != 3 || back.Incomplete != "reset" {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
}
