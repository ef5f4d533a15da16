package providers

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
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
func sentBody(t *testing.T, model string, r Request) (*http.Request, []byte) {
	t.Helper()
	var got *http.Request
	var body []byte
	rt := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		got = req
		var err error
		body, err = io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(`{}`)), Request: req}, nil
	})
	route := Route{Name: "r", Kind: KindOpenAI, BaseURL: "http://127.0.0.1:1/v1?api-version=2024-10-21", Model: model}
	resp, err := sendChatCompletion(context.Background(), rt, outgoing{route: route, key: "sk-test", url: "unused", request: r})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return got, body
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestRequestBody(t *testing.T) {
	r := Request{
		Messages:       []Message{TextMessage("system", "be brief"), {Role: "user", Content: json.RawMessage(`[{"type":"text","text":"hi"}]`), Name: "ann"}},
		Tools:          []json.RawMessage{json.RawMessage(`{"type":"function","function":{"name":"f"}}`)},
		ToolChoice:     json.RawMessage(`"required"`),
		ResponseFormat: json.RawMessage(`{"type":"json_schema","json_schema":{"name":"s","schema":{}}}`),
		Stream:         true,
		Params:         map[string]json.RawMessage{"temperature": json.RawMessage(`0.5`), "max_tokens": json.RawMessage(`64`), "x_vendor": json.RawMessage(`{"a":[1]}`)},
	}
	req, b := sentBody(t, "gpt-test", r)
	if req.URL.String() != "http://127.0.0.1:1/v1/chat/completions?api-version=2024-10-21" {
		t.Errorf("URL = %s", req.URL)
	}
	if req.Header.Get("Authorization") != "Bearer sk-test" || req.Header.Get("Accept") != "text/event-stream" {
		t.Errorf("headers: Authorization set %v, Accept %q", req.Header.Get("Authorization") != "", req.Header.Get("Accept"))
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	if err := json.Unmarshal([]byte(`{
		"model":"gpt-test",
		"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}],"name":"ann"}],
		"tools":[{"type":"function","function":{"name":"f"}}],
		"tool_choice":"required",
		"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{}}},
		"stream":true,
		"stream_options":{"include_usage":true},
		"temperature":0.5,"max_tokens":64,"x_vendor":{"a":[1]}
	}`), &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("body = %s", b)
	}

	// Not streaming: no stream members; the caller's stream_options wins
	// when streaming.
	req, b = sentBody(t, "m", Request{Messages: []Message{TextMessage("user", "x")}})
	if req.Header.Get("Accept") != "application/json" {
		t.Errorf("non-streaming Accept %q", req.Header.Get("Accept"))
	}
	if strings.Contains(string(b), "stream") || strings.Contains(string(b), "tools") {
		t.Fatalf("non-streaming body carries stream or empty members: %s", b)
	}
	_, b = sentBody(t, "m", Request{Messages: []Message{TextMessage("user", "x")}, Stream: true,
		Params: map[string]json.RawMessage{"stream_options": json.RawMessage(`{"include_usage":false}`)}})
	if !strings.Contains(string(b), `"stream_options":{"include_usage":false}`) {
		t.Fatalf("caller's stream_options replaced: %s", b)
	}
}

// The official client must send what the envelope says, verbatim: members
// it does not model (a gateway's cache_control, a vendor tool field, a
// role it does not know) survive, and nothing comes from the OPENAI_*
// environment.
func TestRequestBodyVerbatim(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "sk-from-env")
	t.Setenv("OPENAI_BASE_URL", "http://127.0.0.2:9/elsewhere")
	r := Request{
		Messages: []Message{
			{Role: "user", Content: json.RawMessage(`[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]`)},
			{Role: "assistant", ToolCalls: json.RawMessage(`[{"id":"c","type":"function","function":{"name":"w","arguments":"{}"}}]`)},
			{Role: "tool", ToolCallID: "c", Content: json.RawMessage(`"sunny"`)},
			{Role: "critic", Content: json.RawMessage(`"odd role"`)},
		},
		Tools:          []json.RawMessage{json.RawMessage(`{"type":"function","function":{"name":"w","parameters":{"type":"object"}},"x_vendor":2}`), json.RawMessage(`{"type":"custom","custom":{"name":"c"}}`)},
		ToolChoice:     json.RawMessage(`{"type":"function","function":{"name":"w"}}`),
		ResponseFormat: json.RawMessage(`{"type":"json_object"}`),
	}
	var want map[string]any
	if err := json.Unmarshal([]byte(`{
		"model":"m",
		"messages":[
			{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]},
			{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"w","arguments":"{}"}}]},
			{"role":"tool","tool_call_id":"c","content":"sunny"},
			{"role":"critic","content":"odd role"}],
		"tools":[{"type":"function","function":{"name":"w","parameters":{"type":"object"}},"x_vendor":2},{"type":"custom","custom":{"name":"c"}}],
		"tool_choice":{"type":"function","function":{"name":"w"}},
		"response_format":{"type":"json_object"}
	}`), &want); err != nil {
		t.Fatal(err)
	}
	req, b := sentBody(t, "m", r)
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("body = %s", b)
	}
	if req.Header.Get("Authorization") != "Bearer sk-test" || req.URL.Host != "127.0.0.1:1" {
		t.Fatalf("the environment leaked in: host %s, key from env %v", req.URL.Host, req.Header.Get("Authorization") == "Bearer sk-from-env")
	}
}

// Without a key source no Authorization header is sent, and a redirect is
// the answer, never followed: following it would be a second request.
func TestSendNoKeyNoRedirect(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "sk-from-env")
	var sends int
	rt := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		sends++
		if v := req.Header.Get("Authorization"); v != "" {
			t.Errorf("Authorization sent without a key source")
		}
		return &http.Response{StatusCode: http.StatusTemporaryRedirect, Header: http.Header{"Location": {"http://127.0.0.1:2/v1/chat/completions"}}, Body: io.NopCloser(strings.NewReader("moved")), Request: req}, nil
	})
	route := Route{Name: "r", Kind: KindOpenAI, BaseURL: "http://127.0.0.1:1/v1", Model: "m"}
	resp, err := sendChatCompletion(context.Background(), rt, outgoing{route: route, request: Request{Messages: []Message{TextMessage("user", "x")}}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if sends != 1 || resp.StatusCode != http.StatusTemporaryRedirect || string(body) != "moved" {
		t.Fatalf("sends %d, status %d, body %q: want the 307 itself, its body unread by the client", sends, resp.StatusCode, body)
	}
}

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
