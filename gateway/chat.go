package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.temporal.io/api/serviceerror"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/workflows"
)

// gatewayMemo is what the gateway keeps in an action's memo: whose it is,
// the request's fingerprint, and what its answers render with. Sealed by
// the payload codec when one is on.
type gatewayMemo struct {
	Caller      string `json:"caller"`
	Fingerprint string `json:"fingerprint"`
	Created     int64  `json:"created"`
	Model       string `json:"model"`
	Keyed       bool   `json:"keyed,omitempty"`
}

const memoKey = "durallm_gateway"

// session is one request's hold on an action.
type session struct {
	act      *durallm.Action
	who      answerIdentity
	replayed bool // the action had ended before the request
	keyed    bool
	model    Model
	// onDisconnect is cancel or continue.
	onDisconnect string
	// gone is set once the caller's disconnect was handled.
	gone bool
}

// errTemporal is a Temporal failure that is neither a refusal nor the
// caller's doing.
func unavailable(err error) bool {
	var u *serviceerror.Unavailable
	var d *serviceerror.DeadlineExceeded
	var x *serviceerror.ResourceExhausted
	return errors.As(err, &u) || errors.As(err, &d) || errors.As(err, &x) || errors.Is(err, context.DeadlineExceeded)
}

// startOrAttach starts the action, or finds the one the key already
// names: attached while it runs, replayed once it ended, refused (422)
// when it was started with another body. A start that may have reached
// Temporal is tried again with the same id, and finds itself.
func (g *Gateway) startOrAttach(ctx context.Context, id string, in workflows.ActionInput, memo gatewayMemo, m Model) (*session, *apiError) {
	ctx, cancel := context.WithTimeout(ctx, g.o.StartTimeout)
	defer cancel()
	wait := 100 * time.Millisecond
	for {
		act, err := g.c.StartWith(ctx, id, in, durallm.StartOptions{Memo: map[string]any{memoKey: memo}})
		switch {
		case err == nil:
			g.count(g.idempotent, memo.Keyed, "started")
			return &session{act: act, who: answerIdentity{ID: id, Created: memo.Created, Model: memo.Model}, keyed: memo.Keyed, model: m}, nil
		case errors.Is(err, resultstore.ErrTooLarge):
			return nil, tooLarge("the request is larger than the result store keeps; nothing was started")
		case errors.Is(err, durallm.ErrInvalidInput):
			return nil, badRequest("", err.Error())
		case errors.Is(err, durallm.ErrActionExists):
			return g.find(ctx, id, memo, m)
		case unavailable(err) && ctx.Err() == nil:
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			wait = min(2*wait, time.Second)
			continue
		case unavailable(err):
			return nil, &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: codeTemporalUnreachable, Retry: true, RetryAfter: time.Second,
				Message: "Temporal is not reachable; nothing was started"}
		case errors.As(err, new(*serviceerror.InvalidArgument)):
			// Most often a request larger than the server's payload
			// limit (2 MiB by default).
			return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Type: typeInvalidRequest, Code: codeRequestTooLarge,
				Message: "Temporal refused the action's input, most likely as larger than its payload size limit; nothing was started"}
		}
		g.log.Error("gateway: start failed", "action_id", id, "error", err)
		return nil, &apiError{Status: http.StatusInternalServerError, Type: typeServer, Message: "the action could not be started"}
	}
}

// find looks at the action an id already names.
func (g *Gateway) find(ctx context.Context, id string, memo gatewayMemo, m Model) (*session, *apiError) {
	d, err := g.c.Describe(ctx, id)
	if err != nil {
		if unavailable(err) {
			return nil, &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: codeTemporalUnreachable, Retry: true, RetryAfter: time.Second,
				Message: "Temporal is not reachable"}
		}
		g.log.Error("gateway: describe failed", "action_id", id, "error", err)
		return nil, &apiError{Status: http.StatusInternalServerError, Type: typeServer, Message: "the action could not be read"}
	}
	var have gatewayMemo
	ok, err := d.Memo(memoKey, &have)
	if err != nil || !ok || have.Caller != memo.Caller || have.Fingerprint != memo.Fingerprint {
		g.count(g.idempotent, memo.Keyed, "reused")
		return nil, &apiError{Status: http.StatusUnprocessableEntity, Type: typeInvalidRequest, Code: codeIdempotencyKeyReused, Param: IdempotencyHeader,
			Message: "this Idempotency-Key was used with another request body; use a new key for a new request"}
	}
	s := &session{act: g.c.Get(id), who: answerIdentity{ID: id, Created: have.Created, Model: have.Model}, replayed: !d.Running, keyed: memo.Keyed, model: m}
	s.act.RunID = d.RunID
	if s.replayed {
		g.count(g.idempotent, memo.Keyed, "replayed")
	} else {
		g.count(g.idempotent, memo.Keyed, "attached")
	}
	return s, nil
}

func (g *Gateway) count(c metric.Int64Counter, keyed bool, result string) {
	if c == nil || !keyed {
		return
	}
	c.Add(context.Background(), 1, metric.WithAttributes(attribute.String("result", result)))
}

// readBody reads a request body of at most MaxBody bytes. A larger one
// is a 413: at once when its Content-Length says so, else once MaxBody+1
// bytes were read; the rest is never read, and the connection closes.
func (g *Gateway) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	over := func() ([]byte, *apiError) {
		w.Header().Set("Connection", "close")
		return nil, tooLarge(fmt.Sprintf("the request body is over %d bytes; nothing was started", g.o.MaxBody))
	}
	if r.ContentLength > g.o.MaxBody {
		return over()
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, g.o.MaxBody+1))
	if err != nil {
		return nil, badRequest("", "the request body could not be read")
	}
	if int64(len(body)) > g.o.MaxBody {
		return over()
	}
	return body, nil
}

