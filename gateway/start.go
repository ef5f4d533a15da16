package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.temporal.io/api/serviceerror"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/providers"
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
	// Surface names the surface that started it; Kept is what that
	// surface kept of the request (answer.Request.Keep).
	Surface string `json:"surface,omitempty"`
	Kept    []byte `json:"kept,omitempty"`
}

// identity is what every rendering of the action id started with this
// memo shares.
func (m gatewayMemo) identity(id string) answer.Identity {
	return answer.Identity{ID: id, Created: m.Created, Model: m.Model, Kept: m.Kept}
}

const memoKey = "durallm_gateway"

// session is one request's hold on an action.
type session struct {
	act      *durallm.Action
	who      answer.Identity
	surface  answer.Surface
	replayed bool // the action had ended before the request
	found    bool // the key found the action: this request started nothing
	keyed    bool
	model    Model
	// onDisconnect is cancel or continue.
	onDisconnect string
	// gone is set once the caller's disconnect was handled.
	gone bool
}

// timedOut reports a call that ran out of time: unlike one refused as
// unavailable (no connection) or exhausted (the server's refusal), it may
// have reached Temporal and been carried out.
func timedOut(err error) bool {
	var d *serviceerror.DeadlineExceeded
	return errors.As(err, &d) || errors.Is(err, context.DeadlineExceeded)
}

// unavailable reports a Temporal failure that is neither a refusal nor
// the caller's doing.
func unavailable(err error) bool {
	var u *serviceerror.Unavailable
	var d *serviceerror.DeadlineExceeded
	var x *serviceerror.ResourceExhausted
	return errors.As(err, &u) || errors.As(err, &d) || errors.As(err, &x) || errors.Is(err, context.DeadlineExceeded)
}

// startOrAttach starts the action, or finds the one the key already
// names: attached while it runs, replayed once it ended, refused (422)
// when it was started with another body. A start that may have reached
// Temporal is tried again with the same id, and finds itself. The start
// does not end with the caller's request: a start Temporal may have
// accepted is always seen to its end, so that its action is known (and
// canceled if the caller left).
func (g *Gateway) startOrAttach(ctx context.Context, id string, in workflows.ActionInput, memo gatewayMemo, m Model) (*session, *answer.Problem) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.o.StartTimeout)
	defer cancel()
	wait := 100 * time.Millisecond
	reached := false // a try may have reached Temporal
	for {
		act, err := g.c.StartWith(ctx, id, in, durallm.StartOptions{Memo: map[string]any{memoKey: memo}})
		reached = reached || timedOut(err)
		switch {
		case err == nil:
			g.count(g.idempotent, memo.Keyed, "started")
			return &session{act: act, who: memo.identity(id), keyed: memo.Keyed, model: m}, nil
		case errors.Is(err, resultstore.ErrTooLarge):
			return nil, &answer.Problem{Kind: answer.TooLarge, Message: "the request is larger than the result store keeps; nothing was started"}
		case errors.Is(err, durallm.ErrInvalidInput):
			return nil, badRequest("", err.Error())
		case errors.Is(err, durallm.ErrActionExists):
			return g.find(ctx, id, memo, m)
		case unavailable(err):
			if ctx.Err() == nil {
				select {
				case <-ctx.Done():
				case <-time.After(wait):
				}
				wait = min(2*wait, time.Second)
				if ctx.Err() == nil {
					continue
				}
			}
			if reached {
				return g.startUnknown(id, memo, m)
			}
			// Every try was refused before it reached Temporal.
			return nil, temporalUnreachable("Temporal is not reachable; nothing was started")
		case errors.As(err, new(*serviceerror.InvalidArgument)):
			// Most often a request larger than the server's payload
			// limit (2 MiB by default).
			return nil, &answer.Problem{Kind: answer.TooLarge,
				Message: "Temporal refused the action's input, most likely as larger than its payload size limit; nothing was started"}
		}
		g.log.Error("gateway: start failed", "action_id", id, "error", err)
		return nil, &answer.Problem{Kind: answer.Internal, Message: "the action could not be started"}
	}
}

