package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/activities"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/gateway/callerbudget"
	"github.com/durallm/durallm/gateway/chat"
	"github.com/durallm/durallm/gateway/messages"
	"github.com/durallm/durallm/gateway/responses"
	"github.com/durallm/durallm/resultstore"
)

// Options configures a Gateway. Zero values take the defaults named on
// each field.
type Options struct {
	// Client starts and steers the actions. Required. Give it the data
	// converter its Temporal client was dialed with (WithDataConverter)
	// when payloads are encrypted, the result store (WithResults), and
	// the namespace (WithNamespace), which deleting a response needs.
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
	// MaxBody bounds a request body: a larger one is a 413
	// request_too_large, answered from its Content-Length before it is
	// read, or once MaxBody+1 bytes were. Zero means DefaultMaxBody (32
	// MiB, what the result store keeps by default: a request over the
	// store's limit is the same 413 once parsed).
	MaxBody int64
	// StatePoll is how soon a wait first checks whether its action has
	// gone to awaiting_reconciliation (which has no result to wait for);
	// the interval doubles to 4s. Zero means 250ms.
	StatePoll time.Duration
	// StartTimeout bounds the start of an action (all its tries) before
	// the answer is a 503. Zero means 10s.
	StartTimeout time.Duration
	// WriteTimeout bounds each write to a caller: a caller that stops
	// reading is taken for gone once one write has waited this long (a
	// stream's keep-alives make one at least every KeepAlive), its
	// request ends and its max_in_flight place is free. Zero means 30s.
	WriteTimeout time.Duration
	// BodyTimeout bounds the reading of a request's body, which happens
	// after the caller's max_in_flight place is taken: a body that has
	// not arrived in time is a 408. Zero means 30s.
	BodyTimeout time.Duration
	// Spend keeps the callers' budgets (Caller.Budget; package
	// gateway/callerbudget): required when a caller has one. The gateway
	// does not close it. Nil means none.
	Spend callerbudget.Store
	// Routes describe the models' routes (their kind, prices and
	// image_tokens) for the worst case a caller's budget reserves; a route
	// missing here counts as an openai route without prices. Nil means
	// none.
	Routes map[string]attempt.RouteInfo
	// SpendSweep is how often the gateway settles holds of actions that
	// ended while no gateway watched them, looking at holds two sweeps
	// old. Zero means DefaultSpendSweep.
	SpendSweep time.Duration
	// Surfaces are the front doors served beside OpenAI chat completions
	// (package gateway/chat), OpenAI's Responses (package
	// gateway/responses) and Anthropic's Messages (package
	// gateway/messages), which are always served; the action endpoints
	// answer in chat's shape, the models endpoints in the shape of the
	// surface whose clients sent the request (answer.Claimant), else
	// chat's. Nil means none.
	Surfaces []answer.Surface
}

// Gateway is the OpenAI-compatible front door, an http.Handler. It is safe
// for concurrent use.
type Gateway struct {
	o   Options
	c   *durallm.Client
	log *slog.Logger
	// chat is the surface of the core's own endpoints; surfaces are all
	// served, chat first; endpoints is the route table.
	chat      answer.Surface
	surfaces  []answer.Surface
	endpoints []endpoint

	mu       sync.Mutex
	inFlight map[string]int // by caller id
	// attached counts the requests of this process attached to each
	// running action; departed holds, for an action that none is attached
	// to, the last departure whose grace runs, so that only the grace of
	// the last caller to leave may cancel it.
	attached map[string]int
	departed map[string]*departure

	requests   metric.Int64Counter
	idempotent metric.Int64Counter
	keyless    metric.Int64Counter
	// keylessRetries counts requests without a key that an SDK marked as
	// retries (X-Stainless-Retry-Count > 0): each one is a new generation.
	keylessRetries atomic.Int64

	// spend is the callers' budgets; nil without Options.Spend.
	spend *spending
}

