package responses

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/gateway/openaiwire"
	"github.com/durallm/durallm/providers"
)

// The Responses surface's part in the core's stored ops (answer.Stored,
// answer.Continuer, answer.StateParser): background: true answered at
// once, previous_response_id continued from the earlier action's request
// and answer as Temporal and the result store keep them, a response read
// whatever its status, POST /v1/responses/{id}/cancel, DELETE
// /v1/responses/{id} and GET /v1/responses/{id}/input_items. The core
// decides; this file only reads the members and writes the shapes.

// statusQueued and statusCancelled are the statuses of a response that
// waits for a worker, and of one canceled.
const (
	statusQueued    = "queued"
	statusCancelled = "cancelled"
)

// kept is what the surface keeps of a request beside its action
// (answer.State.Keep).
type kept struct {
	// Instructions: the request's first message is its instructions,
	// which a continuation does not carry (as OpenAI's
	// previous_response_id does not) and input_items does not list.
	Instructions bool `json:"instructions,omitempty"`
}

func keptOf(b []byte) kept {
	var k kept
	_ = json.Unmarshal(b, &k) // nil or another surface's: nothing kept
	return k
}

// StoredRoutes: POST /v1/responses/{id}/cancel, DELETE
// /v1/responses/{id} and GET /v1/responses/{id}/input_items.
func (Surface) StoredRoutes() []answer.Route {
	return []answer.Route{
		{Method: http.MethodPost, Path: Path + "/{id}/cancel", Op: answer.Cancel},
		{Method: http.MethodDelete, Path: Path + "/{id}", Op: answer.Delete},
		{Method: http.MethodGet, Path: Path + "/{id}/input_items", Op: answer.Items},
	}
}

// stateMembers are the members ParseState takes out of the body.
var stateMembers = []string{"background", "previous_response_id"}

// ParseState reads background and previous_response_id, which Parse
// leaves to it, and whether the request has instructions.
func (Surface) ParseState(body []byte) ([]byte, answer.State, *answer.Problem) {
	var st answer.State
	top, ok := members(bytes.TrimSpace(body))
	if !ok {
		return body, st, nil // Parse says what is wrong with it
	}
	if s, ok := text(top["instructions"]); ok && s != "" {
		st.Keep, _ = json.Marshal(kept{Instructions: true})
	}
	taken := false
	if raw, has := top["background"]; has {
		if json.Unmarshal(raw, &st.Background) != nil {
			return nil, st, problem("background", "background must be true or false")
		}
		taken = true
	}
	if raw, has := top["previous_response_id"]; has {
		taken = true
		if string(bytes.TrimSpace(raw)) != "null" {
			id, ok := text(raw)
			if !ok || id == "" {
				return nil, st, problem("previous_response_id", "previous_response_id must be the id of one of your responses")
			}
			st.Continues = &answer.Continuation{ID: id, Param: "previous_response_id"}
		}
	}
	if !taken {
		return body, st, nil
	}
	for _, k := range stateMembers {
		delete(top, k)
	}
	rest, err := json.Marshal(top)
	if err != nil {
		return nil, st, problem("", "the request body must be a JSON object")
	}
	return rest, st, nil
}

// object is the response object of who with status and error, no output.
func object(who answer.Identity, status string, err *wireError) []byte {
	b, _ := json.Marshal(newEncoder(who, true).response(status, err)) // only marshallable values
	return append(b, '\n')
}

// Pending is the response of a running action: queued until a worker
// takes it, in_progress after.
func (Surface) Pending(who answer.Identity, state string) []byte {
	status := statusInProgress
	if state == statusQueued {
		status = statusQueued
	}
	return object(who, status, nil)
}

// Unanswered is the response of an action that ended without an answer:
// cancelled, or failed with the error a stream's response.failed carries.
func (Surface) Unanswered(who answer.Identity, p answer.Problem) []byte {
	if p.Kind == answer.Canceled {
		return object(who, statusCancelled, nil)
	}
	o := openaiwire.ErrorObject(p)
	code := o.Code
	if code == "" {
		code = o.Type
	}
	return object(who, statusFailed, &wireError{Code: code, Message: o.Message})
}

// Deleted is OpenAI's answer to a delete.
func (Surface) Deleted(id string) []byte {
	b, _ := json.Marshal(struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Deleted bool   `json:"deleted"`
	}{id, "response", true})
	return append(b, '\n')
}

// Continue composes the request that continues earlier: the new
// request's instructions, earlier's conversation without its
// instructions, earlier's answer (its text or refusal, and its function
// calls), then the new input.
func (Surface) Continue(req answer.Request, earlier answer.Earlier) (answer.Request, *answer.Problem) {
	prior := earlier.Request.Messages
	if keptOf(earlier.Kept).Instructions && len(prior) > 0 {
		prior = prior[1:]
	}
	own := req.Request.Messages
	var msgs []providers.Message
	if keptOf(req.Keep).Instructions && len(own) > 0 {
		msgs = append(msgs, own[0])
		own = own[1:]
	}
	msgs = append(msgs, prior...)
	msgs = append(msgs, answerMessage(earlier.Answer.Response))
	req.Request.Messages = append(msgs, own...)
	if err := req.Request.Validate(); err != nil {
		return req, problem("previous_response_id", "the conversation it continues cannot be sent: "+err.Error())
	}
	return req, nil
}