func tooLarge(msg string) *apiError {
	return &apiError{Status: http.StatusRequestEntityTooLarge, Type: typeInvalidRequest, Code: codeRequestTooLarge, Message: msg}
}

// chat answers POST /v1/chat/completions.
func (g *Gateway) chat(w http.ResponseWriter, r *http.Request, caller Caller, ri *requestInfo) {
	body, aerr := g.readBody(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	cr, aerr := parseChatRequest(body)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	m, ok := g.o.Models.Lookup(cr.Model)
	if !ok || !caller.mayUse(cr.Model) {
		writeError(w, &apiError{Status: http.StatusNotFound, Type: typeInvalidRequest, Code: codeModelNotFound, Param: "model",
			Message: "the model does not exist or you do not have access to it (GET /v1/models lists yours)"})
		return
	}
	ri.model = m.Name
	key := r.Header.Get(IdempotencyHeader)
	_, keyed := r.Header[http.CanonicalHeaderKey(IdempotencyHeader)]
	if keyed {
		if err := validKey(key); err != nil {
			writeError(w, badRequest(IdempotencyHeader, err.Error()))
			return
		}
	}
	onDisconnect := m.OnDisconnect
	if v := r.Header.Get("X-Durallm-On-Disconnect"); v != "" {
		if v != OnDisconnectCancel && v != OnDisconnectContinue {
			writeError(w, badRequest("X-Durallm-On-Disconnect", "want cancel or continue"))
			return
		}
		onDisconnect = v
	}
	if onDisconnect == "" {
		onDisconnect = OnDisconnectCancel
	}
	release, ok := g.acquire(caller)
	if !ok {
		writeError(w, &apiError{Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: codeCallerLimit, Retry: true, RetryAfter: time.Second,
			Message: fmt.Sprintf("you have %d requests in progress, your max_in_flight; nothing was started", caller.MaxInFlight)})
		return
	}
	defer release()
	fp, err := fingerprint(g.o.Secret, body)
	if err != nil {
		writeError(w, badRequest("", "the request body must be a JSON object"))
		return
	}
	id := randomActionID()
	if keyed {
		id = keyedActionID(caller.ID, key)
	} else if n, _ := strconv.Atoi(r.Header.Get("X-Stainless-Retry-Count")); n > 0 {
		g.keylessRetries.Add(1)
		if g.keyless != nil {
			g.keyless.Add(r.Context(), 1)
		}
		g.log.Warn("gateway: an SDK retried a request without an Idempotency-Key: it runs as a new action", "caller", caller.ID, "action_id", id)
	}
	ri.actionID = id
	memo := gatewayMemo{Caller: caller.ID, Fingerprint: fp, Created: time.Now().Unix(), Model: m.Name, Keyed: keyed}
	in := m.input(cr.Request)
	in.Caller = caller.ID // a label on the action's token and cost metrics
	sess, aerr := g.startOrAttach(r.Context(), id, in, memo, m)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	sess.onDisconnect = onDisconnect
	actionHeaders(w.Header(), id)
	if sess.replayed {
		w.Header().Set("X-Durallm-Replayed", "true")
	} else {
		g.attach(id)
		defer func() {
			if !sess.gone {
				g.detach(id)
			}
		}()
	}
	if cr.Stream {
		g.serveStream(w, r, sess, streamOptions{includeUsage: cr.IncludeUsage})
		return
	}
	g.serveJSON(w, r, sess)
}

// actionHeaders name the action on every answer about it; x-request-id is
// what the OpenAI SDKs expose to their callers.
func actionHeaders(h http.Header, id string) {
	h.Set("X-Durallm-Action-Id", id)
	h.Set("X-Request-Id", id)
}

// disconnected handles a caller that went away before its answer:
// without a key the action is canceled at once (nobody can find it
// again); with one, after the disconnect grace unless a retry with the
// same key attached; never with on_disconnect continue.
func (g *Gateway) disconnected(s *session) {
	if s.replayed || s.gone {
		return
	}
	s.gone = true
	left := g.detach(s.who.ID)
	if s.onDisconnect == OnDisconnectContinue || left > 0 {
		return
	}
	cancel := func() {
		if g.attachedCount(s.who.ID) > 0 {
			return
		}
		ctx, done := context.WithTimeout(context.Background(), 10*time.Second)
		defer done()
		if err := g.c.Cancel(ctx, s.who.ID, workflows.OriginClientDisconnect, "the gateway's caller disconnected"); err != nil && !errors.Is(err, durallm.ErrNotFound) {
			g.log.Warn("gateway: cancel after a disconnect failed", "action_id", s.who.ID, "error", err)
		}
	}
	if !s.keyed {
		go cancel()
		return
	}
	time.AfterFunc(s.model.grace(), cancel)
}

// attach counts a request of this process on a running action; detach
// reports how many are left.
func (g *Gateway) attach(id string) {
	g.mu.Lock()
	g.attached[id]++
	g.mu.Unlock()
}

func (g *Gateway) detach(id string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.attached[id]--
	n := g.attached[id]
	if n <= 0 {
		delete(g.attached, id)
	}
	return n
}

func (g *Gateway) attachedCount(id string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.attached[id]
}
