// Package chaos runs LLM actions through a real HTTP/2 proxy (haproxy,
// HTTP/2 on both sides) that is gracefully reloaded while they run, and
// checks the contract's invariants from the provider's records and the
// actions' results, optionally with a worker process killed, the server
// restarted or faults injected by the provider behind the proxy.
// 'durallm chaos' is its command; scripts/chaos installs haproxy and runs
// it.
package chaos

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"golang.org/x/net/http2"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/internal/chaos/report"
	"github.com/durallm/durallm/internal/devserver"
	"github.com/durallm/durallm/internal/haproxy"
	"github.com/durallm/durallm/internal/tick"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

// Report is what a run found (package report: its invariants and tables
// need no Temporal server, so they are tested under the race detector).
type Report = report.Report

// Options bound a run. Zero values take the defaults named on each field.
type Options struct {
	// Actions to run. Default 500.
	Actions int
	// Concurrency of callers. Default 32.
	Concurrency int
	// ReloadEvery is the interval between graceful haproxy reloads.
	// Default 2s.
	ReloadEvery time.Duration
	// Timeout bounds the whole run. Default 10m.
	Timeout time.Duration
	// HAProxy is the haproxy binary. Default "haproxy" on PATH.
	HAProxy string
	// Dir holds the embedded server's data and haproxy's files; default a
	// fresh temporary directory, removed afterwards.
	Dir string
	// Progress receives one line per phase and a periodic count.
	Progress io.Writer
	// KillWorker runs a second worker as a separate process ('durallm
	// worker', from this executable), SIGKILLs it when half the actions
	// have started and starts it again a second later. Its in-flight
	// attempts must end ambiguous, never silently retried.
	KillWorker bool
	// RestartServer stops the embedded Temporal server when three
	// quarters of the actions have started and starts it again over the
	// same data directory and port; actions must resume and finish.
	RestartServer bool
	// Faults is the fraction of requests (0 to 1) the provider behind the
	// proxy answers with a fault instead of an answer: 429, 503, 500, 400,
	// 421, 504, a 2xx with no choices, REFUSED_STREAM, a reset after
	// executing, a connection closed after reading, or a GOAWAY above the
	// request's stream or right after running it (see faultMix). The
	// choice is a hash of the attempt id, so a run is reproducible in
	// kind if not in timing. Default 0: no faults.
	Faults float64
	// Stream makes every action a streamed one (server-sent events), with
	// a 1s idle timeout on the route; with Faults, stream faults join the
	// mix: a stall and a reset after two chunks of content, a connection
	// closed after two chunks, and a reset after the headers before any
	// content. A stream that showed content must end completed_partial
	// with its text, never restarted. Default false.
	Stream bool
	// ProviderRecord gives the route (on every worker) a provider record,
	// stored_completions with the default settle window: the provider
	// keeps what it generates, and the built-in reconciler settles an
	// attempt whose answer no worker saw from it. Default false.
	ProviderRecord bool
}