// answerMessage is an answer as the assistant message of a conversation.
func answerMessage(r *providers.Response) providers.Message {
	if r == nil {
		r = &providers.Response{}
	}
	content := r.Text
	if content == "" {
		content = r.Refusal
	}
	m := providers.Message{Role: "assistant", ToolCalls: r.ToolCalls}
	if content != "" || len(r.ToolCalls) == 0 {
		m = providers.TextMessage("assistant", content)
		m.ToolCalls = r.ToolCalls
	}
	return m
}

// The input items' wire shapes.
type (
	wireItemList struct {
		Object  string  `json:"object"`
		Data    []any   `json:"data"`
		FirstID *string `json:"first_id"`
		LastID  *string `json:"last_id"`
		HasMore bool    `json:"has_more"`
	}
	wireInputMessage struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Status  string `json:"status"`
		Role    string `json:"role"`
		Content []any  `json:"content"`
	}
	wireInputText struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	wireInputImage struct {
		Type     string `json:"type"`
		ImageURL string `json:"image_url,omitempty"`
		Detail   string `json:"detail"`
	}
	wireCallOutput struct {
		ID     string `json:"id"`
		Type   string `json:"type"`
		Status string `json:"status"`
		CallID string `json:"call_id"`
		Output string `json:"output"`
	}
)

// listed is one input item and its id.
type listed struct {
	id   string
	item any
}

// Items lists the request's items but its instructions, as input_items
// does: newest first unless order=asc; after an item id; limit 1 to 100,
// 20 by default.
func (Surface) Items(who answer.Identity, req providers.Request, q url.Values) ([]byte, *answer.Problem) {
	msgs := req.Messages
	if keptOf(who.Kept).Instructions && len(msgs) > 0 {
		msgs = msgs[1:]
	}
	items := inputItems(msgs)
	switch q.Get("order") {
	case "", "desc":
		for i, j := 0, len(items)-1; i < j; i, j = i+1, j-1 {
			items[i], items[j] = items[j], items[i]
		}
	case "asc":
	default:
		return nil, problem("order", "order must be asc or desc")
	}
	limit := 20
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return nil, problem("limit", "limit must be 1 to 100")
		}
		limit = n
	}
	if after := q.Get("after"); after != "" {
		found := false
		for i, it := range items {
			if it.id == after {
				items, found = items[i+1:], true
				break
			}
		}
		if !found {
			return nil, problem("after", "after names no item of this response")
		}
	}
	page := wireItemList{Object: "list", Data: []any{}, HasMore: len(items) > limit}
	items = items[:min(limit, len(items))]
	for _, it := range items {
		page.Data = append(page.Data, it.item)
	}
	if len(items) > 0 {
		first, last := items[0].id, items[len(items)-1].id
		page.FirstID, page.LastID = &first, &last
	}
	b, _ := json.Marshal(page) // only marshallable values
	return append(b, '\n'), nil
}

// inputItems are chat messages as Responses items, oldest first, each
// with an id that is its place in the conversation: a message item, an
// assistant's text and then a function_call item per tool call, a tool
// message as function_call_output.
func inputItems(msgs []providers.Message) []listed {
	var out []listed
	add := func(prefix string, item func(id string) any) {
		id := prefix + "_" + strconv.Itoa(len(out))
		out = append(out, listed{id: id, item: item(id)})
	}
	for _, m := range msgs {
		switch m.Role {
		case "tool":
			add("fco", func(id string) any {
				return wireCallOutput{ID: id, Type: "function_call_output", Status: statusCompleted, CallID: m.ToolCallID, Output: contentText(m.Content)}
			})
		case "assistant":
			if s := contentText(m.Content); s != "" || len(m.ToolCalls) == 0 {
				add("msg", func(id string) any {
					return wireMessage{ID: id, Type: "message", Status: statusCompleted, Content: []any{newText(s)}, Role: "assistant"}
				})
			}
			var calls []struct {
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			}
			_ = json.Unmarshal(m.ToolCalls, &calls) // the envelope checked them
			for _, c := range calls {
				add("fc", func(id string) any {
					return wireCall{ID: id, Type: "function_call", Status: statusCompleted, Arguments: c.Function.Arguments, CallID: c.ID, Name: c.Function.Name}
				})
			}
		default:
			add("msg", func(id string) any {
				return wireInputMessage{ID: id, Type: "message", Status: statusCompleted, Role: m.Role, Content: inputParts(m.Content)}
			})
		}
	}
	return out
}

// contentText is a message's content as text: a string, or its text
// parts joined.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &parts)
	var b bytes.Buffer
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

// inputParts are a message's content as Responses input parts.
func inputParts(raw json.RawMessage) []any {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []any{wireInputText{Type: "input_text", Text: s}}
	}
	var parts []struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		ImageURL struct {
			URL    string `json:"url"`
			Detail string `json:"detail"`
		} `json:"image_url"`
	}
	_ = json.Unmarshal(raw, &parts)
	out := []any{}
	for _, p := range parts {
		switch p.Type {
		case "image_url":
			d := p.ImageURL.Detail
			if d == "" {
				d = "auto"
			}
			out = append(out, wireInputImage{Type: "input_image", ImageURL: p.ImageURL.URL, Detail: d})
		default:
			out = append(out, wireInputText{Type: "input_text", Text: p.Text})
		}
	}
	return out
}

var (
	_ answer.Stored      = Surface{}
	_ answer.Continuer   = Surface{}
	_ answer.StateParser = Surface{}
)