// Defaults of Options.
const (
	DefaultStreamHold = 10 * time.Second
	DefaultKeepAlive  = 15 * time.Second
	DefaultMaxBody    = resultstore.DefaultMaxBytes
	// DefaultWriteTimeout is twice the keep-alive interval.
	DefaultWriteTimeout = 30 * time.Second
	DefaultBodyTimeout  = 30 * time.Second
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
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.BodyTimeout <= 0 {
		o.BodyTimeout = DefaultBodyTimeout
	}
	g := &Gateway{o: o, c: o.Client, log: o.Logger, inFlight: map[string]int{}, attached: map[string]int{}, departed: map[string]*departure{}, chat: chat.Surface{}}
	g.surfaces = append([]answer.Surface{g.chat, responses.Surface{}, messages.Surface{}}, o.Surfaces...)
	g.endpoints = g.routes()
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
	var err error
	if g.spend, err = newSpending(g); err != nil {
		return nil, err
	}
	return g, nil
}

// KeylessRetries is how many requests without an Idempotency-Key were an
// SDK's retries (X-Stainless-Retry-Count > 0), each a new generation.
func (g *Gateway) KeylessRetries() int64 { return g.keylessRetries.Load() }

// ServeHTTP routes the request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &statusRecorder{ResponseWriter: w, rc: http.NewResponseController(w), timeout: g.o.WriteTimeout}
	var ri requestInfo
	g.serve(rec, r, &ri)
	// What the server itself still writes (the end of a chunked body) is
	// bounded too.
	rec.bound()
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

// call is one request on its way through the core: the endpoint it
// reached, the surface whose wire format answers it, its caller once
// authenticated, and the action id the path names.
type call struct {
	surface answer.Surface
	caller  Caller
	id      string
	ri      *requestInfo
}

// endpoint is one route of the gateway: a surface's or the core's own.
type endpoint struct {
	method string
	// path is the pattern: exact, or with one "{id}" segment.
	path    string
	surface answer.Surface
	serve   func(w http.ResponseWriter, r *http.Request, c *call)
	// shared: every API has it, and it answers in the shape of the
	// surface whose clients sent the request (claimant).
	shared bool
}

// routes builds the route table: the surfaces' routes, then the core's
// own (the models and the action endpoints, in the chat surface's shape).
func (g *Gateway) routes() []endpoint {
	var out []endpoint
	for _, s := range g.surfaces {
		rts := s.Routes()
		if st, ok := s.(answer.Stored); ok {
			rts = append(rts, st.StoredRoutes()...)
		}
		for _, rt := range rts {
			e := endpoint{method: rt.Method, path: rt.Path, surface: s}
			switch rt.Op {
			case answer.Start:
				e.serve = g.start
			case answer.Read:
				e.serve = g.read
			case answer.Cancel, answer.Delete, answer.Items:
				if _, ok := s.(answer.Stored); !ok {
					// Only a stored surface has these answers.
					continue
				}
				e.serve = map[answer.Op]func(http.ResponseWriter, *http.Request, *call){
					answer.Cancel: g.cancelStored, answer.Delete: g.deleteStored, answer.Items: g.items}[rt.Op]
			case answer.Unserved:
				if rt.Problem == nil {
					continue
				}
				p := *rt.Problem
				e.serve = func(w http.ResponseWriter, _ *http.Request, c *call) { writeProblem(w, c.surface, &p) }
			default:
				continue
			}
			out = append(out, e)
		}
	}
	return append(out,
		endpoint{method: http.MethodGet, path: "/v1/models", surface: g.chat, serve: g.models, shared: true},
		endpoint{method: http.MethodGet, path: "/v1/models/{id}", surface: g.chat, serve: g.model, shared: true},
		endpoint{method: http.MethodGet, path: "/v1/actions", surface: g.chat, serve: g.list},
		endpoint{method: http.MethodGet, path: "/v1/actions/{id}", surface: g.chat, serve: g.getAction},
		endpoint{method: http.MethodPost, path: "/v1/actions/{id}/cancel", surface: g.chat, serve: g.cancel},
		endpoint{method: http.MethodPost, path: "/v1/actions/{id}/reconcile", surface: g.chat, serve: g.reconcile},
	)
}

