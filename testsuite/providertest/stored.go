package providertest

import (
	"encoding/json"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// StoredCompletion is a completion the provider keeps for a request that
// asked for it ("store": true), as OpenAI's stored chat completions are:
// listed by GET .../chat/completions?metadata[KEY]=VALUE.
type StoredCompletion struct {
	// ID is the completion's id, the one its answer carried.
	ID string
	// AttemptID is the request's x-durallm-attempt header.
	AttemptID string
	// Metadata is the request's "metadata" member (string values only).
	Metadata map[string]string
	// Kept is when the provider kept it: when it started executing the
	// request. It is listed from Kept plus the store lag on.
	Kept time.Time
	// Body is the chat.completion object the list returns for it.
	Body json.RawMessage
}

// defaultListLimit and maxListLimit are OpenAI's for the list.
const (
	defaultListLimit = 20
	maxListLimit     = 100
)

// SetStoreLag makes a stored completion listable only d after it was
// kept, as an eventually consistent store is. Default 0: at once. It
// applies to every listing from the call on, completions already kept
// included.
func (p *Provider) SetStoreLag(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.storeLag = d
}

// Stored returns a copy of every completion the provider keeps, in the
// order it kept them, whether or not the store lag has passed.
func (p *Provider) Stored() []StoredCompletion {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]StoredCompletion, len(p.stored))
	for i, s := range p.stored {
		out[i] = s
		out[i].Metadata = maps.Clone(s.Metadata)
	}
	return out
}

// DropStored forgets every stored completion whose metadata holds key
// with value, as a provider that lost or never wrote the record, and
// returns how many it dropped.
func (p *Provider) DropStored(key, value string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	kept := p.stored[:0]
	for _, s := range p.stored {
		if v, ok := s.Metadata[key]; !ok || v != value {
			kept = append(kept, s)
		}
	}
	n := len(p.stored) - len(kept)
	clear(p.stored[len(kept):])
	p.stored = kept
	return n
}

// Unstored returns a copy of b whose execution leaves no stored
// completion even when the request asks for one: a generation the
// provider cut off, or a store that failed. Default: an answering
// behaviour keeps one for a request that asks.
func (b Behavior) Unstored() Behavior {
	b.unstored = true
	return b
}

// ListStored answers the request with the stored completions its query
// selects, as GET /v1/chat/completions does: every metadata[KEY]=VALUE
// pair must match, limit (default 20, at most 100), order (asc, the
// default, or desc, by when they were kept) and after (a completion id)
// page through them. It does not execute anything and is not recorded in
// [Provider.Processed]. The provider gives it to every GET of a path
// ending in /chat/completions that the script does not claim (the queue
// and the default are never used for one); a script may return it, say
// with [Behavior.After], to make a lookup slow.
func ListStored() Behavior {
	return Behavior{kind: kindListStored, name: "ListStored"}
}

// isStoredList reports whether req asks for the list of stored
// completions.
func isStoredList(req Request) bool {
	path, _, _ := strings.Cut(req.Path, "?")
	return req.Method == http.MethodGet && strings.HasSuffix(strings.TrimSuffix(path, "/"), "/chat/completions")
}

// keep stores the completion an answering behaviour executes for a
// request whose body asks for it, with the ids its answer will carry
// (set on req, so the answer and the record agree). It runs when the
// execution starts: the record is of what the provider generates,
// whether or not the client stays to read it.
func (p *Provider) keep(req *Request, b Behavior) {
	if b.unstored || !b.executed() {
		return
	}
	switch b.kind {
	case kindDefault, kindAnswer, kindToolCall, kindAnswerOrCallTool:
	default:
		// Faults, stalls and cuts generate no whole completion.
		return
	}
	if !req.store {
		return
	}
	meta := map[string]string{}
	var raw map[string]any
	if json.Unmarshal(req.metadata, &raw) == nil {
		for k, v := range raw {
			if s, ok := v.(string); ok {
				meta[k] = s
			}
		}
	}
	req.respID, req.callID = p.nextID(), p.nextCallID()
	text, call := b.reply(*req)
	var body []byte
	if call != nil {
		body = p.toolCompletionJSON(*req, call)
	} else {
		body = p.completionJSON(*req, &text)
	}
	// The stored object carries its metadata, as OpenAI's does.
	var obj map[string]any
	_ = json.Unmarshal(body, &obj)
	obj["metadata"] = meta
	s := StoredCompletion{ID: req.respID, AttemptID: req.AttemptID, Metadata: meta, Kept: time.Now(), Body: mustJSON(obj)}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stored = append(p.stored, s)
}

// storedList renders the list a ListStored request selects.
func (p *Provider) storedList(req Request) []byte {
	q := url.Values{}
	if _, query, ok := strings.Cut(req.Path, "?"); ok {
		q, _ = url.ParseQuery(query)
	}
	want := map[string]string{}
	for k, vs := range q {
		if key, ok := strings.CutPrefix(k, "metadata["); ok && strings.HasSuffix(key, "]") && len(vs) > 0 {
			want[strings.TrimSuffix(key, "]")] = vs[0]
		}
	}
	limit := defaultListLimit
	if n, err := strconv.Atoi(q.Get("limit")); err == nil && n > 0 {
		limit = min(n, maxListLimit)
	}
	p.mu.Lock()
	visible := time.Now().Add(-p.storeLag)
	var match []StoredCompletion
	for _, s := range p.stored {
		if s.Kept.After(visible) || !hasAll(s.Metadata, want) {
			continue
		}
		match = append(match, s)
	}
	p.mu.Unlock()
	if q.Get("order") == "desc" {
		for i, j := 0, len(match)-1; i < j; i, j = i+1, j-1 {
			match[i], match[j] = match[j], match[i]
		}
	}
	if after := q.Get("after"); after != "" {
		for i, s := range match {
			if s.ID == after {
				match = match[i+1:]
				break
			}
		}
	}
	more := len(match) > limit
	if more {
		match = match[:limit]
	}
	list := struct {
		Object  string            `json:"object"`
		Data    []json.RawMessage `json:"data"`
		FirstID *string           `json:"first_id"`
		LastID  *string           `json:"last_id"`
		HasMore bool              `json:"has_more"`
	}{Object: "list", Data: []json.RawMessage{}, HasMore: more}
	for _, s := range match {
		list.Data = append(list.Data, s.Body)
	}
	if len(match) > 0 {
		list.FirstID, list.LastID = &match[0].ID, &match[len(match)-1].ID
	}
	return mustJSON(list)
}

func hasAll(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// idFor is the id of the answer to req: the one its stored completion
// has, or a fresh one.
func (p *Provider) idFor(req Request) string {
	if req.respID != "" {
		return req.respID
	}
	return p.nextID()
}

// callIDFor is the id of the tool call answering req, likewise.
func (p *Provider) callIDFor(req Request) string {
	if req.callID != "" {
		return req.callID
	}
	return p.nextCallID()
}
