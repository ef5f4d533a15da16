package gateway

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/workflows"
)

// owned finds the action the call names, if the caller may see it: its
// own (the memo's caller), or any for an operator. Another caller's
// action, or one that does not exist, is a NotFound alike.
func (g *Gateway) owned(w http.ResponseWriter, r *http.Request, c *call) (durallm.Description, gatewayMemo, bool) {
	d, err := g.c.Describe(r.Context(), c.id)
	if err != nil {
		if errors.Is(err, durallm.ErrNotFound) {
			writeProblem(w, c.surface, noSuchAction())
		} else {
			g.temporalFailed(w, c, err)
		}
		return d, gatewayMemo{}, false
	}
	var m gatewayMemo
	ok, err := d.Memo(memoKey, &m)
	if err != nil || (!c.caller.Operator() && (!ok || m.Caller != c.caller.ID)) {
		writeProblem(w, c.surface, noSuchAction())
		return d, m, false
	}
	if !d.Running {
		// A deleted action is gone at once, whether or not Temporal has
		// removed it yet.
		deleted, err := g.c.Deleted(r.Context(), c.id, d.RunID)
		if err != nil {
			g.temporalFailed(w, c, err)
			return d, m, false
		}
		if deleted {
			writeProblem(w, c.surface, noSuchAction())
			return d, m, false
		}
	}
	if !ok {
		// Not started by a gateway: render with what Temporal knows.
		m = gatewayMemo{Created: d.StartTime.Unix()}
	}
	if m.Surface != "" && m.Surface != c.surface.Name() && len(m.Kept) > 0 {
		// What another surface kept is not this one's to read.
		m.Kept = nil
	}
	c.ri.actionID = c.id
	return d, m, true
}

func (g *Gateway) temporalFailed(w http.ResponseWriter, c *call, err error) {
	if unavailable(err) {
		writeProblem(w, c.surface, &answer.Problem{Kind: answer.UnavailableNothingStarted, Message: "Temporal is not reachable"})
		return
	}
	g.log.Error("gateway: reading an action failed", "action_id", c.id, "error", err)
	writeProblem(w, c.surface, &answer.Problem{Kind: answer.Internal, Message: "the action could not be read"})
}

// readQuery reads a read's query: ?stream=true, and starting_after=N
// (resume says it was given). A body {"stream": true} also asks for the
// stream: openai-go's Responses.GetStreaming sends it so, on a GET, with
// the cursor in the query.
func readQuery(r *http.Request) (stream, resume bool, after uint64, p *answer.Problem) {
	q := r.URL.Query()
	stream = q.Get("stream") == "true" || streamInBody(r)
	if q.Has("starting_after") {
		n, err := strconv.ParseUint(q.Get("starting_after"), 10, 64)
		if err != nil {
			return false, false, 0, badRequest("starting_after", "starting_after must be a sequence number, 0 or more")
		}
		resume, after = true, n
	}
	return stream, resume, after, nil
}

// streamInBody reports a read whose body is a JSON object with stream:
// true; any other body (none, or more than a small object) asks for
// nothing.
func streamInBody(r *http.Request) bool {
	if r.Body == nil || r.ContentLength == 0 {
		return false
	}
	var b struct {
		Stream bool `json:"stream"`
	}
	return json.NewDecoder(io.LimitReader(r.Body, 1<<10)).Decode(&b) == nil && b.Stream
}

// read answers a surface's Read request: the action's answer once it
// ended (an InProgress problem while it runs); with ?stream=true, its
// stream.
func (g *Gateway) read(w http.ResponseWriter, r *http.Request, c *call) {
	g.reading(w, r, c, func(d durallm.Description, who answer.Identity) {
		if st, ok := c.surface.(answer.Stored); ok {
			g.readStored(w, r, c, st, d, who)
			return
		}
		if d.Running {
			writeProblem(w, c.surface, &answer.Problem{Kind: answer.InProgress,
				Message: "the action is still running: read it again later, or with ?stream=true"})
			return
		}
		if res, ok := g.ended(w, r, c, d); ok {
			g.answerJSON(w, &session{who: who, surface: c.surface}, waitDone{res: res})
		}
	})
}

// reading serves a read of the action the call names: its query, the
// action (if the caller may see it), then its stream when ?stream=true
// asks, else what view writes.
func (g *Gateway) reading(w http.ResponseWriter, r *http.Request, c *call, view func(d durallm.Description, who answer.Identity)) {
	stream, resume, after, p := readQuery(r)
	if p != nil {
		writeProblem(w, c.surface, p)
		return
	}
	d, m, ok := g.owned(w, r, c)
	if !ok {
		return
	}
	if stream {
		g.readStream(w, r, c, d, m, resume, after)
		return
	}
	actionHeaders(w.Header(), c.id)
	view(d, m.identity(c.id))
}

