// Package worker wires durallm into a Temporal worker: one recovery engine
// shared by every attempt, the configured routes, the LLMAction workflow
// and its activities, and a graceful stop.
package worker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/providers/routes"

	"go.temporal.io/sdk/client"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm/activities"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/workflows"
)

// Options configures a Worker. Zero values take the defaults named on each
// field.
type Options struct {
	// TaskQueue is polled for actions and attempts. Empty means "durallm".
	TaskQueue string
	// Config holds the routes (and their keys' sources). Required, and
	// validated in full at New.
	Config routes.Config
	// TLS, when set, replaces the system roots for provider connections
	// (tests use the providertest provider's). Verification stays on unless a
	// route sets insecure_skip_verify, which logs a warning.
	TLS *tls.Config
	// AllowH2C makes http:// routes whose http_version is auto speak
	// cleartext HTTP/2 with prior knowledge (h2c) instead of HTTP/1.1. A
	// route with http_version "2" speaks h2c whatever it says. Default
	// false: http:// speaks HTTP/1.1, as local model servers do.
	AllowH2C bool
	// Reconciler is asked about ambiguous attempts before a person is.
	// Nil means none.
	Reconciler activities.Reconciler
	// Streams receives streamed deltas for in-process subscribers. Nil means
	// a fresh registry (see Worker.Streams).
	Streams *activities.Streams
	// SearchAttributes says the namespace has DurallmState, DurallmOutcome
	// and DurallmRoute registered (Keyword); only then are they written.
	SearchAttributes bool
	// MaxConcurrentAttempts bounds CallModel executions in this worker.
	// Zero means 256.
	MaxConcurrentAttempts int
	// StopTimeout bounds a graceful stop: in-flight attempts get most of
	// it to finish (all but a quarter, at most 2s); one still running then
	// ends itself with its evidence and reports its outcome (a committed
	// partial keeps its text) before the SDK cancels what is left. Zero
	// means 10s.
	StopTimeout time.Duration
	// Logger receives worker events and the per-attempt "llm.attempt"
	// events. Nil means slog.Default(). The Temporal SDK logs through the
	// client's logger instead: dial it with telemetry.TemporalLogger, or
	// the SDK logs the result of an activity that returned after its
	// deadline, generated text included.
	Logger *slog.Logger
	// Results keeps responses too large for history (over
	// LargeResponseBytes, default 256 KiB) by reference. Nil means they
	// travel inline. Clients resolve references with the same store
	// (durallm.Client.WithResults). A store whose results can expire
	// (resultstore.Expirable: Dir, pgstore.Store) has each stored for its
	// action and is swept by the worker: see ResultRetention.
	Results resultstore.Store
	// ResultRetention is how long a stored result is kept after the last
	// action it was stored for closed (resultstore.Sweeper); results of
	// running actions are kept. Zero means resultstore.DefaultRetention
	// (7 days); negative means the worker does not sweep them.
	ResultRetention time.Duration
	// LargeResponseBytes overrides the threshold for Results.
	LargeResponseBytes int
	// Telemetry records the project's metrics. Nil means none. For the
	// Temporal SDK's own metrics, give the client
	// Telemetry.TemporalMetricsHandler() when dialing it.
	Telemetry *telemetry.Telemetry
	// ProbeRoutes checks, at Start, what each route's server speaks
	// (recovery.Engine.Probe: a TLS handshake or the HTTP/2 preface, never
	// a request) and logs it, warning about a route whose http_version
	// does not match its server, with the fix. At most 2s. Default false;
	// durallm worker and dev turn it on.
	ProbeRoutes bool
	// MetricsAddr, when set (e.g. "127.0.0.1:9090"), serves /metrics,
	// /healthz and /readyz there: counters and health, never content. It
	// needs Telemetry.
	MetricsAddr string
	// StreamAddr, when set (e.g. "127.0.0.1:9091"), serves each action's
	// streamed deltas, the generated text itself, as server-sent events
	// at /v1/streams/{action id}. Empty means off. A StreamAddr that is
	// not loopback needs a StreamToken: New refuses it otherwise, since
	// anyone who can reach it could read any action's answer by its id.
	StreamAddr string
	// StreamToken, when set, is the bearer token /v1/streams/ requires.
	StreamToken string
	// StreamURL is where other processes reach StreamAddr
	// ("http://host:port"), which the worker advertises in its Temporal
	// identity (attempt.StreamIdentity, recorded when an attempt starts)
	// and in streamed attempts' heartbeats (attempt.Progress.StreamURL),
	// so a gateway in another process finds their streams. Empty means http:// and StreamAddr's
	// address once listening, unless its host is unspecified (0.0.0.0,
	// ::), which is advertised only through an explicit StreamURL; "-"
	// means advertise nothing.
	StreamURL string
	// Journal is the attempt journal: each attempt's end is written to it
	// before it is reported, and the built-in reconciler reads it first
	// for every ambiguous attempt (package journal). Every worker of the
	// task queue must share it. Nil means none. A journal that can expire
	// its entries (journal.Expirable: Dir, Postgres) is swept by the
	// worker: see JournalRetention.
	Journal journal.Journal
	// JournalRetention is how long a journal entry is kept after its
	// action closed (journal.Sweeper); entries of running actions are
	// kept. Zero means journal.DefaultRetention (7 days); negative means
	// the worker does not sweep.
	JournalRetention time.Duration
	// JournalSweepEvery is how often the worker sweeps the journal and the
	// result store, the first time at Start. Zero means
	// DefaultJournalSweepEvery (1h).
	JournalSweepEvery time.Duration
	// WorkflowPollers and ActivityPollers set the Temporal SDK's poller
	// counts. Zero means the SDK's defaults (2 each).
	WorkflowPollers, ActivityPollers int
	// DisableEagerActivities turns off eager activity dispatch (the
	// server handing a just-scheduled activity back to this worker with
	// the workflow task's answer). Default false: eager on.
	DisableEagerActivities bool
}