// Run starts the embedded server, the providertest provider, haproxy in front
// of it and a durallm worker whose route goes through haproxy; runs the
// actions while reloading haproxy; then checks the invariants.
func Run(ctx context.Context, o Options) (*Report, error) {
	o = o.withDefaults()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	if o.Dir == "" {
		dir, err := os.MkdirTemp("", "durallm-chaos-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		o.Dir = dir
	}
	start := time.Now()
	r, err := setUp(ctx, o)
	defer r.tearDown()
	if err != nil {
		return nil, err
	}
	rep := report.New(o.Actions)
	results, errs, err := r.drive(ctx, o, rep)
	if err != nil {
		return nil, err
	}
	rep.Elapsed = time.Since(start)
	rep.ProviderRun = len(r.p.Processed())
	for i, res := range results {
		rep.Add(r.p, r.journal, actionID(i), res, errs[i], o.Faults > 0)
	}
	rep.AddFaults(r.p, DefaultBehavior)
	st := r.w.Engine().Stats()
	rep.GoAways, rep.Conns = st.GoAways, st.ConnsOpened
	if n := st.TransportReplays; n > 0 {
		rep.Violations = append(rep.Violations, fmt.Sprintf("%d hidden transport replays", n))
	}
	return rep, nil
}

func (o Options) withDefaults() Options {
	if o.Actions <= 0 {
		o.Actions = 500
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 32
	}
	if o.ReloadEvery <= 0 {
		o.ReloadEvery = 2 * time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Minute
	}
	if o.HAProxy == "" {
		o.HAProxy = "haproxy"
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return o
}

// rig is what a run drives: the embedded server, the provider, haproxy
// in front of it, the in-process worker, the client and, with KillWorker,
// the worker process to kill.
type rig struct {
	say     func(format string, a ...any)
	srv     *devserver.Server
	srvOpts devserver.Options
	p       *providertest.Provider
	hp      *haproxy.Proxy
	tc      client.Client
	w       *worker.Worker
	c       *durallm.Client
	killer  *workerProc
	journal journal.Journal
	undo    []func()
}

// setUp starts everything; tearDown stops what it started, in reverse,
// whether or not setUp got to the end.
func setUp(ctx context.Context, o Options) (*rig, error) {
	r := &rig{say: func(format string, a ...any) { fmt.Fprintf(o.Progress, format+"\n", a...) }}
	r.say("· starting the embedded Temporal server")
	r.srvOpts = devserver.Options{
		DataDir: filepath.Join(o.Dir, "data"), FrontendPort: devserver.FreePort, DisableUI: true,
		SearchAttributes: workflows.SearchAttributes, Logger: slog.New(slog.DiscardHandler),
	}
	srv, err := devserver.Start(ctx, r.srvOpts)
	if err != nil {
		return r, fmt.Errorf("chaos: server: %w", err)
	}
	r.srv = srv
	r.undo = append(r.undo, func() { r.srv.Stop() })
	// A restart must come back on the same port: clients and workers keep
	// their address and reconnect.
	_, portText, _ := net.SplitHostPort(srv.FrontendHostPort())
	r.srvOpts.FrontendPort, _ = strconv.Atoi(portText)

	if r.p, err = providertest.NewProvider(); err != nil {
		return r, fmt.Errorf("chaos: provider: %w", err)
	}
	r.undo = append(r.undo, func() { r.p.Close() })
	// A little generation time keeps streams in flight across reloads (and,
	// with KillWorker, on the worker when it is killed).
	gen := 20 * time.Millisecond
	if o.KillWorker {
		gen = 300 * time.Millisecond
	}
	r.p.SetDefault(providertest.Answer("ok").After(gen))
	if o.Faults > 0 {
		r.p.Script(FaultScript(o.Faults, o.Stream))
	}

	r.say("· starting haproxy (HTTP/2 both sides) in front of the provider")
	if r.hp, err = StartProviderProxy(ctx, o.HAProxy, o.Dir, strings.TrimPrefix(r.p.H2CURL(), "http://")); err != nil {
		return r, err
	}
	r.undo = append(r.undo, r.hp.Stop)

	r.journal = journal.Dir{Path: filepath.Join(o.Dir, "journal")}
	if r.tc, err = client.Dial(client.Options{HostPort: srv.FrontendHostPort(), Namespace: srv.Namespace(), Logger: telemetry.TemporalLogger(slog.New(slog.DiscardHandler))}); err != nil {
		return r, fmt.Errorf("chaos: client: %w", err)
	}
	r.undo = append(r.undo, r.tc.Close)
	route := routes.Route{
		Name: "via-haproxy", Kind: routes.KindOpenAI, BaseURL: "http://" + r.hp.Addr + "/v1", Model: "m",
		// haproxy answers REFUSED_STREAM when its origin fails after
		// the request was forwarded; see Route.Intermediary.
		Intermediary: true,
		Capabilities: providers.Capabilities{Streaming: true},
		IdleTimeout:  streamIdle,
	}
	if o.ProviderRecord {
		route.ProviderRecord = routes.ProviderRecordStoredCompletions
	}
	r.w, err = worker.New(r.tc, worker.Options{
		TaskQueue: "durallm-chaos", AllowH2C: true, SearchAttributes: true, Logger: slog.New(slog.DiscardHandler),
		MaxConcurrentAttempts: o.Concurrency * 2,
		// The killed worker process writes the same journal.
		Journal: r.journal,
		Config:  routes.Config{Routes: []routes.Route{route}},
	})
	if err != nil {
		return r, err
	}
	if err := r.w.Start(); err != nil {
		return r, err
	}
	r.undo = append(r.undo, r.w.Stop)
	r.c = durallm.NewClient(r.tc, "durallm-chaos")

	if o.KillWorker {
		if err := r.startKiller(o); err != nil {
			return r, err
		}
		r.say("· a second worker runs as process %d; it will be SIGKILLed halfway", r.killer.cmd.Process.Pid)
	}
	return r, nil
}

func (r *rig) startKiller(o Options) error {
	k, err := startWorkerProc(o.Dir, r.srv.FrontendHostPort(), "http://"+r.hp.Addr+"/v1", o.Concurrency*2, o.ProviderRecord)
	if err != nil {
		return err
	}
	r.killer = k
	r.undo = append(r.undo, k.kill)
	return nil
}

func (r *rig) tearDown() {
	for i := len(r.undo) - 1; i >= 0; i-- {
		r.undo[i]()
	}
}

// drive runs the actions at the options' concurrency while haproxy is
// reloaded, and kills the worker process and restarts the server at their
// points; it returns each action's result or error.
func (r *rig) drive(ctx context.Context, o Options, rep *Report) ([]workflows.ActionResult, []error, error) {
	r.say("· running %d actions at concurrency %d, reloading haproxy every %s", o.Actions, o.Concurrency, o.ReloadEvery)
	if o.Faults > 0 {
		r.say("· the provider answers %.0f%% of requests with a fault", o.Faults*100)
	}
	if o.ProviderRecord {
		r.say("· the route keeps a provider record (stored_completions): the provider stores what it generates")
	}
	results := make([]workflows.ActionResult, o.Actions)
	errs := make([]error, o.Actions)
	var wg sync.WaitGroup
	next := make(chan int)
	for range o.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				results[i], errs[i] = RunAction(ctx, r.c, actionID(i), Input(i, o.Stream, "via-haproxy"))
			}
		}()
	}
	stopReloads := tick.Every(o.ReloadEvery, ctx.Done(), func() {
		if err := r.hp.Reload(); err != nil {
			r.say("  reload failed: %v", err)
			return
		}
		rep.Reloads++
	})
	// Whatever ends the loop, the callers and the reload loop are done
	// before drive returns: nothing writes the report after that.
	defer func() {
		close(next)
		wg.Wait()
		stopReloads()
	}()
	for i := range o.Actions {
		select {
		case next <- i:
		case <-ctx.Done():
		}
		if (i+1)%100 == 0 {
			r.say("  %d actions started", i+1)
		}
		if o.RestartServer && i+1 == o.Actions*3/4 {
			r.say("  restarting the Temporal server over the same data directory")
			if err := r.srv.Stop(); err != nil {
				return nil, nil, fmt.Errorf("chaos: stop server: %w", err)
			}
			srv, err := devserver.Start(ctx, r.srvOpts)
			if err != nil {
				return nil, nil, fmt.Errorf("chaos: restart server: %w", err)
			}
			r.srv = srv
			rep.Restarts++
		}
		if r.killer != nil && i+1 == o.Actions/2 {
			r.say("  SIGKILL worker process %d", r.killer.cmd.Process.Pid)
			r.killer.kill()
			rep.Kills++
			time.Sleep(time.Second)
			if err := r.startKiller(o); err != nil {
				return nil, nil, err
			}
		}
	}
	return results, errs, nil
}

