package answertest

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"

	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/gateway/openaiwire"
	"github.com/durallm/durallm/providers"
)

// Stored is a small surface of the stored kind (answer.Stored,
// answer.Continuer) for the tests of the core's stateful ops, in the
// shape of no real API: POST StoredPath with {"model", "input",
// "instructions", "background", "stream", "previous"} starts an action;
// the action is an object {"id", "status", "text"} read, canceled and
// deleted at StoredPath/{id}, whose request's messages are listed at
// StoredPath/{id}/input_items (newest first, order, limit, after). A
// request with "previous" continues that action's conversation without
// its instructions, as OpenAI's previous_response_id does. Problems are
// OpenAI's error object. The zero value is ready; it has no state.
type Stored struct{}

// StoredPath is the path it serves.
const StoredPath = "/v1/test/stored"

// StoredRequest is its request body.
type StoredRequest struct {
	Model        string `json:"model"`
	Input        string `json:"input"`
	Instructions string `json:"instructions,omitempty"`
	Background   bool   `json:"background,omitempty"`
	Stream       bool   `json:"stream,omitempty"`
	Previous     string `json:"previous,omitempty"`
}

// StoredObject is its answer: an action's object.
type StoredObject struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	// Status is completed, incomplete, the action's state while it runs,
	// or the problem's kind it ended with.
	Status string `json:"status"`
	// Code is the problem's code (a cancel's origin).
	Code string `json:"code,omitempty"`
	Text string `json:"text,omitempty"`
	// Deleted is set in the answer to a delete.
	Deleted bool `json:"deleted,omitempty"`
	// Instructions says the request had instructions (what it kept).
	Instructions bool `json:"instructions,omitempty"`
}

// StoredItem is one item of a request, listed.
type StoredItem struct {
	ID   string `json:"id"`
	Role string `json:"role"`
	Text string `json:"text"`
}

// StoredItems is a page of items.
type StoredItems struct {
	Object  string       `json:"object"`
	Data    []StoredItem `json:"data"`
	HasMore bool         `json:"has_more"`
}

// kept is what it keeps of a request.
type kept struct {
	Instructions bool `json:"instructions,omitempty"`
}

func keptOf(who answer.Identity) kept {
	var k kept
	_ = json.Unmarshal(who.Kept, &k)
	return k
}

func (Stored) Name() string { return "test-stored" }

func (Stored) Routes() []answer.Route {
	return []answer.Route{
		{Method: http.MethodPost, Path: StoredPath, Op: answer.Start},
		{Method: http.MethodGet, Path: StoredPath + "/{id}", Op: answer.Read},
		{Method: http.MethodPost, Path: StoredPath + "/{id}/cancel", Op: answer.Cancel},
		{Method: http.MethodDelete, Path: StoredPath + "/{id}", Op: answer.Delete},
		{Method: http.MethodGet, Path: StoredPath + "/{id}/input_items", Op: answer.Items},
	}
}

// StoredRoutes is nil: Routes names them.
func (Stored) StoredRoutes() []answer.Route { return nil }

func (Stored) Credential(r *http.Request) (string, bool) {
	return answer.BearerToken(r.Header.Get("Authorization"))
}

func (Stored) Parse(body []byte) (answer.Request, *answer.Problem) {
	var b StoredRequest
	if err := json.Unmarshal(body, &b); err != nil {
		return answer.Request{}, &answer.Problem{Kind: answer.InvalidRequest, Message: "the body must be a JSON object"}
	}
	if b.Input == "" {
		return answer.Request{}, &answer.Problem{Kind: answer.InvalidRequest, Param: "input", Message: "input is required"}
	}
	var msgs []providers.Message
	if b.Instructions != "" {
		msgs = append(msgs, textMessage("system", b.Instructions))
	}
	msgs = append(msgs, textMessage("user", b.Input))
	keep, _ := json.Marshal(kept{Instructions: b.Instructions != ""})
	req := answer.Request{Model: b.Model, Stream: b.Stream, Request: providers.Request{Messages: msgs},
		State: answer.State{Background: b.Background, Keep: keep}}
	if b.Previous != "" {
		req.Continues = &answer.Continuation{ID: b.Previous, Param: "previous"}
	}
	return req, nil
}

func textMessage(role, text string) providers.Message {
	c, _ := json.Marshal(text)
	return providers.Message{Role: role, Content: c}
}

func textOf(m providers.Message) string {
	var s string
	_ = json.Unmarshal(m.Content, &s)
	return s
}