// Worker is a running durallm worker.
type Worker struct {
	tw     sdkworker.Worker // made by Start
	twOpts sdkworker.Options
	tqueue string
	tc     client.Client
	engine *recovery.Engine
	acts   *activities.Activities
	log    *slog.Logger
	stop   time.Duration
	tel    *telemetry.Telemetry
	addr   string
	http   *http.Server
	// streamAddr serves /v1/streams/ (generated text), apart from the
	// metrics; streamToken guards it.
	streamAddr  string
	streamHTTP  *http.Server
	streamToken string
	streamURL   string
	names       []string // the configured routes, for the start log
	routes      routes.Config
	probe       bool
	started     atomic.Bool
	// sweepers expire journal entries and stored results while the worker
	// runs; none when neither can expire or sweeping is off.
	sweepers   []sweeper
	sweepEvery time.Duration
	stopSweep  context.CancelFunc
	sweepDone  chan struct{}
}

// New validates the configuration (every problem at once) and builds a
// worker on c. Start it with Start or Run.
func New(c client.Client, o Options) (*Worker, error) {
	if o.MetricsAddr != "" && o.Telemetry == nil {
		return nil, errors.New("durallm worker: MetricsAddr needs Telemetry")
	}
	if err := checkStreamAddr(o.StreamAddr, o.StreamToken); err != nil {
		return nil, err
	}
	if err := o.Config.Validate(); err != nil {
		return nil, fmt.Errorf("durallm worker: invalid routes config:\n%w", err)
	}
	if o.TaskQueue == "" {
		o.TaskQueue = attempt.DefaultTaskQueue
	}
	if o.MaxConcurrentAttempts <= 0 {
		o.MaxConcurrentAttempts = 256
	}
	if o.StopTimeout <= 0 {
		o.StopTimeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Streams == nil {
		o.Streams = activities.NewStreams()
	}
	routes := o.Config.RouteMap()
	insecure := false
	for _, r := range o.Config.Routes {
		if r.InsecureSkipVerify {
			insecure = true
			o.Logger.Warn("TLS verification is OFF for a route: its provider's identity is not checked", "route", r.Name)
		}
	}
	engine := recovery.New(recovery.Config{TLSClientConfig: o.TLS, AllowH2C: o.AllowH2C, Logger: o.Logger})
	acts := &activities.Activities{
		Engine: engine, Routes: routes, Reconciler: o.Reconciler, Journal: o.Journal, Streams: o.Streams,
		SearchAttributes: o.SearchAttributes, Logger: o.Logger, Telemetry: o.Telemetry,
		Results: o.Results, LargeResponseBytes: o.LargeResponseBytes,
		// Attempts still running near the end of the stop timeout end
		// themselves and report while the worker still can.
		StopGrace: o.StopTimeout - min(o.StopTimeout/4, 2*time.Second),
	}
	if o.Telemetry != nil {
		o.Telemetry.WatchEngine(engine)
	}
	if insecure {
		// Only routes that opted out use this engine; the others keep
		// verifying on the shared one.
		cfg := &tls.Config{InsecureSkipVerify: true} // #nosec G402 -- explicit per-route opt-out, logged above
		acts.InsecureEngine = recovery.New(recovery.Config{TLSClientConfig: cfg, AllowH2C: o.AllowH2C, Logger: o.Logger})
		if o.Telemetry != nil {
			o.Telemetry.WatchEngine(acts.InsecureEngine)
		}
	}
	// The SDK worker is made at Start, once the stream endpoint's address
	// is known: its identity carries the address (attempt.StreamIdentity).
	two := sdkworker.Options{
		MaxConcurrentActivityExecutionSize: o.MaxConcurrentAttempts,
		// Cancellation reaches a running attempt with its next heartbeat
		// response; a short throttle keeps that within about a second.
		MaxHeartbeatThrottleInterval:     500 * time.Millisecond,
		WorkerStopTimeout:                o.StopTimeout,
		MaxConcurrentWorkflowTaskPollers: o.WorkflowPollers,
		MaxConcurrentActivityTaskPollers: o.ActivityPollers,
		DisableEagerActivities:           o.DisableEagerActivities,
	}
	w := &Worker{tqueue: o.TaskQueue, twOpts: two, tc: c, engine: engine, acts: acts, log: o.Logger, stop: o.StopTimeout, tel: o.Telemetry, addr: o.MetricsAddr, streamAddr: o.StreamAddr, streamToken: o.StreamToken, streamURL: o.StreamURL, names: o.Config.Names(), routes: o.Config, probe: o.ProbeRoutes}
	if ex, ok := o.Journal.(journal.Expirable); ok && o.JournalRetention >= 0 {
		w.sweepers = append(w.sweepers, &journal.Sweeper{Journal: ex, Actions: TemporalActions(c), Retention: o.JournalRetention, Logger: o.Logger})
	}
	if ex, ok := o.Results.(resultstore.Expirable); ok && o.ResultRetention >= 0 {
		w.sweepers = append(w.sweepers, &resultstore.Sweeper{Store: ex, Actions: TemporalActions(c), Retention: o.ResultRetention, Logger: o.Logger})
	}
	w.sweepEvery = o.JournalSweepEvery
	if w.sweepEvery <= 0 {
		w.sweepEvery = DefaultJournalSweepEvery
	}
	return w, nil
}

// Register registers the LLMAction workflow and acts' activities on r.
// Use it to host durallm in a worker of your own, with
// r.RegisterActivity(&Calls{Client: c}) for package step's
// calls that reach an existing action. The workflow emits each
// attempt's "llm.attempt" event to acts.Logger (slog.Default() when nil),
// once it has decided what follows the attempt.
func Register(r sdkworker.Registry, acts *activities.Activities) {
	r.RegisterWorkflowWithOptions(workflows.New(workflows.Options{Events: acts.Logger}), workflow.RegisterOptions{Name: workflows.WorkflowName})
	r.RegisterActivity(acts)
}

// MetricsAddr is where /metrics is served ("" when not), with the port
// resolved once started.
func (w *Worker) MetricsAddr() string { return w.addr }

// StreamAddr is where /v1/streams/ is served ("" when not), with the port
// resolved once started.
func (w *Worker) StreamAddr() string { return w.streamAddr }

// advertisedStreamURL is the stream URL attempts advertise
// (Options.StreamURL): the explicit one, or http:// and the listening
// address when its host is a specific one.
func advertisedStreamURL(explicit string, addr net.Addr) string {
	switch explicit {
	case "-":
		return ""
	case "":
		tcp, ok := addr.(*net.TCPAddr)
		if !ok || tcp.IP.IsUnspecified() {
			return ""
		}
		return "http://" + tcp.String()
	}
	return strings.TrimSuffix(explicit, "/")
}

// StreamURL is the stream URL this worker's attempts advertise ("" when
// none), once started.
func (w *Worker) StreamURL() string { return w.acts.StreamURL }

// checkStreamAddr refuses a stream endpoint that would serve generated
// text beyond loopback without a token.
func checkStreamAddr(addr, token string) error {
	if addr == "" || token != "" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("durallm worker: stream address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("durallm worker: the stream endpoint serves generated text and %s is not a loopback address: "+
		"set a stream token (StreamToken, or DURALLM_STREAM_TOKEN for durallm worker) or listen on 127.0.0.1", addr)
}

// serve runs h on ln until Stop.
func (w *Worker) serve(ln net.Listener, h http.Handler, what string) *http.Server {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			w.log.Error(what+" stopped", "error", err)
		}
	}()
	return srv
}

