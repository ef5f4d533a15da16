package messages_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/durallm/durallm/gateway/messages"
	"github.com/durallm/durallm/providers/exchange"
	"github.com/durallm/durallm/providers/routes"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// This package reads a Messages request into the envelope and the
// upstream adapter writes the envelope as a Messages request: through
// both, a request comes out as it went in, but for the model (the
// route's) and what was set aside (Request.Ignored).
func TestAMessagesRequestSurvivesTheAnthropicRoute(t *testing.T) {
	in := `{"model":"claude-primary","max_tokens":300,"stream":true,
		"system":"be brief",
		"messages":[
			{"role":"user","content":[{"type":"text","text":"what is this?"},
				{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},
				{"type":"image","source":{"type":"url","url":"https://example.com/cat.jpg"}}]},
			{"role":"assistant","content":[{"type":"text","text":"A cat. Checking the weather."},
				{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"SF"}},
				{"type":"tool_use","id":"toolu_2","name":"get_weather","input":{"city":"NYC"}}]},
			{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"18C","is_error":true},
				{"type":"tool_result","tool_use_id":"toolu_2","content":[{"type":"text","text":"22C","cache_control":{"type":"ephemeral"}}]}]},
			{"role":"assistant","content":"Anything else?"},
			{"role":"user","content":"no"}],
		"tools":[{"name":"get_weather","description":"Current weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}],
		"tool_choice":{"type":"any","disable_parallel_tool_use":true},
		"stop_sequences":["END"],"temperature":0.5,"top_p":0.9,"top_k":40,"metadata":{"user_id":"u-1"}}`
	req, perr := messages.Surface{}.Parse([]byte(in))
	if perr != nil {
		t.Fatal(perr)
	}
	var sent []byte
	rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent, _ = io.ReadAll(r.Body)
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(`{"type":"message","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn"}`)), Request: r}, nil
	})
	route := routes.Route{Name: "claude", Kind: routes.KindAnthropic, BaseURL: "http://127.0.0.1:1/v1", Model: "claude-sonnet-4-5"}
	if _, err := exchange.CallAnthropic(context.Background(), rt, exchange.Call{Route: route, Request: req.Request}); err != nil {
		t.Fatal(err)
	}
	want := strings.NewReplacer(`"model":"claude-primary"`, `"model":"claude-sonnet-4-5"`, `,"is_error":true`, ``, `,"cache_control":{"type":"ephemeral"}`, ``).Replace(in)
	var got, exp any
	if err := json.Unmarshal(sent, &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(want), &exp); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, exp) {
		t.Fatalf("upstream\n got %s\nwant %s", sent, want)
	}
	if got := req.Header.Get(messages.IgnoredHeader); got != "cache_control, is_error" {
		t.Fatalf("ignored %q", got)
	}
}
