package gateway

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/workflows"
)

// The ops of a stored surface (answer.Stored): a background start, a
// read answered with the object whatever the action's state, cancel,
// delete, the request's items, and a request that continues an earlier
// action. Everything they read is Temporal's and the result store's, so
// every gateway answers them alike, before and after a restart.

// endWait bounds how long a cancel or a delete waits for the canceled
// action to end: its attempt sees the cancel at its next heartbeat.
const endWait = 10 * time.Second

// checkStored refuses a parse that asks for what only a stored surface,
// or a continuer, may (a defect of the surface, not of the request).
func (g *Gateway) checkStored(s answer.Surface, req answer.Request) *answer.Problem {
	_, stored := s.(answer.Stored)
	_, continuer := s.(answer.Continuer)
	switch {
	case req.Background && !stored, req.Continues != nil && !continuer:
		g.log.Error("gateway: a surface asked for what it does not serve", "surface", s.Name())
		return &answer.Problem{Kind: answer.Internal, Message: "the surface cannot serve this request"}
	case len(req.Keep) > answer.MaxKept:
		g.log.Error("gateway: a surface kept more than answer.MaxKept", "surface", s.Name(), "bytes", len(req.Keep))
		return &answer.Problem{Kind: answer.Internal, Message: "the surface cannot serve this request"}
	}
	return nil
}

// answerBackground answers a background start at once: the running
// action's object, or, for a key whose action ended, its answer as a read
// gives it.
func (g *Gateway) answerBackground(w http.ResponseWriter, r *http.Request, s *session) {
	st := s.surface.(answer.Stored)
	if s.replayed {
		d, err := g.c.Describe(r.Context(), s.who.ID)
		if err != nil {
			writeProblem(w, s.surface, g.waitError(s, err))
			return
		}
		g.readStored(w, r, &call{surface: s.surface, id: s.who.ID}, st, d, s.who)
		return
	}
	state := workflows.StateQueued
	if s.keyed {
		// The key may have attached to an action that runs already.
		state = g.stateNow(r.Context(), s.who.ID)
	}
	w.Header().Set("X-Durallm-State", string(state))
	writeBody(w, st.Pending(s.who, string(state)))
}

// readStored answers a read of a stored surface's action with its
// object: pending while it runs, its answer once it has one, else the
// object of how it ended (canceled, failed, ...), always a 200.
func (g *Gateway) readStored(w http.ResponseWriter, r *http.Request, c *call, st answer.Stored, d durallm.Description, who answer.Identity) {
	if d.Running {
		state := g.stateNow(r.Context(), c.id)
		if !state.Terminal() {
			w.Header().Set("X-Durallm-State", string(state))
			writeBody(w, st.Pending(who, string(state)))
			return
		}
		// It ended and its workflow is closing: the result follows at
		// once.
	}
	res, ok := g.ended(w, r, c, d)
	if !ok {
		return
	}
	w.Header().Set("X-Durallm-State", string(res.State))
	o := outcomeOf(res)
	if o.Problem != nil {
		writeBody(w, st.Unanswered(who, *o.Problem))
		return
	}
	if o.Incomplete != "" {
		w.Header().Set("X-Durallm-Incomplete", o.Incomplete)
	}
	writeBody(w, st.Answer(answerOf(who, res, o)))
}

// stopOrigin is the origin of a stop the caller asks for.
func stopOrigin(c Caller) workflows.CancelOrigin {
	if c.Operator() {
		return workflows.OriginOperatorStop
	}
	return workflows.OriginUserStop
}

// stop cancels a running action as its caller's stop and waits, at most
// endWait, for it to end; it reports the action as it is then.
func (g *Gateway) stop(ctx context.Context, c *call, d durallm.Description, note string) (durallm.Description, error) {
	err := g.c.Cancel(ctx, c.id, stopOrigin(c.caller), note)
	if err != nil && !errors.Is(err, durallm.ErrNotFound) {
		// ErrNotFound: it closed meanwhile, which the look below sees.
		return d, err
	}
	wctx, cancel := context.WithTimeout(ctx, endWait)
	defer cancel()
	act := g.c.Get(c.id)
	act.RunID = d.RunID
	_, _ = act.Result(wctx)
	return g.c.Describe(ctx, c.id)
}

// cancelStored answers a Cancel: the caller's own action canceled as its
// stop (user_stop; operator_stop for an operator), then its object as a
// read gives it: canceled once it ended, pending if it has not ended
// within endWait; one that had ended is answered as it ended.
func (g *Gateway) cancelStored(w http.ResponseWriter, r *http.Request, c *call) {
	st := c.surface.(answer.Stored)
	d, m, ok := g.owned(w, r, c)
	if !ok {
		return
	}
	if d.Running {
		var err error
		if d, err = g.stop(r.Context(), c, d, "canceled through the gateway by "+c.caller.ID); err != nil {
			g.temporalFailed(w, c, err)
			return
		}
	}
	actionHeaders(w.Header(), c.id)
	g.readStored(w, r, c, st, d, m.identity(c.id))
}