// stopHTTP shuts both endpoints down, each within a bound.
func (w *Worker) stopHTTP() {
	for _, srv := range []*http.Server{w.http, w.streamHTTP} {
		if srv == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = srv.Shutdown(ctx)
		cancel()
	}
}

// ready reports whether the worker polls and its Temporal server answers.
func (w *Worker) ready(ctx context.Context) error {
	if !w.started.Load() {
		return errors.New("worker not started")
	}
	if _, err := w.tc.CheckHealth(ctx, &client.CheckHealthRequest{}); err != nil {
		return fmt.Errorf("temporal server: %w", err)
	}
	return nil
}

// Streams returns the registry streamed deltas are published to.
func (w *Worker) Streams() *activities.Streams { return w.acts.Streams }

// Engine returns the worker's recovery engine (for its Stats).
func (w *Worker) Engine() *recovery.Engine { return w.engine }

// Start starts polling. It returns at once.
func (w *Worker) Start() error {
	if w.addr != "" {
		ln, err := net.Listen("tcp", w.addr)
		if err != nil {
			return fmt.Errorf("durallm worker: metrics endpoint on %s: %w", w.addr, err)
		}
		w.addr = ln.Addr().String()
		w.http = w.serve(ln, w.tel.Handler(w.ready), "metrics endpoint")
		w.log.Info("serving /metrics, /healthz and /readyz", "addr", w.addr)
	}
	if w.streamAddr != "" {
		ln, err := net.Listen("tcp", w.streamAddr)
		if err != nil {
			w.stopHTTP()
			return fmt.Errorf("durallm worker: stream endpoint on %s: %w", w.streamAddr, err)
		}
		w.streamAddr = ln.Addr().String()
		mux := http.NewServeMux()
		mux.Handle("/v1/streams/", w.acts.Streams.StreamHandler(activities.StreamHandlerOptions{AuthToken: w.streamToken}))
		w.streamHTTP = w.serve(ln, mux, "stream endpoint")
		w.acts.StreamURL = advertisedStreamURL(w.streamURL, ln.Addr())
		w.log.Info("serving /v1/streams/", "addr", w.streamAddr, "token", w.streamToken != "", "advertised", w.acts.StreamURL)
	}
	if w.probe {
		w.probeRoutes()
	}
	o := w.twOpts
	if w.acts.StreamURL != "" {
		host, _ := os.Hostname()
		o.Identity = attempt.StreamIdentity(fmt.Sprintf("%d@%s@%s", os.Getpid(), host, w.tqueue), w.acts.StreamURL)
	}
	w.tw = sdkworker.New(w.tc, w.tqueue, o)
	Register(w.tw, w.acts)
	// Package step reaches the actions its calling run did not start
	// itself (a later run of the same workflow, step.Attach) through
	// these, with this worker's client.
	w.tw.RegisterActivity(&Calls{Client: w.tc})
	if err := w.tw.Start(); err != nil {
		return fmt.Errorf("durallm worker: start: %w", err)
	}
	w.started.Store(true)
	if len(w.sweepers) > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		w.stopSweep, w.sweepDone = cancel, make(chan struct{})
		var wg sync.WaitGroup
		for _, s := range w.sweepers {
			wg.Go(func() { s.Run(ctx, w.sweepEvery) })
		}
		go func() {
			wg.Wait()
			close(w.sweepDone)
		}()
	}
	w.log.Info("durallm worker started", "routes", w.names)
	return nil
}

