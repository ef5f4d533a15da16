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
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"golang.org/x/net/http2"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/internal/devserver"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/testsuite"
	"github.com/durallm/durallm/worker"
	"github.com/durallm/durallm/workflows"
)

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
}

// Report is what a run found.
type Report struct {
	Actions     int
	Reloads     int
	States      map[workflows.State]int
	Classes     map[recovery.Class]int
	Attempts    int
	Violations  []string
	ProviderRun int // requests the provider executed
	Kills       int // worker processes SIGKILLed
	Restarts    int // embedded server restarts
	// Faults counts the faults the provider injected, by behaviour.
	Faults map[string]int
	// Seen maps what the provider did with an attempt's request (its
	// behaviour, "Answer" for the default) to how the client classified
	// the attempt through the proxy, with counts: how haproxy relays each
	// origin fault. Attempts the provider never received are under "".
	Seen map[string]map[recovery.Class]int
	// ExtraExecutions counts provider executions beyond one per completed
	// action: requests the provider ran whose answer never became the
	// action's (a 500, a reset or an empty 2xx after executing, or an
	// answer lost when its origin connection closed and the proxy said
	// 502). The contract allows each (upstream_error and empty_response
	// may be retried); it is reported, not a violation.
	ExtraExecutions int
	// GoAways counts GOAWAY frames the engine received, by code; Conns the
	// connections it opened (one per drain, when recovery works).
	GoAways map[string]int64
	Conns   int64
	Elapsed time.Duration
}

