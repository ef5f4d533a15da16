package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.temporal.io/api/serviceerror"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/activities"
	"github.com/durallm/durallm/workflows"
)

// Options configures a Gateway. Zero values take the defaults named on
// each field.
type Options struct {
	// Client starts and steers the actions. Required. Give it the data
	// converter its Temporal client was dialed with (WithDataConverter)
	// when payloads are encrypted, and the result store (WithResults).
	Client *durallm.Client
	// Models are the models served. Required; validated by New.
	Models Config
	// Secret keys the request fingerprints (HMAC-SHA256). Required, at
	// least 32 bytes, the same on every gateway of a task queue and across
	// restarts: a retry whose fingerprint differs is refused (422).
	Secret []byte
	// Tokens are the callers. Nil means no authentication: every request
	// is the operator "anonymous", which only a loopback gateway may be
	// (the command refuses otherwise).
	Tokens *Tokens
	// Streams is the hub of a worker in this process, whose attempts
	// stream through it. Nil means none.
	Streams *activities.Streams
	// Remote reads the stream of an attempt that runs on a worker in
	// another process (found through its heartbeat). Nil means only
	// Streams is read; with neither, a streamed answer arrives whole when
	// the action ends.
	Remote *RemoteStreams
	// Logger receives one line per request at Debug (method, path,
	// status, action id, model, caller id) and problems at Warn and
	// Error; never a prompt, an answer, a token or a key. Nil means
	// slog.Default().
	Logger *slog.Logger
	// Meter, when set, counts requests and idempotency decisions.
	Meter metric.Meter
	// StreamHold is how long a stream holds its status for the first
	// content, so that an answer that fails before it is a real error
	// status. Zero means 10s.
	StreamHold time.Duration
	// KeepAlive is the silence after which a stream sends ": keep-alive".
	// Zero means 15s.
	KeepAlive time.Duration
	// MaxBody bounds a request body. Zero means 8 MiB.
	MaxBody int64
	// StatePoll is how soon a wait first checks whether its action has
	// gone to awaiting_reconciliation (which has no result to wait for);
	// the interval doubles to 4s. Zero means 250ms.
	StatePoll time.Duration
	// StartTimeout bounds the start of an action (all its tries) before
	// the answer is a 503. Zero means 10s.
	StartTimeout time.Duration
}

// Gateway is the OpenAI-compatible front door, an http.Handler. It is safe
// for concurrent use.
type Gateway struct {
	o   Options
	c   *durallm.Client
	log *slog.Logger

	mu       sync.Mutex
	inFlight map[string]int // by caller id
	// attached counts the requests of this process attached to each
	// running action, so a keyed disconnect's grace knows whether a retry
	// came back.
	attached map[string]int

	requests   metric.Int64Counter
	idempotent metric.Int64Counter
	keyless    metric.Int64Counter
	// keylessRetries counts requests without a key that an SDK marked as
	// retries (X-Stainless-Retry-Count > 0): each one is a new generation.
	keylessRetries atomic.Int64
}

// Defaults of Options.
const (
	DefaultStreamHold = 10 * time.Second
	DefaultKeepAlive  = 15 * time.Second
	DefaultMaxBody    = 8 << 20
)