// probeRoutes logs what each route's server speaks (Options.ProbeRoutes),
// all routes at once, within 2s. Before any attempt, so an auto route
// that meets an HTTP/1.1 server over h2c already knows.
func (w *Worker) probeRoutes() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, r := range w.routes.Routes {
		engine := w.engine
		if r.InsecureSkipVerify && w.acts.InsecureEngine != nil {
			engine = w.acts.InsecureEngine
		}
		v, _ := recovery.ParseHTTPVersion(r.HTTPVersion) // validated in New
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := engine.Probe(ctx, r.BaseURL, v)
			switch {
			case err != nil:
				w.log.Warn("route probe: server not reached at start", "route", r.Name, "error", err)
			case p.Mismatch != "":
				w.log.Warn("route probe: the route's http_version does not match its server; its attempts will be unsent", "route", r.Name, "http_version", string(v), "server_speaks", p.Mismatch, "fix", p.Fix())
			default:
				w.log.Info("route probe", "route", r.Name, "http_version", string(v), "speaks", p.Speaks, "checked", p.Checked)
			}
		}()
	}
	wg.Wait()
}

// Stop stops taking new work, gives in-flight attempts up to StopTimeout
// to finish (after which they are canceled), and closes the engine's
// connections.
func (w *Worker) Stop() {
	w.log.Info("durallm worker stopping: no new attempts; in-flight attempts get a bounded grace", "grace", w.stop)
	w.started.Store(false)
	if w.stopSweep != nil {
		w.stopSweep()
		<-w.sweepDone
	}
	if w.tw != nil {
		w.tw.Stop()
	}
	w.stopHTTP()
	w.engine.Close()
	if w.acts.InsecureEngine != nil {
		w.acts.InsecureEngine.Close()
	}
	w.log.Info("durallm worker stopped")
}

// Run starts the worker and blocks until ctx ends, then stops it
// gracefully.
func (w *Worker) Run(ctx context.Context) error {
	if err := w.Start(); err != nil {
		return err
	}
	<-ctx.Done()
	w.Stop()
	if errors.Is(context.Cause(ctx), context.Canceled) {
		return nil
	}
	return context.Cause(ctx)
}