// match reports whether path fits the pattern, and the {id} it names.
func match(pattern, path string) (id string, ok bool) {
	ps, xs := strings.Split(pattern, "/"), strings.Split(path, "/")
	if len(ps) != len(xs) {
		return "", false
	}
	for i, p := range ps {
		if p == "{id}" {
			v, err := url.PathUnescape(xs[i])
			if err != nil || v == "" {
				return "", false
			}
			id = v
			continue
		}
		if p != xs[i] {
			return "", false
		}
	}
	return id, true
}

func (g *Gateway) serve(w http.ResponseWriter, r *http.Request, ri *requestInfo) {
	path := r.URL.EscapedPath()
	var allow []string
	for _, e := range g.endpoints {
		id, ok := match(e.path, path)
		if !ok {
			continue
		}
		if r.Method != e.method {
			allow = append(allow, e.method)
			continue
		}
		// The id is caller input: the request's log line names it only
		// once it names an action the caller may see (owned).
		ri.endpoint = e.path
		c := &call{surface: e.surface, id: id, ri: ri}
		if e.shared {
			c.surface = g.claimant(r, e.surface)
		}
		if !g.authenticate(w, r, c) {
			return
		}
		e.serve(w, r, c)
		return
	}
	ri.endpoint = "other"
	surf := g.claimant(r, g.chat)
	if len(allow) > 0 {
		writeProblem(w, surf, &answer.Problem{Kind: answer.MethodNotAllowed, Allow: strings.Join(allow, ", "), Message: "use " + strings.Join(allow, " or ")})
		return
	}
	msg := "durallm's gateway serves " + g.served() + ", /v1/models and /v1/actions"
	writeProblem(w, surf, &answer.Problem{Kind: answer.NotFound, Code: "unsupported_endpoint", Message: msg})
}

// claimant is the surface whose clients sent r, for an answer every API
// shares: the first answer.Claimant that claims it, else def.
func (g *Gateway) claimant(r *http.Request, def answer.Surface) answer.Surface {
	for _, s := range g.surfaces {
		if cl, ok := s.(answer.Claimant); ok && cl.Claims(r) {
			return s
		}
	}
	return def
}

// served names the surfaces' start endpoints.
func (g *Gateway) served() string {
	var paths []string
	for _, s := range g.surfaces {
		for _, rt := range s.Routes() {
			if rt.Op == answer.Start {
				paths = append(paths, rt.Path)
			}
		}
	}
	return strings.Join(paths, ", ")
}

// listedModel is a model as OpenAI lists it.
type listedModel struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func listed(name string) listedModel {
	return listedModel{ID: name, Object: "model", OwnedBy: "durallm"}
}

// models answers GET /v1/models: the models the caller may use, in the
// shape of the surface whose clients asked.
func (g *Gateway) models(w http.ResponseWriter, _ *http.Request, c *call) {
	var names []string
	for _, m := range g.o.Models.Models {
		if c.caller.mayUse(m.Name) {
			names = append(names, m.Name)
		}
	}
	if cl, ok := c.surface.(answer.Claimant); ok {
		writeBody(w, cl.Models(names))
		return
	}
	out := struct {
		Object string        `json:"object"`
		Data   []listedModel `json:"data"`
	}{Object: "list", Data: []listedModel{}}
	for _, n := range names {
		out.Data = append(out.Data, listed(n))
	}
	writeJSON(w, http.StatusOK, out)
}

// model answers GET /v1/models/{id}: the model, if the caller may use it.
func (g *Gateway) model(w http.ResponseWriter, _ *http.Request, c *call) {
	m, ok := g.o.Models.Lookup(c.id)
	if !ok || !c.caller.mayUse(m.Name) {
		writeProblem(w, c.surface, modelNotFound())
		return
	}
	if cl, ok := c.surface.(answer.Claimant); ok {
		writeBody(w, cl.Model(m.Name))
		return
	}
	writeJSON(w, http.StatusOK, listed(m.Name))
}

// statusRecorder remembers the status written, for the request log, and
// bounds every write (Options.WriteTimeout).
type statusRecorder struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	status  int
}

// bound sets the connection's write deadline for the next write and the
// flush that follows it. A writer without deadlines (a test's recorder)
// is left as it is.
func (s *statusRecorder) bound() {
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
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
	s.bound()
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
