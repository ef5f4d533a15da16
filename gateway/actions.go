package gateway

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/workflows"
)

// owned finds an action the caller may see: its own (the memo's caller),
// or any for an operator. Another caller's action, or one that does not
// exist, is a 404 alike.
func (g *Gateway) owned(w http.ResponseWriter, r *http.Request, c Caller, id string) (durallm.Description, gatewayMemo, bool) {
	d, err := g.c.Describe(r.Context(), id)
	if err != nil {
		if errors.Is(err, durallm.ErrNotFound) {
			notFound(w)
		} else {
			g.temporalFailed(w, id, err)
		}
		return d, gatewayMemo{}, false
	}
	var m gatewayMemo
	ok, err := d.Memo(memoKey, &m)
	if err != nil || (!c.Operator() && (!ok || m.Caller != c.ID)) {
		notFound(w)
		return d, m, false
	}
	if !ok {
		// Not started by a gateway: render with what Temporal knows.
		m = gatewayMemo{Created: d.StartTime.Unix()}
	}
	return d, m, true
}

func (g *Gateway) temporalFailed(w http.ResponseWriter, id string, err error) {
	if unavailable(err) {
		writeError(w, &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: codeTemporalUnreachable, Message: "Temporal is not reachable"})
		return
	}
	g.log.Error("gateway: reading an action failed", "action_id", id, "error", err)
	writeError(w, &apiError{Status: http.StatusInternalServerError, Type: typeServer, Message: "the action could not be read"})
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
// and answer; with ?stream=true its stream (replayed after
// starting_after=N, then live).
func (g *Gateway) getAction(w http.ResponseWriter, r *http.Request, c Caller, id string) {
	q := r.URL.Query()
	stream := q.Get("stream") == "true"
	var after uint64
	if v := q.Get("starting_after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeError(w, badRequest("starting_after", "starting_after must be a sequence number, 0 or more"))
			return
		}
		after = n
	}
	d, m, ok := g.owned(w, r, c, id)
	if !ok {
		return
	}
	actionHeaders(w.Header(), id)
	act := g.c.Get(id)
	act.RunID = d.RunID
	who := answerIdentity{ID: id, Created: m.Created, Model: m.Model}
	if stream {
		// A reader of the stream does not own the action: its leaving
		// cancels nothing.
		s := &session{act: act, who: who, replayed: !d.Running, onDisconnect: OnDisconnectContinue, gone: true}
		g.serveStream(w, r, s, streamOptions{includeUsage: true, after: after})
		return
	}
	var v actionView
	if d.Running {
		st, err := g.c.Status(r.Context(), id)
		if err != nil {
			g.temporalFailed(w, id, err)
			return
		}
		v = viewOf(who, workflows.ActionResult{Status: st})
	} else {
		res, err := act.Result(r.Context())
		var ae *durallm.ActionError
		switch {
		case errors.As(err, &ae):
			res = ae.Result
		case err != nil:
			g.temporalFailed(w, id, err)
			return
		}
		v = viewOf(who, res)
	}
	w.Header().Set("X-Durallm-State", string(v.State))
	writeJSON(w, http.StatusOK, v)
}

func viewOf(who answerIdentity, res workflows.ActionResult) actionView {
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
		resp := res.Response
		if resp == nil {
			resp = emptyResponse()
		}
		v.Completion = completionJSON(who, resp)
	case o.Err != nil:
		var e struct {
			Error json.RawMessage `json:"error"`
		}
		if json.Unmarshal(errorBody(o.Err), &e) == nil {
			v.Error = e.Error
		}
	}
	return v
}

// cancel answers POST /v1/actions/{id}/cancel: user_stop, or
// operator_stop for an operator.
func (g *Gateway) cancel(w http.ResponseWriter, r *http.Request, c Caller, id string) {
	if _, _, ok := g.owned(w, r, c, id); !ok {
		return
	}
	origin := workflows.OriginUserStop
	if c.Operator() {
		origin = workflows.OriginOperatorStop
	}
	if err := g.c.Cancel(r.Context(), id, origin, "canceled through the gateway by "+c.ID); err != nil {
		if errors.Is(err, durallm.ErrNotFound) {
			// The action closed: nothing to cancel.
			writeError(w, &apiError{Status: http.StatusConflict, Type: typeInvalidRequest, Code: "action_ended", Message: "the action already ended"})
			return
		}
		g.temporalFailed(w, id, err)
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
func (g *Gateway) reconcile(w http.ResponseWriter, r *http.Request, c Caller, id string) {
	if !c.Operator() {
		notFound(w)
		return
	}
	if _, _, ok := g.owned(w, r, c, id); !ok {
		return
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, g.o.MaxBody+1))
	if err != nil || int64(len(raw)) > g.o.MaxBody {
		writeError(w, badRequest("", "the body could not be read, or is too large"))
		return
	}
	var b reconcileBody
	if err := json.Unmarshal(raw, &b); err != nil {
		writeError(w, badRequest("", "the body must be a JSON object: {\"attempt\": N, \"verdict\": \"completed\", \"text\": \"...\"}"))
		return
	}
	if b.Attempt == 0 {
		st, err := g.c.Status(r.Context(), id)
		if err != nil {
			g.temporalFailed(w, id, err)
			return
		}
		b.Attempt = st.AwaitingAttempt
	}
	req := workflows.ReconcileRequest{Attempt: b.Attempt, Verdict: b.Verdict, Response: b.Response, ResultRef: b.ResultRef, By: b.By}
	if req.By == "" {
		req.By = "gateway:" + c.ID
	}
	if req.Response == nil && b.Text != "" {
		req.Response = &providers.Response{Text: b.Text, FinishReason: "stop"}
	}
	if err := g.c.Reconcile(r.Context(), id, req); err != nil {
		var re *durallm.ReconcileError
		if errors.As(err, &re) {
			writeError(w, &apiError{Status: http.StatusConflict, Type: "durallm_reconcile_rejected", Code: re.Reason, Message: re.Message})
			return
		}
		g.temporalFailed(w, id, err)
		return
	}
	actionHeaders(w.Header(), id)
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "durallm.action.reconcile", "attempt": req.Attempt, "verdict": req.Verdict})
}

// list answers GET /v1/actions?state=STATE (operators only): the ids of
// the actions in a state, newest first.
func (g *Gateway) list(w http.ResponseWriter, r *http.Request, c Caller) {
	if !c.Operator() {
		writeError(w, &apiError{Status: http.StatusForbidden, Type: typeInvalidRequest, Code: codeOperatorOnly, Message: "listing actions needs an operator token"})
		return
	}
	state := workflows.State(r.URL.Query().Get("state"))
	if !state.Terminal() && state != workflows.StateAwaitingReconciliation && state != workflows.StateDispatching &&
		state != workflows.StateBackingOff && state != workflows.StateQueued {
		writeError(w, badRequest("state", "state must be one of the action states, e.g. awaiting_reconciliation"))
		return
	}
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			writeError(w, badRequest("limit", "limit must be 1 to 1000"))
			return
		}
		limit = n
	}
	ids, err := g.c.List(r.Context(), state, limit)
	if err != nil {
		g.temporalFailed(w, "", err)
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
