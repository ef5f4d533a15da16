package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/workflows"
)

// waitEnd says how a wait for an action ended.
type waitEnd int

const (
	waitResult   waitEnd = iota // the action ended: res
	waitAwaiting                // it awaits reconciliation: res.Status
	waitTimeout                 // max_wait passed
	waitGone                    // the caller went away
	waitFailed                  // Temporal failed: err
)

// waiter follows one action to its result, watching for the state that
// has no result (awaiting_reconciliation).
type waiter struct {
	g      *Gateway
	s      *session
	result chan waitDone
	cancel context.CancelFunc
	every  time.Duration
}

// maxStatePoll bounds the interval between a long wait's state checks.
const maxStatePoll = 4 * time.Second

// nextPoll is the wait before the next state check: StatePoll, doubling
// to maxStatePoll, so a long wait costs a few queries, not hundreds.
func (wt *waiter) nextPoll() time.Duration {
	if wt.every == 0 {
		wt.every = wt.g.o.StatePoll
	}
	wt.every = min(2*wt.every, max(maxStatePoll, wt.g.o.StatePoll))
	return wt.every
}

type waitDone struct {
	res workflows.ActionResult
	err error
}

func (g *Gateway) newWaiter(s *session) *waiter {
	ctx, cancel := context.WithCancel(context.Background())
	wt := &waiter{g: g, s: s, result: make(chan waitDone, 1), cancel: cancel}
	go func() {
		res, err := s.act.Result(ctx)
		var ae *durallm.ActionError
		if errors.As(err, &ae) {
			res, err = ae.Result, nil
		}
		wt.result <- waitDone{res, err}
	}()
	return wt
}

// poll checks the action's state; it reports the status when it awaits
// reconciliation.
func (wt *waiter) poll(ctx context.Context) (workflows.Status, bool) {
	st, err := wt.g.c.Status(ctx, wt.s.who.ID)
	return st, err == nil && st.State == workflows.StateAwaitingReconciliation
}

// serveJSON waits for the action, at most max_wait, and answers it.
func (g *Gateway) serveJSON(w http.ResponseWriter, r *http.Request, s *session) {
	wt := g.newWaiter(s)
	defer wt.cancel()
	ctx := r.Context()
	limit := time.NewTimer(s.model.maxWait())
	defer limit.Stop()
	poll := time.NewTimer(g.o.StatePoll)
	defer poll.Stop()
	for {
		select {
		case d := <-wt.result:
			g.answerJSON(w, s, d)
			return
		case <-poll.C:
			if st, awaiting := wt.poll(ctx); awaiting {
				w.Header().Set("X-Durallm-State", string(st.State))
				writeProblem(w, s.surface, awaitingProblem(s.who.ID, st.AwaitingAttempt))
				return
			}
			poll.Reset(wt.nextPoll())
		case <-limit.C:
			w.Header().Set("X-Durallm-State", string(g.stateNow(ctx, s.who.ID)))
			writeProblem(w, s.surface, &answer.Problem{Kind: answer.InProgress,
				Message: "the action is still running after the gateway's max_wait: GET /v1/actions/" + s.who.ID + ", or send the request again with the same Idempotency-Key to wait again"})
			return
		case <-ctx.Done():
			g.disconnected(s)
			return
		}
	}
}

// answerJSON writes an ended action's answer.
func (g *Gateway) answerJSON(w http.ResponseWriter, s *session, d waitDone) {
	if d.err != nil {
		writeProblem(w, s.surface, g.waitError(s, d.err))
		return
	}
	res := d.res
	w.Header().Set("X-Durallm-State", string(res.State))
	o := outcomeOf(res)
	if o.Problem != nil {
		writeProblem(w, s.surface, o.Problem)
		return
	}
	if o.Incomplete != "" {
		w.Header().Set("X-Durallm-Incomplete", o.Incomplete)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(s.surface.Answer(answerOf(s.who, res, o)))
}

// answerOf is an ended action's answer, its response never nil.
func answerOf(who answer.Identity, res workflows.ActionResult, o outcome) answer.Answer {
	resp := res.Response
	if resp == nil {
		resp = &providers.Response{}
	}
	return answer.Answer{Identity: who, Response: resp, Incomplete: o.Incomplete}
}

// waitError is the answer when the wait itself failed.
func (g *Gateway) waitError(s *session, err error) *answer.Problem {
	if errors.Is(err, durallm.ErrInvalidInput) {
		return badRequest("", err.Error())
	}
	g.log.Warn("gateway: waiting for the action failed", "action_id", s.who.ID, "error", err)
	return &answer.Problem{Kind: answer.MaybeStarted,
		Message: "the action started but its result could not be read: GET /v1/actions/" + s.who.ID + " later"}
}

// writeBody answers 200 with a JSON body a surface rendered.
func writeBody(w http.ResponseWriter, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encode the answer", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// stateNow is the state a running action is in, for x-durallm-state;
// dispatching when it cannot be read at once.
func (g *Gateway) stateNow(ctx context.Context, id string) workflows.State {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if st, err := g.c.Status(ctx, id); err == nil && st.State != "" {
		return st.State
	}
	return workflows.StateDispatching
}