// Run starts the embedded server, the testsuite provider, haproxy in front
// of it and a durallm worker whose route goes through haproxy; runs the
// actions while reloading haproxy; then checks the invariants.
func Run(ctx context.Context, o Options) (*Report, error) {
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
	say := func(format string, a ...any) { fmt.Fprintf(o.Progress, format+"\n", a...) }
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

	say("· starting the embedded Temporal server")
	srvOpts := devserver.Options{
		DataDir: filepath.Join(o.Dir, "data"), FrontendPort: devserver.FreePort, DisableUI: true,
		SearchAttributes: workflows.SearchAttributes, Logger: slog.New(slog.DiscardHandler),
	}
	srv, err := devserver.Start(ctx, srvOpts)
	if err != nil {
		return nil, fmt.Errorf("chaos: server: %w", err)
	}
	defer func() { srv.Stop() }()
	// A restart must come back on the same port: clients and workers keep
	// their address and reconnect.
	_, portText, _ := net.SplitHostPort(srv.FrontendHostPort())
	srvOpts.FrontendPort, _ = strconv.Atoi(portText)

	p, err := testsuite.NewProvider()
	if err != nil {
		return nil, fmt.Errorf("chaos: provider: %w", err)
	}
	defer p.Close()
	// A little generation time keeps streams in flight across reloads (and,
	// with KillWorker, on the worker when it is killed).
	gen := 20 * time.Millisecond
	if o.KillWorker {
		gen = 300 * time.Millisecond
	}
	p.SetDefault(testsuite.Answer("ok").After(gen))
	if o.Faults > 0 {
		mix := faultMix
		if o.Stream {
			mix = append(append([]testsuite.Behavior(nil), faultMix...), streamFaults...)
		}
		p.Script(func(r testsuite.Request) (testsuite.Behavior, bool) {
			return faultFor(r.AttemptID, o.Faults, mix)
		})
	}

	say("· starting haproxy (HTTP/2 both sides) in front of the provider")
	hp, err := startHAProxy(ctx, o.HAProxy, o.Dir, strings.TrimPrefix(p.H2CURL(), "http://"))
	if err != nil {
		return nil, err
	}
	defer hp.stop()

	tc, err := client.Dial(client.Options{HostPort: srv.FrontendHostPort(), Namespace: srv.Namespace(), Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		return nil, fmt.Errorf("chaos: client: %w", err)
	}
	defer tc.Close()
	w, err := worker.New(tc, worker.Options{
		TaskQueue: "durallm-chaos", AllowH2C: true, SearchAttributes: true, Logger: slog.New(slog.DiscardHandler),
		MaxConcurrentAttempts: o.Concurrency * 2,
		Config: providers.Config{Routes: []providers.Route{{
			Name: "via-haproxy", Kind: providers.KindOpenAI, BaseURL: "http://" + hp.addr + "/v1", Model: "m",
			// haproxy answers REFUSED_STREAM when its origin fails after
			// the request was forwarded; see Route.Intermediary.
			Intermediary: true,
			Capabilities: providers.Capabilities{Streaming: true},
			IdleTimeout:  streamIdle,
		}}},
	})
	if err != nil {
		return nil, err
	}
	if err := w.Start(); err != nil {
		return nil, err
	}
	defer w.Stop()
	c := durallm.NewClient(tc, "durallm-chaos")

	var killer *workerProc
	if o.KillWorker {
		killer, err = startWorkerProc(o.Dir, srv.FrontendHostPort(), "http://"+hp.addr+"/v1", o.Concurrency*2)
		if err != nil {
			return nil, err
		}
		defer killer.kill()
		say("· a second worker runs as process %d; it will be SIGKILLed halfway", killer.cmd.Process.Pid)
	}

	say("· running %d actions at concurrency %d, reloading haproxy every %s", o.Actions, o.Concurrency, o.ReloadEvery)
	if o.Faults > 0 {
		say("· the provider answers %.0f%% of requests with a fault", o.Faults*100)
	}
	rep := &Report{Actions: o.Actions, States: map[workflows.State]int{}, Classes: map[recovery.Class]int{}, Faults: map[string]int{}, Seen: map[string]map[recovery.Class]int{}}
	results := make([]workflows.ActionResult, o.Actions)
	errs := make([]error, o.Actions)
	var wg sync.WaitGroup
	next := make(chan int)
	for range o.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				results[i], errs[i] = runAction(ctx, c, i, o.Stream)
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(o.ReloadEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				if err := hp.reload(); err != nil {
					say("  reload failed: %v", err)
					continue
				}
				rep.Reloads++
			}
		}
	}()
	for i := range o.Actions {
		select {
		case next <- i:
		case <-ctx.Done():
		}
		if (i+1)%100 == 0 {
			say("  %d actions started", i+1)
		}
		if o.RestartServer && i+1 == o.Actions*3/4 {
			say("  restarting the Temporal server over the same data directory")
			if err := srv.Stop(); err != nil {
				return nil, fmt.Errorf("chaos: stop server: %w", err)
			}
			if srv, err = devserver.Start(ctx, srvOpts); err != nil {
				return nil, fmt.Errorf("chaos: restart server: %w", err)
			}
			rep.Restarts++
		}
		if killer != nil && i+1 == o.Actions/2 {
			say("  SIGKILL worker process %d", killer.cmd.Process.Pid)
			killer.kill()
			rep.Kills++
			time.Sleep(time.Second)
			if killer, err = startWorkerProc(o.Dir, srv.FrontendHostPort(), "http://"+hp.addr+"/v1", o.Concurrency*2); err != nil {
				return nil, err
			}
			defer killer.kill()
		}
	}
	close(next)
	wg.Wait()
	close(done)
	rep.Elapsed = time.Since(start)
	rep.ProviderRun = len(p.Processed())

	for i, res := range results {
		id := actionID(i)
		if errs[i] != nil {
			rep.Violations = append(rep.Violations, fmt.Sprintf("%s: %v", id, errs[i]))
			continue
		}
		rep.States[res.State]++
		rep.Violations = append(rep.Violations, check(p, id, res, o.Faults > 0)...)
		if res.State == workflows.StateCompleted {
			rep.ExtraExecutions += p.ExecutedCount(id) - 1
		}
		for _, a := range res.Attempts {
			rep.Attempts++
			rep.Classes[a.Classification.Class]++
			if o.Faults > 0 {
				b := behaviorOf(p, a.Evidence.AttemptID)
				if rep.Seen[b] == nil {
					rep.Seen[b] = map[recovery.Class]int{}
				}
				rep.Seen[b][a.Classification.Class]++
			}
		}
	}
	for _, r := range p.Received() {
		if r.Behavior != "" && r.Behavior != defaultBehavior {
			rep.Faults[r.Behavior]++
		}
	}
	st := w.Engine().Stats()
	rep.GoAways, rep.Conns = st.GoAways, st.ConnsOpened
	if n := st.TransportReplays; n > 0 {
		rep.Violations = append(rep.Violations, fmt.Sprintf("%d hidden transport replays", n))
	}
	return rep, nil
}