// startCheck bounds the look, after a start's tries all failed, at
// whether one of them reached Temporal.
const startCheck = 2 * time.Second

// startUnknown settles a start whose every try failed while Temporal was
// unreachable or slow, one of them running out of time: it may have been
// accepted. The action
// found is this request's, and is served as if just started; none found
// is nothing started, which the caller may send again. When Temporal does
// not say, the answer is MaybeStarted, which no client resends by
// default; and since nobody else can find a keyless action, the gateway
// cancels it as soon as Temporal answers (cancelUnseen), as it does when
// a try still on its way might land after a look that found nothing.
func (g *Gateway) startUnknown(id string, memo gatewayMemo, m Model) (*session, *answer.Problem) {
	ctx, cancel := context.WithTimeout(context.Background(), startCheck)
	defer cancel()
	_, err := g.c.Describe(ctx, id)
	switch {
	case err == nil:
		return g.find(ctx, id, memo, m)
	case errors.Is(err, durallm.ErrNotFound):
		if !memo.Keyed {
			go g.cancelUnseen(id)
		}
		return nil, temporalUnreachable("Temporal is not reachable; nothing was started")
	}
	if !memo.Keyed {
		go g.cancelUnseen(id)
	}
	return nil, &answer.Problem{Kind: answer.MaybeStarted,
		Message: "Temporal did not answer the start in time and may have accepted it: the action " + id + " may run. " +
			"Without an Idempotency-Key nobody can find it again, so the gateway cancels it once Temporal answers; sending the request again starts another. " +
			"With a key, send it again with the same key to find it"}
}

// unseenFor is how long the gateway keeps trying to cancel an action
// whose start it could not confirm.
const unseenFor = time.Minute

// cancelUnseen cancels a keyless action whose start the gateway could not
// confirm, as soon as Temporal takes the cancel: it tries for unseenFor,
// backing off from 250ms to 5s, since a start still on its way may land
// after a look that found nothing.
func (g *Gateway) cancelUnseen(id string) {
	wait := 250 * time.Millisecond
	for end := time.Now().Add(unseenFor); time.Now().Before(end); {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := g.c.Cancel(ctx, id, workflows.OriginClientDisconnect, "the gateway could not tell its caller whether the action started")
		cancel()
		if err == nil {
			g.log.Warn("gateway: canceled an action whose start its caller was not told of", "action_id", id)
			return
		}
		time.Sleep(wait)
		wait = min(2*wait, 5*time.Second)
	}
}