// ended reads the result of the ended action d describes.
func (g *Gateway) ended(w http.ResponseWriter, r *http.Request, c *call, d durallm.Description) (workflows.ActionResult, bool) {
	act := g.c.Get(c.id)
	act.RunID = d.RunID
	res, err := act.Result(r.Context())
	var ae *durallm.ActionError
	switch {
	case errors.As(err, &ae):
		res = ae.Result
	case err != nil:
		g.temporalFailed(w, c, err)
		return res, false
	}
	return res, true
}

// readStream serves the action's stream to a reader that does not own
// it: its leaving cancels nothing. It holds one of the caller's
// max_in_flight places while it reads.
func (g *Gateway) readStream(w http.ResponseWriter, r *http.Request, c *call, d durallm.Description, m gatewayMemo, resume bool, after uint64) {
	release, ok := g.acquire(c.caller)
	if !ok {
		writeProblem(w, c.surface, callerLimit(c.caller, "nothing was read"))
		return
	}
	defer release()
	actionHeaders(w.Header(), c.id)
	act := g.c.Get(c.id)
	act.RunID = d.RunID
	who := m.identity(c.id)
	s := &session{act: act, who: who, surface: c.surface, replayed: !d.Running, onDisconnect: OnDisconnectContinue, gone: true}
	g.serveStream(w, r, s, streamOptions{encoder: c.surface.Stream(who, nil), resume: resume, after: after})
}

// actionView is GET /v1/actions/{id}'s answer.
type actionView struct {
	ID              string                    `json:"id"`
	Object          string                    `json:"object"`
	Created         int64                     `json:"created"`
	Model           string                    `json:"model,omitempty"`
	State           workflows.State           `json:"state"`
	Outcome         string                    `json:"outcome,omitempty"`
	Reason          string                    `json:"reason,omitempty"`
	Origin          workflows.CancelOrigin    `json:"origin,omitempty"`
	AwaitingAttempt int                       `json:"awaiting_attempt,omitempty"`
	Budget          int                       `json:"budget"`
	Used            int                       `json:"used"`
	Attempts        []workflows.AttemptRecord `json:"attempts"`
	Notes           []workflows.Note          `json:"notes,omitempty"`
	// Completion is the answer as a chat.completion, once there is one.
	Completion json.RawMessage `json:"completion,omitempty"`
	// Error is the answer a request would have got, for an action that
	// ended without one.
	Error json.RawMessage `json:"error,omitempty"`
}

// getAction answers GET /v1/actions/{id}: the action's state, attempts
// and answer; with ?stream=true its stream (after starting_after=N, then
// live).
func (g *Gateway) getAction(w http.ResponseWriter, r *http.Request, c *call) {
	g.reading(w, r, c, func(d durallm.Description, who answer.Identity) {
		var v actionView
		if d.Running {
			st, err := g.c.Status(r.Context(), c.id)
			if err != nil {
				g.temporalFailed(w, c, err)
				return
			}
			v = g.viewOf(who, workflows.ActionResult{Status: st})
		} else {
			res, ok := g.ended(w, r, c, d)
			if !ok {
				return
			}
			v = g.viewOf(who, res)
		}
		w.Header().Set("X-Durallm-State", string(v.State))
		writeJSON(w, http.StatusOK, v)
	})
}

func (g *Gateway) viewOf(who answer.Identity, res workflows.ActionResult) actionView {
	v := actionView{
		ID: who.ID, Object: "durallm.action", Created: who.Created, Model: who.Model,
		State: res.State, Outcome: res.Outcome, Reason: res.Reason, Origin: res.Origin,
		AwaitingAttempt: res.AwaitingAttempt, Budget: res.Budget, Used: res.Used,
		Attempts: res.Attempts, Notes: res.Notes,
	}
	if v.Attempts == nil {
		v.Attempts = []workflows.AttemptRecord{}
	}
	if !res.State.Terminal() && res.State != workflows.StateAwaitingReconciliation {
		return v
	}
	o := outcomeOf(res)
	switch {
	case o.OK:
		v.Completion = g.chat.Answer(answerOf(who, res, o))
	case o.Problem != nil:
		var e struct {
			Error json.RawMessage `json:"error"`
		}
		if json.Unmarshal(g.chat.Problem(*o.Problem).Body, &e) == nil {
			v.Error = e.Error
		}
	}
	return v
}

