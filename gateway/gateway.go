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
	"github.com/durallm/durallm/resultstore"
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
	DefaultMaxBody    = resultstore.DefaultMaxBytes
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