// New validates the options and returns the gateway.
func New(o Options) (*Gateway, error) {
	var errs []error
	if o.Client == nil {
		errs = append(errs, errors.New("gateway: Options.Client is required"))
	}
	if len(o.Secret) < 32 {
		errs = append(errs, errors.New("gateway: Options.Secret must be at least 32 bytes"))
	}
	if err := o.Models.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.StreamHold <= 0 {
		o.StreamHold = DefaultStreamHold
	}
	if o.KeepAlive <= 0 {
		o.KeepAlive = DefaultKeepAlive
	}
	if o.MaxBody <= 0 {
		o.MaxBody = DefaultMaxBody
	}
	if o.StatePoll <= 0 {
		o.StatePoll = 250 * time.Millisecond
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 10 * time.Second
	}
	g := &Gateway{o: o, c: o.Client, log: o.Logger, inFlight: map[string]int{}, attached: map[string]int{}}
	if o.Meter != nil {
		var err error
		if g.requests, err = o.Meter.Int64Counter("durallm.gateway.requests", metric.WithDescription("Gateway requests by endpoint and status")); err != nil {
			return nil, err
		}
		if g.idempotent, err = o.Meter.Int64Counter("durallm.gateway.idempotency", metric.WithDescription("Keyed requests by what the key found: started, attached, replayed, reused (422)")); err != nil {
			return nil, err
		}
		if g.keyless, err = o.Meter.Int64Counter("durallm.gateway.keyless_retries", metric.WithDescription("Requests without an Idempotency-Key that an SDK marked as retries: each starts a new action")); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// KeylessRetries is how many requests without an Idempotency-Key were an
// SDK's retries (X-Stainless-Retry-Count > 0), each a new generation.
func (g *Gateway) KeylessRetries() int64 { return g.keylessRetries.Load() }

// ServeHTTP routes the request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &statusRecorder{ResponseWriter: w}
	var ri requestInfo
	g.serve(rec, r, &ri)
	g.log.Debug("gateway request", "method", r.Method, "path", ri.endpoint, "status", rec.status,
		"action_id", ri.actionID, "model", ri.model, "caller", ri.caller, "took", time.Since(start).Round(time.Microsecond))
	if g.requests != nil {
		g.requests.Add(context.Background(), 1, metric.WithAttributes(attribute.String("endpoint", ri.endpoint), attribute.Int("status", rec.status)))
	}
}

// requestInfo is what the request log line says: nothing a caller chose
// beyond the model name and the path's shape.
type requestInfo struct {
	endpoint, actionID, model, caller string
}

func (g *Gateway) serve(w http.ResponseWriter, r *http.Request, ri *requestInfo) {
	path := r.URL.EscapedPath()
	switch {
	case path == "/v1/chat/completions":
		if caller, ok := g.enter(w, r, ri, path, http.MethodPost); ok {
			g.chat(w, r, caller, ri)
		}
	case path == "/v1/models":
		if caller, ok := g.enter(w, r, ri, path, http.MethodGet); ok {
			g.models(w, caller)
		}
	case path == "/v1/actions":
		if caller, ok := g.enter(w, r, ri, path, http.MethodGet); ok {
			g.list(w, r, caller)
		}
	case strings.HasPrefix(path, "/v1/actions/"):
		seg, verb, _ := strings.Cut(strings.TrimPrefix(path, "/v1/actions/"), "/")
		id, err := url.PathUnescape(seg)
		if err != nil || id == "" || strings.Contains(verb, "/") {
			ri.endpoint = "other"
			notFound(w)
			return
		}
		ri.actionID = id
		switch verb {
		case "":
			if caller, ok := g.enter(w, r, ri, "/v1/actions/{id}", http.MethodGet); ok {
				g.getAction(w, r, caller, id)
			}
		case "cancel":
			if caller, ok := g.enter(w, r, ri, "/v1/actions/{id}/cancel", http.MethodPost); ok {
				g.cancel(w, r, caller, id)
			}
		case "reconcile":
			if caller, ok := g.enter(w, r, ri, "/v1/actions/{id}/reconcile", http.MethodPost); ok {
				g.reconcile(w, r, caller, id)
			}
		default:
			ri.endpoint = "other"
			notFound(w)
		}
	default:
		ri.endpoint = "other"
		msg := "durallm's gateway serves /v1/chat/completions, /v1/models and /v1/actions"
		if strings.HasPrefix(path, "/v1/responses") {
			msg = "/v1/responses is not served: durallm's actions are chat-shaped, and Responses needs stored conversation state; use /v1/chat/completions"
		}
		writeError(w, &apiError{Status: http.StatusNotFound, Type: typeInvalidRequest, Code: codeUnsupportedEndpoint, Message: msg})
	}
}

// enter checks a request for an endpoint: its method, then its caller.
func (g *Gateway) enter(w http.ResponseWriter, r *http.Request, ri *requestInfo, endpoint, method string) (Caller, bool) {
	ri.endpoint = endpoint
	if !allow(w, r, method) {
		return Caller{}, false
	}
	caller, ok := g.authenticate(w, r)
	ri.caller = caller.ID
	return caller, ok
}

func allow(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method {
		return true
	}
	w.Header().Set("Allow", method)
	writeError(w, &apiError{Status: http.StatusMethodNotAllowed, Type: typeInvalidRequest, Code: codeMethodNotAllowed, Message: "use " + method})
	return false
}

func notFound(w http.ResponseWriter) {
	writeError(w, &apiError{Status: http.StatusNotFound, Type: typeInvalidRequest, Code: codeNotFound, Message: "no such action"})
}

// authenticate finds the caller of the request's bearer token; without
// tokens every request is the anonymous operator.
func (g *Gateway) authenticate(w http.ResponseWriter, r *http.Request) (Caller, bool) {
	if g.o.Tokens == nil {
		return anonymous, true
	}
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if ok && strings.EqualFold(scheme, "Bearer") {
		if c, found := g.o.Tokens.lookup(strings.TrimSpace(token)); found {
			return c, true
		}
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="durallm gateway"`)
	writeError(w, &apiError{Status: http.StatusUnauthorized, Type: typeInvalidRequest, Code: codeInvalidAPIKey,
		Message: "missing or unknown API key: send Authorization: Bearer <token> with a token of the gateway's tokens file"})
	return Caller{}, false
}

// acquire takes one of the caller's in-flight places; release gives it
// back.
func (g *Gateway) acquire(c Caller) (release func(), ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c.MaxInFlight > 0 && g.inFlight[c.ID] >= c.MaxInFlight {
		return nil, false
	}
	g.inFlight[c.ID]++
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.inFlight[c.ID]--; g.inFlight[c.ID] <= 0 {
				delete(g.inFlight, c.ID)
			}
		})
	}, true
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

// models answers GET /v1/models: the models the caller may use.
func (g *Gateway) models(w http.ResponseWriter, c Caller) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	out := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	for _, m := range g.o.Models.Models {
		if c.mayUse(m.Name) {
			out.Data = append(out.Data, model{ID: m.Name, Object: "model", OwnedBy: "durallm"})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// statusRecorder remembers the status written, for the request log.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

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

// chat answers POST /v1/chat/completions.
func (g *Gateway) chat(w http.ResponseWriter, r *http.Request, caller Caller, ri *requestInfo) {
	body, err := io.ReadAll(io.LimitReader(r.Body, g.o.MaxBody+1))
	if err != nil {
		writeError(w, badRequest("", "the request body could not be read"))
		return
	}
	if int64(len(body)) > g.o.MaxBody {
		writeError(w, &apiError{Status: http.StatusRequestEntityTooLarge, Type: typeInvalidRequest, Code: codeRequestTooLarge,
			Message: fmt.Sprintf("the request body is over %d bytes", g.o.MaxBody)})
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
	sess, aerr := g.startOrAttach(r.Context(), id, m.input(cr.Request), memo, m)
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
				writeError(w, awaitingError(s.who.ID, st.AwaitingAttempt))
				return
			}
			poll.Reset(wt.nextPoll())
		case <-limit.C:
			w.Header().Set("X-Durallm-State", "running")
			writeError(w, &apiError{Status: http.StatusConflict, Type: typeInProgress, Code: codeStillRunning,
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
		writeError(w, g.waitError(s, d.err))
		return
	}
	res := d.res
	w.Header().Set("X-Durallm-State", string(res.State))
	o := outcomeOf(res)
	if o.Err != nil {
		writeError(w, o.Err)
		return
	}
	if o.Incomplete != "" {
		w.Header().Set("X-Durallm-Incomplete", o.Incomplete)
	}
	resp := res.Response
	if resp == nil {
		resp = emptyResponse()
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(completionJSON(s.who, resp))
}

// waitError is the answer when the wait itself failed.
func (g *Gateway) waitError(s *session, err error) *apiError {
	if errors.Is(err, durallm.ErrInvalidInput) {
		return badRequest("", err.Error())
	}
	g.log.Warn("gateway: waiting for the action failed", "action_id", s.who.ID, "error", err)
	return &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: codeTemporalUnreachable,
		Message: "the action started but its result could not be read: GET /v1/actions/" + s.who.ID + " later"}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, &apiError{Status: http.StatusInternalServerError, Type: typeServer, Message: "encode the answer"})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