// find looks at the action an id already names.
func (g *Gateway) find(ctx context.Context, id string, memo gatewayMemo, m Model) (*session, *answer.Problem) {
	d, err := g.c.Describe(ctx, id)
	if err != nil {
		if unavailable(err) {
			return nil, temporalUnreachable("Temporal is not reachable")
		}
		g.log.Error("gateway: describe failed", "action_id", id, "error", err)
		return nil, &answer.Problem{Kind: answer.Internal, Message: "the action could not be read"}
	}
	var have gatewayMemo
	ok, err := d.Memo(memoKey, &have)
	if err != nil || !ok || have.Caller != memo.Caller || have.Fingerprint != memo.Fingerprint {
		g.count(g.idempotent, memo.Keyed, "reused")
		return nil, &answer.Problem{Kind: answer.KeyReused, Param: IdempotencyHeader,
			Message: "this Idempotency-Key was used with another request body; use a new key for a new request"}
	}
	s := &session{act: g.c.Get(id), who: have.identity(id), replayed: !d.Running, found: true, keyed: memo.Keyed, model: m}
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

// start answers a surface's Start request: the body parsed by the
// surface, one action (new, or the one the key names), answered as JSON
// or streamed.
func (g *Gateway) start(w http.ResponseWriter, r *http.Request, c *call) {
	surf, caller, ri := c.surface, c.caller, c.ri
	// The place is taken before the body is read: a caller cannot hold
	// more than its places with bodies that never arrive.
	release, ok := g.acquire(caller)
	if !ok {
		writeProblem(w, surf, callerLimit(caller, "nothing was started"))
		return
	}
	defer release()
	body, p := g.readBody(w, r)
	if p != nil {
		writeProblem(w, surf, p)
		return
	}
	req, p := g.parse(surf, body)
	if p == nil {
		p = checkMetadata(req.Request)
	}
	if p == nil {
		p = g.checkStored(surf, req)
	}
	if p != nil {
		writeProblem(w, surf, p)
		return
	}
	for k, v := range req.Header {
		w.Header()[k] = v
	}
	m, ok := g.o.Models.Lookup(req.Model)
	if !ok || !caller.mayUse(req.Model) {
		writeProblem(w, surf, modelNotFound())
		return
	}
	ri.model = m.Name
	if req.Continues != nil {
		if req, p = g.continued(r.Context(), caller, surf, req); p != nil {
			writeProblem(w, surf, p)
			return
		}
	}
	key := r.Header.Get(IdempotencyHeader)
	_, keyed := r.Header[http.CanonicalHeaderKey(IdempotencyHeader)]
	if keyed {
		if err := validKey(key); err != nil {
			writeProblem(w, surf, badRequest(IdempotencyHeader, err.Error()))
			return
		}
	}
	onDisconnect := m.OnDisconnect
	if v := r.Header.Get("X-Durallm-On-Disconnect"); v != "" {
		if v != OnDisconnectCancel && v != OnDisconnectContinue {
			writeProblem(w, surf, badRequest("X-Durallm-On-Disconnect", "want cancel or continue"))
			return
		}
		onDisconnect = v
	}
	if onDisconnect == "" {
		onDisconnect = OnDisconnectCancel
	}
	if req.Background {
		// The caller reads a background answer later: its leaving is
		// expected, never a cancel.
		onDisconnect = OnDisconnectContinue
	}
	fp, err := fingerprint(g.o.Secret, body)
	if err != nil {
		writeProblem(w, surf, badRequest("", "the request body must be a JSON object"))
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
	memo := gatewayMemo{Caller: caller.ID, Fingerprint: fp, Created: time.Now().Unix(), Model: m.Name, Keyed: keyed, Surface: surf.Name(), Kept: req.Keep}
	in := m.input(req.Request)
	in.Caller = caller.ID // a label on the action's token and cost metrics
	sess, p := g.startWithinBudget(r.Context(), caller, id, in, memo, m)
	if p != nil {
		if p.Kind == answer.MaybeStarted {
			actionHeaders(w.Header(), id)
		}
		writeProblem(w, surf, p)
		return
	}
	sess.surface = surf
	sess.onDisconnect = onDisconnect
	actionHeaders(w.Header(), id)
	if sess.replayed {
		w.Header().Set("X-Durallm-Replayed", "true")
	} else {
		g.attach(id)
		defer func() {
			if !sess.gone {
				g.answered(id)
			}
		}()
		if r.Context().Err() != nil {
			// The caller left while its action was starting.
			g.disconnected(sess)
			return
		}
	}
	if req.Stream {
		g.serveStream(w, r, sess, streamOptions{encoder: surf.Stream(sess.who, req.Options)})
		return
	}
	if req.Background {
		g.answerBackground(w, r, sess)
		return
	}
	g.serveJSON(w, r, sess)
}

// parse reads a Start request's body: its State first when the surface
// reads it apart (answer.StateParser), then the rest.
func (g *Gateway) parse(surf answer.Surface, body []byte) (answer.Request, *answer.Problem) {
	sp, ok := surf.(answer.StateParser)
	if !ok {
		return surf.Parse(body)
	}
	rest, st, p := sp.ParseState(body)
	if p != nil {
		return answer.Request{}, p
	}
	req, p := surf.Parse(rest)
	req.State = st
	return req, p
}

// metadataPrefix starts the metadata keys that are durallm's own
// (exchange.MetadataAttemptID, exchange.MetadataActionID: a provider's
// record is searched by them).
const metadataPrefix = "durallm_"

// checkMetadata refuses a request whose metadata, which goes upstream as
// it is, is not an object or uses a key of durallm's.
func checkMetadata(r providers.Request) *answer.Problem {
	raw, ok := r.Params["metadata"]
	if !ok {
		return nil
	}
	var meta map[string]json.RawMessage
	if err := json.Unmarshal(raw, &meta); err != nil || meta == nil {
		return badRequest("metadata", "metadata must be an object")
	}
	for k := range meta {
		if strings.HasPrefix(k, metadataPrefix) {
			return badRequest("metadata", "metadata keys starting with "+metadataPrefix+" are durallm's own: use another name")
		}
	}
	return nil
}

// readBody reads a request's body, at most MaxBody bytes and within
// BodyTimeout. A larger one is a 413: at once when its Content-Length
// says so, else once MaxBody+1 bytes were read; the rest is never read,
// and the connection closes.
func (g *Gateway) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *answer.Problem) {
	over := func() ([]byte, *answer.Problem) {
		w.Header().Set("Connection", "close")
		return nil, &answer.Problem{Kind: answer.TooLarge, Message: fmt.Sprintf("the request body is over %d bytes; nothing was started", g.o.MaxBody)}
	}
	if r.ContentLength > g.o.MaxBody {
		return over()
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(g.o.BodyTimeout))
	body, err := io.ReadAll(io.LimitReader(r.Body, g.o.MaxBody+1))
	// The connection is read again to see the caller leave: no deadline
	// past the body.
	_ = rc.SetReadDeadline(time.Time{})
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The rest of the body is not waited for: the connection closes
		// after the answer.
		w.Header().Set("Connection", "close")
		return nil, &answer.Problem{Kind: answer.RequestTimeout, Message: fmt.Sprintf("the request body did not arrive within %s; nothing was started", g.o.BodyTimeout)}
	case err != nil:
		return nil, badRequest("", "the request body could not be read")
	case int64(len(body)) > g.o.MaxBody:
		return over()
	}
	return body, nil
}

