package providertest_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/exchange"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/testsuite/providertest"
)

// call sends req to base through the recovery engine and the OpenAI
// adapter, as the CallModel activity does.
func call(t *testing.T, p *providertest.Provider, base string, req providers.Request) (providers.Response, evidence.Classification) {
	t.Helper()
	e := recovery.New(recovery.Config{TLSClientConfig: p.ClientTLSConfig(), Logger: slog.New(slog.DiscardHandler)})
	defer e.Close()
	route := routes.Route{Name: "r", Kind: routes.KindOpenAI, BaseURL: base + "/v1", Model: "m"}
	att := recovery.NewAttempt(recovery.Spec{ActionRef: t.Name(), Attempt: 1, Route: "r", ManualCommit: true, DeferEvent: true})
	res, err := exchange.CallRoute(recovery.WithAttempt(context.Background(), att), e, exchange.Call{Route: route, Request: req})
	if err != nil {
		t.Fatalf("call: %v", err)
	}
	_, class := att.FinishWith(evidence.Facts{Signal: res.Signal})
	return res.Response, class
}

var weather = json.RawMessage(`{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"},"metric":{"type":"boolean"}},"required":["city","days"]}}}`)

// toolCall is one of a response's tool_calls, in OpenAI's shape.
type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

func toolCalls(t *testing.T, r providers.Response) []toolCall {
	t.Helper()
	var calls []toolCall
	if err := json.Unmarshal(r.ToolCalls, &calls); err != nil {
		t.Fatalf("tool_calls %s: %v", r.ToolCalls, err)
	}
	return calls
}

// A tool call reaches the client as the OpenAI adapter reads one, over
// every listener, streamed or not.
func TestAnswerToolCallOverEveryListener(t *testing.T) {
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, base := range []struct{ name, url string }{{"h2 tls", p.URL()}, {"http/1.1", p.HTTP1URL()}, {"http/1.1 tls", p.HTTP1TLSURL()}} {
		for _, stream := range []bool{false, true} {
			p.Push(providertest.AnswerToolCall("get_weather", `{"city":"Oslo"}`))
			req := providers.Request{Messages: []providers.Message{providers.TextMessage("user", "weather?")}, Tools: []json.RawMessage{weather}, Stream: stream}
			resp, class := call(t, p, base.url, req)
			calls := toolCalls(t, resp)
			if class.Class != evidence.Completed || resp.FinishReason != "tool_calls" || len(calls) != 1 || calls[0].Function.Name != "get_weather" ||
				calls[0].Function.Arguments != `{"city":"Oslo"}` || calls[0].ID == "" || calls[0].Type != "function" {
				t.Fatalf("%s stream=%v: %s, %+v, calls %+v", base.name, stream, class.Class, resp, calls)
			}
		}
	}
}

// AnswerOrCallTool calls the first declared function, with its required
// arguments filled in, then answers once the tool's result is in.
func TestAnswerOrCallToolCallsOnceThenAnswers(t *testing.T) {
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.SetDefault(providertest.AnswerOrCallTool("It is sunny in demo."))
	msgs := []providers.Message{providers.TextMessage("user", "weather?")}
	resp, _ := call(t, p, p.URL(), providers.Request{Messages: msgs, Tools: []json.RawMessage{weather}})
	calls := toolCalls(t, resp)
	if len(calls) != 1 || calls[0].Function.Name != "get_weather" || calls[0].Function.Arguments != `{"city":"demo","days":1}` {
		t.Fatalf("first answer %+v", resp)
	}
	msgs = append(msgs, providers.Message{Role: "assistant", ToolCalls: resp.ToolCalls},
		providers.Message{Role: "tool", ToolCallID: calls[0].ID, Content: json.RawMessage(`"sunny"`)})
	resp, _ = call(t, p, p.URL(), providers.Request{Messages: msgs, Tools: []json.RawMessage{weather}})
	if resp.Text != "It is sunny in demo." || len(resp.ToolCalls) != 0 || resp.FinishReason != "stop" {
		t.Fatalf("second answer %+v", resp)
	}
	// Without tools it is Answer.
	resp, _ = call(t, p, p.URL(), providers.Request{Messages: msgs[:1]})
	if resp.Text != "It is sunny in demo." {
		t.Fatalf("answer without tools %+v", resp)
	}
	if n := len(p.Processed()); n != 3 {
		t.Fatalf("executed %d", n)
	}
}
