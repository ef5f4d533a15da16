package exchange

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
)

// The OpenAI adapter's request encoding, sent through the official client
// to a RoundTripper that records it.

func sentBody(t *testing.T, model string, r providers.Request) (*http.Request, []byte) {
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
	route := routes.Route{Name: "r", Kind: routes.KindOpenAI, BaseURL: "http://127.0.0.1:1/v1?api-version=2024-10-21", Model: model}
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
	r := providers.Request{
		Messages:       []providers.Message{providers.TextMessage("system", "be brief"), {Role: "user", Content: json.RawMessage(`[{"type":"text","text":"hi"}]`), Name: "ann"}},
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
	req, b = sentBody(t, "m", providers.Request{Messages: []providers.Message{providers.TextMessage("user", "x")}})
	if req.Header.Get("Accept") != "application/json" {
		t.Errorf("non-streaming Accept %q", req.Header.Get("Accept"))
	}
	if strings.Contains(string(b), "stream") || strings.Contains(string(b), "tools") {
		t.Fatalf("non-streaming body carries stream or empty members: %s", b)
	}
	_, b = sentBody(t, "m", providers.Request{Messages: []providers.Message{providers.TextMessage("user", "x")}, Stream: true,
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
	r := providers.Request{
		Messages: []providers.Message{
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
	route := routes.Route{Name: "r", Kind: routes.KindOpenAI, BaseURL: "http://127.0.0.1:1/v1", Model: "m"}
	resp, err := sendChatCompletion(context.Background(), rt, outgoing{route: route, request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "x")}}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if sends != 1 || resp.StatusCode != http.StatusTemporaryRedirect || string(body) != "moved" {
		t.Fatalf("sends %d, status %d, body %q: want the 307 itself, its body unread by the client", sends, resp.StatusCode, body)
	}
}

// TestMessagesAreSentAsJSONMarshalWritesThem: each message reaches the
// provider byte for byte as when it was encoded with json.Marshal
// (compacted, <, > and & escaped), whatever white space its content and
// tool calls carry and whichever members it sets.
func TestMessagesAreSentAsJSONMarshalWritesThem(t *testing.T) {
	r := providers.Request{Messages: []providers.Message{
		providers.TextMessage("system", "be <brief> & \"exact\"\n"),
		{Role: "user", Content: json.RawMessage(" [ {\"type\": \"text\",\n \"text\": \"<hi>\"} ] "), Name: "ann & bob"},
		{Role: "assistant", ToolCalls: json.RawMessage(`[ {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": \"<b>\"}"}} ]`)},
		{Role: "tool", Content: json.RawMessage(`"4 > 3"`), ToolCallID: "c1"},
		{Role: "narrator", Content: json.RawMessage(`"\u00e9"`)},
	}}
	_, got := sentBody(t, "m", r)
	var want []json.RawMessage
	for _, m := range r.Messages {
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, b)
	}
	var sent struct {
		Messages []json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(got, &sent); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(sent.Messages, want) {
		t.Errorf("sent messages\n%s\nwant (json.Marshal)\n%s", sent.Messages, want)
	}
}

// TestAMessageWhoseContentIsNotJSONIsNotSent: chatParams refuses it, as
// json.Marshal did.
func TestAMessageWhoseContentIsNotJSONIsNotSent(t *testing.T) {
	for _, m := range []providers.Message{{Role: "user", Content: json.RawMessage(`"open`)}, {Role: "assistant", ToolCalls: json.RawMessage(`[`)}} {
		if _, err := chatParams("m", providers.Request{Messages: []providers.Message{m}}); !errors.Is(err, providers.ErrInvalidRequest) {
			t.Errorf("%+v: err = %v, want ErrInvalidRequest", m, err)
		}
	}
}