func actionID(i int) string { return "chaos-" + strconv.Itoa(i) }

// runAction starts one action and waits until it is terminal or awaits a
// verdict (the run reconciles nothing: an ambiguous action must stay put).
func runAction(ctx context.Context, c *durallm.Client, i int, stream bool) (workflows.ActionResult, error) {
	id := actionID(i)
	a, err := c.Start(ctx, id, workflows.ActionInput{
		Request:  providers.Request{Messages: []providers.Message{providers.TextMessage("user", "chaos "+strconv.Itoa(i))}, Stream: stream},
		Routes:   []string{"via-haproxy"},
		Deadline: 2 * time.Minute, MaxAttempts: 6,
	})
	if err != nil {
		return workflows.ActionResult{}, err
	}
	for {
		st, err := c.Status(ctx, id)
		if err == nil && (st.State.Terminal() || st.State == workflows.StateAwaitingReconciliation) {
			if st.State == workflows.StateAwaitingReconciliation {
				return workflows.ActionResult{Status: st}, nil
			}
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

// check applies the invariants to one action. With faults, a completed
// action may have been executed more than once (an upstream_error or an
// empty_response is retried, and a proxy's 502 may hide an origin that
// ran); what must still hold is that its completing attempt ran exactly
// once and that nothing was sent after an outcome that forbids it.
func check(p *testsuite.Provider, id string, res workflows.ActionResult, faults bool) []string {
	var v []string
	for i, a := range res.Attempts {
		ev, cl := a.Evidence, a.Classification
		last := i == len(res.Attempts)-1
		switch cl.Class {
		case recovery.Completed, recovery.CommittedPartial:
			if !last {
				v = append(v, fmt.Sprintf("%s attempt %d was %s and another attempt followed", id, a.N, cl.Class))
			}
			// More than once is caught below, for every attempt.
			if cl.Class == recovery.Completed && p.AttemptExecutions(ev.AttemptID) == 0 {
				v = append(v, fmt.Sprintf("%s attempt %d completed but the provider never executed it", id, a.N))
			}
		case recovery.Refused, recovery.Unsent:
			if n := p.AttemptExecutions(ev.AttemptID); n > 0 {
				v = append(v, fmt.Sprintf("%s attempt %d classified %s (%s) but the provider executed it %d time(s) (%s)", id, a.N, cl.Class, cl.Reason, n, behaviorOf(p, ev.AttemptID)))
			}
		case recovery.Ambiguous:
			if !last {
				v = append(v, fmt.Sprintf("%s attempt %d was ambiguous and another attempt followed without a verdict", id, a.N))
			}
		}
		if ev.SentAfterGoAway {
			v = append(v, fmt.Sprintf("%s attempt %d was sent on a connection that had received GOAWAY", id, a.N))
		}
		if ev.TransportReplays > 0 {
			v = append(v, fmt.Sprintf("%s attempt %d was replayed by the transport", id, a.N))
		}
		// The provider records the attempt id of every request it runs: two
		// runs of one attempt are a replay by some layer below the workflow
		// (the engine, or a proxy retrying on its own).
		if n := p.AttemptExecutions(ev.AttemptID); n > 1 {
			v = append(v, fmt.Sprintf("%s attempt %d was executed %d times by the provider (%s)", id, a.N, n, behaviorOf(p, ev.AttemptID)))
		}
	}
	// A partial committed on a worker that was then killed has a reason
	// but no text: the text went to that worker's subscribers only.
	lost := res.Response != nil && res.Response.Incomplete == providers.IncompleteWorkerLost
	if res.State == workflows.StateCompletedPartial && (res.Response == nil || !res.Response.Partial || (res.Response.Text == "" && !lost) || res.Response.Incomplete == "") {
		v = append(v, fmt.Sprintf("%s ended completed_partial without its partial text and reason", id))
	}
	if res.State == workflows.StateCompleted && !faults {
		if n := p.ExecutedCount(id); n != 1 {
			v = append(v, fmt.Sprintf("%s completed but the provider executed it %d times", id, n))
		}
	}
	if !res.State.Terminal() && res.State != workflows.StateAwaitingReconciliation {
		v = append(v, fmt.Sprintf("%s stuck in %s", id, res.State))
	}
	return v
}

// behaviorOf names what the provider did with an attempt's request(s).
func behaviorOf(p *testsuite.Provider, attemptID string) string {
	var names []string
	for _, r := range p.Received() {
		if r.AttemptID == attemptID {
			names = append(names, r.Behavior)
		}
	}
	return strings.Join(names, ", ")
}

// defaultBehavior is the name the provider records for its default answer.
var defaultBehavior = testsuite.Answer("ok").String()

// faultMix is what a faulty provider does instead of answering, each as
// likely as the others. Each is a row of the classification table seen
// through the proxy, which may translate it (a reset or a closed origin
// connection reaches the client as a 502).
var faultMix = []testsuite.Behavior{
	testsuite.TooManyRequests(testsuite.RetryAfterMS(50)),
	testsuite.Unavailable(nil),
	testsuite.ServerError(http.StatusInternalServerError),
	testsuite.Status(http.StatusBadRequest, nil, ""),
	testsuite.Misdirected(),
	testsuite.ServerError(http.StatusGatewayTimeout),
	testsuite.NoChoices(),
	testsuite.RefuseStream(),
	testsuite.ResetStream(http2.ErrCodeInternal),
	testsuite.CloseAfterRead(),
	testsuite.GoAwayAbove(http2.ErrCodeNo),
	testsuite.GoAwayAfterProcessing(http2.ErrCodeNo),
}

// streamFaults join faultMix when the actions stream.
var streamFaults = []testsuite.Behavior{
	testsuite.StreamStall(2),
	testsuite.StreamCut(2, testsuite.CutReset),
	testsuite.StreamCut(2, testsuite.CutClose),
	testsuite.StreamCut(0, testsuite.CutReset),
}

// streamIdle is the chaos route's idle timeout: a stalled stream ends
// within it.
const streamIdle = time.Second

// faultFor decides by a hash of the attempt id whether the request gets a
// fault (with probability rate) and which, from mix.
func faultFor(attemptID string, rate float64, mix []testsuite.Behavior) (testsuite.Behavior, bool) {
	h := fnv.New64a()
	h.Write([]byte(attemptID))
	x := h.Sum64()
	if float64(x%10000) >= rate*10000 {
		return testsuite.Behavior{}, false
	}
	return mix[(x/10000)%uint64(len(mix))], true
}

// Print writes the report as tables.
func (r *Report) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "actions\t%d\nserver restarts\t%d\nworker processes SIGKILLed\t%d\nhaproxy reloads\t%d\nattempts\t%d\nexecuted by the provider\t%d\nconnections opened (in-process worker)\t%d\nelapsed\t%s\n", r.Actions, r.Restarts, r.Kills, r.Reloads, r.Attempts, r.ProviderRun, r.Conns, r.Elapsed.Round(time.Millisecond))
	for _, k := range sortedKeys(r.GoAways) {
		fmt.Fprintf(tw, "GOAWAY %s received\t%d\n", k, r.GoAways[k])
	}
	if len(r.Faults) > 0 {
		fmt.Fprintf(tw, "extra executions (allowed; see Report)\t%d\n", r.ExtraExecutions)
		fmt.Fprintln(tw, "\nfault injected\trequests")
		for _, k := range sortedKeys(r.Faults) {
			fmt.Fprintf(tw, "%s\t%d\n", k, r.Faults[k])
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "final state\tactions")
	for _, k := range sortedKeys(r.States) {
		fmt.Fprintf(tw, "%s\t%d\n", k, r.States[workflows.State(k)])
	}
	fmt.Fprintln(tw, "\nattempt classification\tattempts")
	for _, k := range sortedKeys(r.Classes) {
		fmt.Fprintf(tw, "%s\t%d\n", k, r.Classes[recovery.Class(k)])
	}
	if len(r.Seen) > 0 {
		fmt.Fprintln(tw, "\nthe provider did\tthe client classified (through haproxy)")
		for _, b := range sortedKeys(r.Seen) {
			var parts []string
			for _, c := range sortedKeys(r.Seen[b]) {
				parts = append(parts, fmt.Sprintf("%s %d", c, r.Seen[b][recovery.Class(c)]))
			}
			name := b
			if name == "" {
				name = "(never received)"
			}
			fmt.Fprintf(tw, "%s\t%s\n", name, strings.Join(parts, ", "))
		}
	}
	tw.Flush()
	if len(r.Violations) == 0 {
		fmt.Fprintln(w, "\ninvariants: all held")
		return
	}
	fmt.Fprintf(w, "\ninvariants: %d VIOLATED\n", len(r.Violations))
	for _, v := range r.Violations {
		fmt.Fprintln(w, "  "+v)
	}
}

func sortedKeys[K ~string, V any](m map[K]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, string(k))
	}
	sort.Strings(ks)
	return ks
}