// cancel answers POST /v1/actions/{id}/cancel: user_stop, or
// operator_stop for an operator.
func (g *Gateway) cancel(w http.ResponseWriter, r *http.Request, c *call) {
	id := c.id
	if _, _, ok := g.owned(w, r, c); !ok {
		return
	}
	origin := workflows.OriginUserStop
	if c.caller.Operator() {
		origin = workflows.OriginOperatorStop
	}
	if err := g.c.Cancel(r.Context(), id, origin, "canceled through the gateway by "+c.caller.ID); err != nil {
		if errors.Is(err, durallm.ErrNotFound) {
			// The action closed: nothing to cancel.
			writeProblem(w, c.surface, &answer.Problem{Kind: answer.Conflict, Code: "action_ended", Message: "the action already ended"})
			return
		}
		g.temporalFailed(w, c, err)
		return
	}
	actionHeaders(w.Header(), id)
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "durallm.action.cancel", "origin": origin})
}

// reconcileBody is POST /v1/actions/{id}/reconcile's body.
type reconcileBody struct {
	// Attempt is the awaiting attempt's number; 0 means the one the
	// action awaits a verdict on.
	Attempt int             `json:"attempt"`
	Verdict attempt.Verdict `json:"verdict"`
	// Text is the answer of a completed verdict, shorthand for a
	// response with only that text.
	Text      string              `json:"text"`
	Response  *providers.Response `json:"response"`
	ResultRef string              `json:"result_ref"`
	By        string              `json:"by"`
}

// reconcile answers POST /v1/actions/{id}/reconcile (operators only).
func (g *Gateway) reconcile(w http.ResponseWriter, r *http.Request, c *call) {
	id := c.id
	if !c.caller.Operator() {
		writeProblem(w, c.surface, noSuchAction())
		return
	}
	if _, _, ok := g.owned(w, r, c); !ok {
		return
	}
	raw, p := g.readBody(w, r)
	if p != nil {
		writeProblem(w, c.surface, p)
		return
	}
	var b reconcileBody
	if err := json.Unmarshal(raw, &b); err != nil {
		writeProblem(w, c.surface, badRequest("", "the body must be a JSON object: {\"attempt\": N, \"verdict\": \"completed\", \"text\": \"...\"}"))
		return
	}
	if b.Attempt == 0 {
		st, err := g.c.Status(r.Context(), id)
		if err != nil {
			g.temporalFailed(w, c, err)
			return
		}
		b.Attempt = st.AwaitingAttempt
	}
	req := workflows.ReconcileRequest{Attempt: b.Attempt, Verdict: b.Verdict, Response: b.Response, ResultRef: b.ResultRef, By: b.By}
	if req.By == "" {
		req.By = "gateway:" + c.caller.ID
	}
	if req.Response == nil && b.Text != "" {
		req.Response = &providers.Response{Text: b.Text, FinishReason: "stop"}
	}
	if err := g.c.Reconcile(r.Context(), id, req); err != nil {
		var re *durallm.ReconcileError
		if errors.As(err, &re) {
			writeProblem(w, c.surface, &answer.Problem{Kind: answer.Conflict, Code: re.Reason, Message: re.Message})
			return
		}
		g.temporalFailed(w, c, err)
		return
	}
	actionHeaders(w.Header(), id)
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "durallm.action.reconcile", "attempt": req.Attempt, "verdict": req.Verdict})
}

// list answers GET /v1/actions?state=STATE (operators only): the ids of
// the actions in a state, newest first.
func (g *Gateway) list(w http.ResponseWriter, r *http.Request, c *call) {
	if !c.caller.Operator() {
		writeProblem(w, c.surface, &answer.Problem{Kind: answer.Forbidden, Code: "operator_only", Message: "listing actions needs an operator token"})
		return
	}
	state := workflows.State(r.URL.Query().Get("state"))
	if !state.Terminal() && state != workflows.StateAwaitingReconciliation && state != workflows.StateDispatching &&
		state != workflows.StateBackingOff && state != workflows.StateQueued {
		writeProblem(w, c.surface, badRequest("state", "state must be one of the action states, e.g. awaiting_reconciliation"))
		return
	}
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			writeProblem(w, c.surface, badRequest("limit", "limit must be 1 to 1000"))
			return
		}
		limit = n
	}
	ids, err := g.c.List(r.Context(), state, limit)
	if err != nil {
		g.temporalFailed(w, c, err)
		return
	}
	type item struct {
		ID     string          `json:"id"`
		Object string          `json:"object"`
		State  workflows.State `json:"state"`
	}
	out := struct {
		Object string `json:"object"`
		Data   []item `json:"data"`
	}{Object: "list", Data: []item{}}
	for _, id := range ids {
		out.Data = append(out.Data, item{ID: id, Object: "durallm.action", State: state})
	}
	writeJSON(w, http.StatusOK, out)
}
