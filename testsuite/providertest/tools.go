package providertest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// ToolCall is one tool call an answer carries.
type ToolCall struct {
	// Name is the function's name.
	Name string
	// Arguments is the call's arguments, a JSON object as text.
	Arguments string
}

// AnswerToolCall executes the request and replies 200 with one call of
// the tool name, with arguments (a JSON object as text) and
// finish_reason "tool_calls", as a model that decided to use a tool does.
// Streamed, the call arrives as OpenAI sends one: a first delta with the
// call's id, type and name, then its arguments.
func AnswerToolCall(name, arguments string) Behavior {
	return Behavior{kind: kindToolCall, name: "AnswerToolCall", executes: true, tool: &ToolCall{Name: name, Arguments: arguments}}
}

// AnswerOrCallTool executes the request. When the request declares tools
// and its last message is not a tool's result, it replies as
// AnswerToolCall with the first declared function, its arguments filled
// in from the function's parameters (each required property, or each
// property when none is required: "demo" for a string, 1 for a number,
// false for a boolean, null otherwise); otherwise as Answer(text). It is
// a model that always uses a tool once, then answers: enough for an
// agent's loop to run against the demo provider.
func AnswerOrCallTool(text string) Behavior {
	return Behavior{kind: kindAnswerOrCallTool, name: "AnswerOrCallTool", executes: true, text: text}
}

// reply is what an answering behaviour replies to req: a text, or a
// tool call (nil for a text).
func (b Behavior) reply(req Request) (text string, call *ToolCall) {
	switch b.kind {
	case kindDefault:
		return defaultAnswer, nil
	case kindToolCall:
		return "", b.tool
	case kindAnswerOrCallTool:
		if c, ok := toolToCall(req.Body); ok {
			return "", c
		}
	}
	return b.text, nil
}

// toolToCall picks the call AnswerOrCallTool makes for a request body.
func toolToCall(body []byte) (*ToolCall, bool) {
	var r struct {
		Messages []struct {
			Role string `json:"role"`
		} `json:"messages"`
		Tools []struct {
			Type     string `json:"type"`
			Function struct {
				Name       string `json:"name"`
				Parameters struct {
					Properties map[string]struct {
						Type any `json:"type"`
					} `json:"properties"`
					Required []string `json:"required"`
				} `json:"parameters"`
			} `json:"function"`
		} `json:"tools"`
	}
	if json.Unmarshal(body, &r) != nil || len(r.Messages) == 0 || r.Messages[len(r.Messages)-1].Role == "tool" {
		return nil, false
	}
	for _, t := range r.Tools {
		if t.Type != "function" || t.Function.Name == "" {
			continue
		}
		params := t.Function.Parameters
		names := params.Required
		if len(names) == 0 {
			for n := range params.Properties {
				names = append(names, n)
			}
		}
		args := map[string]any{}
		for _, n := range names {
			typ, _ := params.Properties[n].Type.(string)
			switch typ {
			case "string":
				args[n] = "demo"
			case "integer", "number":
				args[n] = 1
			case "boolean":
				args[n] = false
			default:
				args[n] = nil
			}
		}
		// json.Marshal writes map keys sorted: the same bytes every time.
		return &ToolCall{Name: t.Function.Name, Arguments: string(mustJSON(args))}, true
	}
	return nil, false
}

type toolCallJSON struct {
	Index    *int             `json:"index,omitempty"`
	ID       string           `json:"id,omitempty"`
	Type     string           `json:"type,omitempty"`
	Function toolFunctionJSON `json:"function"`
}

type toolFunctionJSON struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

func (p *Provider) nextCallID() string {
	return fmt.Sprintf("call_durallm_%d", p.callSeq.Add(1))
}

// toolCompletionJSON renders a chat.completion whose choice is call.
func (p *Provider) toolCompletionJSON(req Request, call *ToolCall) []byte {
	reason := "tool_calls"
	return mustJSON(chatCompletion{
		ID: p.idFor(req), Object: "chat.completion", Created: time.Now().Unix(), Model: p.model,
		Choices: []choice{{Index: 0, FinishReason: &reason, Message: &message{Role: "assistant", ToolCalls: []toolCallJSON{{
			ID: p.callIDFor(req), Type: "function", Function: toolFunctionJSON{Name: call.Name, Arguments: call.Arguments},
		}}}}},
		Usage: usageFor(req, call.Arguments),
	})
}

// toolEvents renders call as a stream's events: the call's id, type and
// name, then its arguments, then the finish reason with usage, then
// [DONE].
func (p *Provider) toolEvents(req Request, call *ToolCall) [][]byte {
	id, created, zero := p.idFor(req), time.Now().Unix(), 0
	chunk := func(msg *message, reason *string) []byte {
		cc := chatCompletion{ID: id, Object: "chat.completion.chunk", Created: created, Model: p.model, Choices: []choice{{Index: 0, Delta: msg, FinishReason: reason}}}
		if reason != nil {
			cc.Usage = usageFor(req, call.Arguments)
		}
		return sseEvent(mustJSON(cc))
	}
	reason := "tool_calls"
	return [][]byte{
		chunk(&message{Role: "assistant", ToolCalls: []toolCallJSON{{Index: &zero, ID: p.callIDFor(req), Type: "function", Function: toolFunctionJSON{Name: call.Name}}}}, nil),
		chunk(&message{ToolCalls: []toolCallJSON{{Index: &zero, Function: toolFunctionJSON{Arguments: call.Arguments}}}}, nil),
		append(chunk(&message{}, &reason), "data: [DONE]\n\n"...),
	}
}

// answerTool runs a tool-call reply over HTTP/2.
func (c *conn) answerTool(st *stream, req Request, call *ToolCall) {
	if !req.Stream {
		body := c.p.toolCompletionJSON(req, call)
		_ = c.respond(st, http.StatusOK, jsonFields(len(body)), body)
		return
	}
	if c.writeHeaders(st, sseFields(), false) != nil {
		return
	}
	events := c.p.toolEvents(req, call)
	for i, ev := range events {
		if c.writeData(st, ev, i == len(events)-1) != nil {
			return
		}
	}
}

// answerTool runs a tool-call reply over HTTP/1.1 and reports whether the
// connection may carry another request.
func (c *h1conn) answerTool(req Request, call *ToolCall) bool {
	if !req.Stream {
		return c.respond(http.StatusOK, nil, c.p.toolCompletionJSON(req, call), false) == nil
	}
	if c.head(http.StatusOK, sseHeader(), -1, false) != nil {
		return false
	}
	for _, ev := range c.p.toolEvents(req, call) {
		if c.chunk(ev) != nil {
			return false
		}
	}
	_, _ = c.bw.WriteString("0\r\n\r\n")
	return c.bw.Flush() == nil
}