// actionHeaders name the action on every answer about it; x-request-id is
// what the OpenAI SDKs expose to their callers, request-id what the
// Anthropic SDKs do (anthropic-sdk-go: Error.RequestID; @anthropic-ai/sdk:
// _request_id).
func actionHeaders(h http.Header, id string) {
	h.Set("X-Durallm-Action-Id", id)
	h.Set("X-Request-Id", id)
	h.Set("Request-Id", id)
}

// disconnected handles a caller that went away before its answer:
// without a key the action is canceled at once (nobody can find it
// again); with one, after the disconnect grace unless a retry with the
// same key attached meanwhile; never with on_disconnect continue. Each
// departure's grace is its own: a retry that attached and left again
// starts a new one, and the earlier grace cancels nothing.
func (g *Gateway) disconnected(s *session) {
	if s.replayed || s.gone {
		return
	}
	s.gone = true
	left, dep := g.detach(s.who.ID)
	if s.onDisconnect == OnDisconnectContinue || left > 0 {
		return
	}
	cancel := func() {
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
	time.AfterFunc(s.model.grace(), func() {
		if g.graceEnded(s.who.ID, dep) {
			cancel()
		}
	})
}

// departure is one moment the last request attached to an action left.
// It is told apart by its address, so it must not be of size zero.
type departure struct{ at time.Time }

// attach counts a request of this process on a running action; whatever
// grace runs for it is over.
func (g *Gateway) attach(id string) {
	g.mu.Lock()
	g.attached[id]++
	delete(g.departed, id)
	g.mu.Unlock()
}

// answered uncounts a request that got its answer.
func (g *Gateway) answered(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.attached[id]--; g.attached[id] <= 0 {
		delete(g.attached, id)
	}
}

// detach reports how many requests are left on the action, and, when
// none is, the departure whose grace starts now.
func (g *Gateway) detach(id string) (int, *departure) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.attached[id]--
	n := g.attached[id]
	if n > 0 {
		return n, nil
	}
	delete(g.attached, id)
	dep := &departure{at: time.Now()}
	g.departed[id] = dep
	return 0, dep
}

// graceEnded reports whether dep is still the action's last departure:
// no request attached since, and none left after it. It forgets it.
func (g *Gateway) graceEnded(id string, dep *departure) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.departed[id] != dep {
		return false
	}
	delete(g.departed, id)
	return true
}