func object(who answer.Identity, o StoredObject) []byte {
	o.ID, o.Object, o.Instructions = who.ID, "test.stored", keptOf(who).Instructions
	b, _ := json.Marshal(o)
	return b
}

func (Stored) Answer(a answer.Answer) []byte {
	status := "completed"
	if a.Incomplete != "" {
		status = "incomplete"
	}
	return object(a.Identity, StoredObject{Status: status, Text: a.Response.Text})
}

func (Stored) Problem(p answer.Problem) answer.Rendered { return openaiwire.Render(p) }

func (Stored) Stream(who answer.Identity, _ any) answer.Encoder { return &storedEncoder{who: who} }

// Pending is the object with the action's state as its status.
func (Stored) Pending(who answer.Identity, state string) []byte {
	return object(who, StoredObject{Status: state})
}

// Unanswered is the object with the problem's kind as its status.
func (Stored) Unanswered(who answer.Identity, p answer.Problem) []byte {
	return object(who, StoredObject{Status: string(p.Kind), Code: p.Code})
}

func (Stored) Deleted(id string) []byte {
	b, _ := json.Marshal(StoredObject{ID: id, Object: "test.stored", Deleted: true})
	return b
}

// Items lists the request's messages but its instructions, item i's id
// "item_i", newest first unless order=asc; after names an item id;
// limit is 1 to 100, 20 by default.
func (Stored) Items(who answer.Identity, req providers.Request, q url.Values) ([]byte, *answer.Problem) {
	msgs := req.Messages
	if keptOf(who).Instructions && len(msgs) > 0 {
		msgs = msgs[1:]
	}
	items := make([]StoredItem, len(msgs))
	for i, m := range msgs {
		items[i] = StoredItem{ID: "item_" + strconv.Itoa(i), Role: m.Role, Text: textOf(m)}
	}
	switch q.Get("order") {
	case "", "desc":
		for i, j := 0, len(items)-1; i < j; i, j = i+1, j-1 {
			items[i], items[j] = items[j], items[i]
		}
	case "asc":
	default:
		return nil, &answer.Problem{Kind: answer.InvalidRequest, Param: "order", Message: "order is asc or desc"}
	}
	limit := 20
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return nil, &answer.Problem{Kind: answer.InvalidRequest, Param: "limit", Message: "limit is 1 to 100"}
		}
		limit = n
	}
	if after := q.Get("after"); after != "" {
		for i, it := range items {
			if it.ID == after {
				items = items[i+1:]
				break
			}
		}
	}
	page := StoredItems{Object: "list", Data: items[:min(limit, len(items))], HasMore: len(items) > limit}
	b, _ := json.Marshal(page)
	return b, nil
}

// Continue is the earlier conversation without its instructions, its
// answer, then the new request's messages.
func (Stored) Continue(req answer.Request, earlier answer.Earlier) (answer.Request, *answer.Problem) {
	prior := earlier.Request.Messages
	if keptOf(earlier.Identity).Instructions && len(prior) > 0 {
		prior = prior[1:]
	}
	var msgs []providers.Message
	own := req.Request.Messages
	if len(own) > 1 {
		// Its own instructions come first.
		msgs = append(msgs, own[0])
		own = own[1:]
	}
	msgs = append(msgs, prior...)
	msgs = append(msgs, textMessage("assistant", earlier.Answer.Response.Text))
	req.Request.Messages = append(msgs, own...)
	return req, nil
}

// storedEncoder numbers one event per delta from 0, then "done".
type storedEncoder struct {
	who answer.Identity
	seq uint64
}

func (e *storedEncoder) event(name string, v any) answer.Event {
	b, _ := json.Marshal(v)
	ev := answer.Event{Numbered: true, Seq: e.seq, ID: strconv.FormatUint(e.seq, 10), Name: name, Data: b}
	e.seq++
	return ev
}

func (e *storedEncoder) Start() []answer.Event {
	return []answer.Event{e.event("created", map[string]string{"id": e.who.ID})}
}

func (e *storedEncoder) Delta(d answer.Delta) []answer.Event {
	return []answer.Event{e.event("delta", map[string]string{"text": d.Text})}
}

func (e *storedEncoder) End(a answer.Answer) []answer.Event {
	return []answer.Event{e.event("done", map[string]string{"text": a.Response.Text})}
}

func (e *storedEncoder) Fail(p answer.Problem) []answer.Event {
	return []answer.Event{e.event("error", map[string]string{"kind": string(p.Kind), "code": p.Code})}
}

var (
	_ answer.Stored    = Stored{}
	_ answer.Continuer = Stored{}
)