func actionID(i int) string { return "chaos-" + strconv.Itoa(i) }

// Input is action i of a run: one user message over the given routes, at
// most six attempts, and a short wait for a person. internal/cluster
// drives the same actions.
func Input(i int, stream bool, routes ...string) workflows.ActionInput {
	return workflows.ActionInput{
		Request:  providers.Request{Messages: []providers.Message{providers.TextMessage("user", "chaos "+strconv.Itoa(i))}, Stream: stream},
		Routes:   routes,
		Deadline: 2 * time.Minute, MaxAttempts: 6,
		// What the journal cannot settle is left to a person: here, a
		// short wait that ends the action indeterminate, so the run counts
		// it and does not wait a day.
		ReconcileTimeout: 3 * time.Second,
	}
}

// ActionID names action i of a run.
func ActionID(i int) string { return actionID(i) }

// RunAction starts one action and waits until it is terminal or awaits a
// verdict (the run reconciles nothing: an ambiguous action must stay put).
// A start that fails is tried again with the same id until ctx ends: a
// failed call may still have started the workflow (the server answered
// after the connection broke), and then the action already exists.
func RunAction(ctx context.Context, c *durallm.Client, id string, in workflows.ActionInput) (workflows.ActionResult, error) {
	a, err := startOnce(ctx, c, id, in)
	if err != nil {
		return workflows.ActionResult{}, err
	}
	for {
		st, err := c.Status(ctx, id)
		if err == nil && st.State.Terminal() {
			res, err := a.Result(ctx)
			var ae *durallm.ActionError
			if errors.As(err, &ae) {
				err = nil
			}
			return res, err
		}
		select {
		case <-ctx.Done():
			return workflows.ActionResult{Status: st}, fmt.Errorf("still %s when the run ended: %w", st.State, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// startOnce starts the action, retrying a failed start with the same id;
// an id already taken means an earlier try started it.
func startOnce(ctx context.Context, c *durallm.Client, id string, in workflows.ActionInput) (*durallm.Action, error) {
	for {
		a, err := c.Start(ctx, id, in)
		var started *serviceerror.WorkflowExecutionAlreadyStarted
		switch {
		case err == nil:
			return a, nil
		case errors.As(err, &started):
			return c.Get(id), nil
		case errors.Is(err, durallm.ErrInvalidInput):
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("start %s: %w (last error: %w)", id, ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// DefaultBehavior is the name the provider records for a run's default
// answer ("ok", after the run's generation time).
var DefaultBehavior = providertest.Answer("ok").String()

// FaultScript is the provider script of a run with faults: it answers the
// fraction rate of requests with one of faultMix (and, for streamed
// actions, streamFaults), chosen by a hash of the attempt id, and leaves
// the rest to the provider's default. internal/cluster injects the same.
func FaultScript(rate float64, stream bool) func(providertest.Request) (providertest.Behavior, bool) {
	mix := faultMix
	if stream {
		mix = append(append([]providertest.Behavior(nil), faultMix...), streamFaults...)
	}
	return func(req providertest.Request) (providertest.Behavior, bool) {
		return faultFor(req.AttemptID, rate, mix)
	}
}

// faultMix is what a faulty provider does instead of answering, each as
// likely as the others. Each is a row of the classification table seen
// through the proxy, which may translate it (a reset or a closed origin
// connection reaches the client as a 502).
var faultMix = []providertest.Behavior{
	providertest.TooManyRequests(providertest.RetryAfterMS(50)),
	providertest.Unavailable(nil),
	providertest.ServerError(http.StatusInternalServerError),
	providertest.Status(http.StatusBadRequest, nil, ""),
	providertest.Misdirected(),
	providertest.ServerError(http.StatusGatewayTimeout),
	providertest.NoChoices(),
	providertest.RefuseStream(),
	providertest.ResetStream(http2.ErrCodeInternal),
	providertest.CloseAfterRead(),
	providertest.GoAwayAbove(http2.ErrCodeNo),
	providertest.GoAwayAfterProcessing(http2.ErrCodeNo),
}

// streamFaults join faultMix when the actions stream.
var streamFaults = []providertest.Behavior{
	providertest.StreamStall(2),
	providertest.StreamCut(2, providertest.CutReset),
	providertest.StreamCut(2, providertest.CutClose),
	providertest.StreamCut(0, providertest.CutReset),
}

// streamIdle is the chaos route's idle timeout: a stalled stream ends
// within it.
const streamIdle = time.Second

// faultFor decides by a hash of the attempt id whether the request gets a
// fault (with probability rate) and which, from mix.
func faultFor(attemptID string, rate float64, mix []providertest.Behavior) (providertest.Behavior, bool) {
	h := fnv.New64a()
	h.Write([]byte(attemptID))
	x := h.Sum64()
	if float64(x%10000) >= rate*10000 {
		return providertest.Behavior{}, false
	}
	return mix[(x/10000)%uint64(len(mix))], true
}

// workerProc is a 'durallm worker' process on the chaos task queue.
type workerProc struct{ cmd *exec.Cmd }

func startWorkerProc(dir, temporal, baseURL string, maxAttempts int, record bool) (*workerProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	routes := filepath.Join(dir, "routes.yaml")
	yaml := "routes:\n  - name: via-haproxy\n    kind: openai\n    base_url: " + baseURL + "\n    model: m\n    intermediary: true\n    idle_timeout: " + streamIdle.String() + "\n    capabilities:\n      streaming: true\n"
	if record {
		yaml += "    provider_record: stored_completions\n"
	}
	if err := os.WriteFile(routes, []byte(yaml), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "worker", "--address", temporal, "--task-queue", "durallm-chaos", "--routes", routes,
		"--allow-h2c", "--metrics-addr", "", "--stream-addr", "", "--result-dir", filepath.Join(dir, "results"), "--journal-dir", filepath.Join(dir, "journal"),
		"--max-concurrent-attempts", strconv.Itoa(maxAttempts))
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("chaos: start worker process: %w", err)
	}
	return &workerProc{cmd: cmd}, nil
}

// kill SIGKILLs the process (once) and reaps it.
func (w *workerProc) kill() {
	if w.cmd.ProcessState != nil {
		return
	}
	_ = w.cmd.Process.Kill()
	_ = w.cmd.Wait()
}

// providerProxyConfig is haproxy with HTTP/2 without TLS on both sides
// (prior knowledge) in front of backend. hard-stop-after bounds how long an
// old process may drain after a reload.
func providerProxyConfig(addr, backend string) string {
	return fmt.Sprintf(`global
  hard-stop-after 30s
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend fe
  bind %s proto h2
  default_backend be
backend be
  server provider %s proto h2
`, addr, backend)
}

// StartProviderProxy starts haproxy (bin) as an HTTP/2 proxy in front of
// the provider at backend (host:port, cleartext HTTP/2), its files in dir.
func StartProviderProxy(ctx context.Context, bin, dir, backend string) (*haproxy.Proxy, error) {
	addr, err := haproxy.FreeAddr()
	if err != nil {
		return nil, err
	}
	hp, err := haproxy.Start(ctx, bin, dir, "haproxy", addr, providerProxyConfig(addr, backend))
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	return hp, nil
}