// deleteStored answers a Delete: the caller's own action, canceled first
// if it runs (user_stop), is deleted (durallm.Client.Delete), so that no
// gateway finds it again; the answer says so.
func (g *Gateway) deleteStored(w http.ResponseWriter, r *http.Request, c *call) {
	st := c.surface.(answer.Stored)
	d, _, ok := g.owned(w, r, c)
	if !ok {
		return
	}
	if d.Running {
		var err error
		if d, err = g.stop(r.Context(), c, d, "deleted through the gateway by "+c.caller.ID); err != nil {
			g.temporalFailed(w, c, err)
			return
		}
		if d.Running {
			writeProblem(w, c.surface, &answer.Problem{Kind: answer.Conflict, Code: "action_running",
				Message: "the action was canceled and has not ended yet: delete it again in a moment"})
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), endWait)
	defer cancel()
	err := g.c.Delete(ctx, c.id)
	switch {
	case err == nil, errors.Is(err, durallm.ErrNotFound):
	case errors.Is(err, durallm.ErrRunning):
		writeProblem(w, c.surface, &answer.Problem{Kind: answer.Conflict, Code: "action_running",
			Message: "the action is running again: delete it again in a moment"})
		return
	default:
		g.temporalFailed(w, c, err)
		return
	}
	actionHeaders(w.Header(), c.id)
	writeBody(w, st.Deleted(c.id))
}

// items answers an Items request: the items of the request the caller's
// own action was started with, read from its history (and the result
// store, for a request kept by reference).
func (g *Gateway) items(w http.ResponseWriter, r *http.Request, c *call) {
	st := c.surface.(answer.Stored)
	d, m, ok := g.owned(w, r, c)
	if !ok {
		return
	}
	in, err := g.c.Input(r.Context(), c.id, d.RunID)
	if err != nil {
		if errors.Is(err, durallm.ErrNotFound) {
			writeProblem(w, c.surface, noSuchAction())
			return
		}
		g.temporalFailed(w, c, err)
		return
	}
	body, p := st.Items(m.identity(c.id), in.Request, r.URL.Query())
	if p != nil {
		writeProblem(w, c.surface, p)
		return
	}
	actionHeaders(w.Header(), c.id)
	writeBody(w, body)
}

// continued composes a request that continues an earlier action
// (answer.Request.Continues): the earlier action's request and answer,
// read from Temporal and the result store, for the same caller and
// surface only (any other, or none, is NotFound alike); an action that
// still runs, or ended without an answer, cannot be continued.
func (g *Gateway) continued(ctx context.Context, caller Caller, surf answer.Surface, req answer.Request) (answer.Request, *answer.Problem) {
	ref := req.Continues
	notFound := &answer.Problem{Kind: answer.NotFound, Param: ref.Param, Message: "no such response to continue: " + ref.Param + " names none of yours"}
	d, err := g.c.Describe(ctx, ref.ID)
	if errors.Is(err, durallm.ErrNotFound) {
		return req, notFound
	}
	if err != nil {
		return req, g.readFailed(ref.ID, err)
	}
	var m gatewayMemo
	if ok, err := d.Memo(memoKey, &m); err != nil || !ok || m.Caller != caller.ID || m.Surface != surf.Name() {
		return req, notFound
	}
	if deleted, err := g.c.Deleted(ctx, ref.ID, d.RunID); err != nil || deleted {
		if err != nil {
			return req, g.readFailed(ref.ID, err)
		}
		return req, notFound
	}
	if d.Running {
		return req, badRequest(ref.Param, "the response "+ref.Param+" names is still in progress: continue it once it has completed")
	}
	act := g.c.Get(ref.ID)
	act.RunID = d.RunID
	res, err := act.Result(ctx)
	var ae *durallm.ActionError
	switch {
	case errors.As(err, &ae):
		res = ae.Result
	case err != nil:
		return req, g.readFailed(ref.ID, err)
	}
	o := outcomeOf(res)
	if !o.OK {
		return req, badRequest(ref.Param, "the response "+ref.Param+" names did not complete (its action ended "+string(res.State)+"): only a completed response can be continued")
	}
	in, err := g.c.Input(ctx, ref.ID, d.RunID)
	if err != nil {
		return req, g.readFailed(ref.ID, err)
	}
	who := m.identity(ref.ID)
	return surf.(answer.Continuer).Continue(req, answer.Earlier{Identity: who, Request: in.Request, Answer: answerOf(who, res, o)})
}

// readFailed is the problem of an earlier action that could not be read.
func (g *Gateway) readFailed(id string, err error) *answer.Problem {
	if unavailable(err) {
		return temporalUnreachable("Temporal is not reachable; nothing was started")
	}
	g.log.Error("gateway: reading an earlier action failed", "action_id", id, "error", err)
	return &answer.Problem{Kind: answer.Internal, Message: "the earlier action could not be read; nothing was started"}
}