// workerProc is a 'durallm worker' process on the chaos task queue.
type workerProc struct{ cmd *exec.Cmd }

func startWorkerProc(dir, temporal, baseURL string, maxAttempts int) (*workerProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	routes := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(routes, []byte("routes:\n  - name: via-haproxy\n    kind: openai\n    base_url: "+baseURL+"\n    model: m\n    intermediary: true\n    idle_timeout: "+streamIdle.String()+"\n    capabilities:\n      streaming: true\n"), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "worker", "--address", temporal, "--task-queue", "durallm-chaos", "--routes", routes,
		"--allow-h2c", "--metrics-addr", "", "--stream-addr", "", "--result-dir", filepath.Join(dir, "results"),
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

// haproxy is a master-worker haproxy process.
type haproxy struct {
	cmd  *exec.Cmd
	addr string
}

func startHAProxy(ctx context.Context, bin, dir, backend string) (*haproxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := filepath.Join(dir, "haproxy.cfg")
	// HTTP/2 without TLS on both sides (prior knowledge). hard-stop-after
	// bounds how long an old process may drain after a reload.
	conf := fmt.Sprintf(`global
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
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, bin, "-W", "-f", cfg)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("chaos: start haproxy (install it: apt-get install haproxy): %w", err)
	}
	h := &haproxy{cmd: cmd, addr: addr}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return h, nil
		}
		if time.Now().After(deadline) {
			h.stop()
			return nil, fmt.Errorf("chaos: haproxy did not listen on %s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// reload asks the master for a graceful reload: new workers take new
// connections; old ones send GOAWAY and drain.
func (h *haproxy) reload() error { return h.cmd.Process.Signal(syscall.SIGUSR2) }

func (h *haproxy) stop() {
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = h.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = h.cmd.Process.Kill()
		<-done
	}
}
