package cluster

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/internal/chaos"
	"github.com/durallm/durallm/internal/chaos/report"
	"github.com/durallm/durallm/internal/tick"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// ChaosOptions bound a chaos run on the cluster. Zero values take the
// defaults named.
type ChaosOptions struct {
	// Concurrency is the number of callers, each running actions one
	// after another while the faults happen. Default 16.
	Concurrency int
	// MaxActions caps the actions started. Default 3000.
	MaxActions int
	// ReloadEvery is the interval between graceful reloads of the haproxy
	// in front of the provider. Default 1s.
	ReloadEvery time.Duration
	// Generation is how long the provider takes to answer, so that
	// attempts are in flight when a fault hits. Default 300ms.
	Generation time.Duration
	// Pause is the load-only time before the first fault, between faults
	// and after the last. Default 5s.
	Pause time.Duration
	// KillDown is how long a SIGKILLed server node stays down. Default 5s.
	KillDown time.Duration
	// Timeout bounds the whole run. Default 10m.
	Timeout time.Duration
	// Faults is the fraction of requests (0 to 1) the provider behind
	// haproxy answers with a fault instead of an answer: the single-node
	// run's mix (chaos.FaultScript). Default 0: no faults.
	Faults float64
	// Stream makes every action a streamed one; with Faults, the stream
	// faults join the mix. The routes keep deploy/routes.yaml's timeouts,
	// so a stalled stream ends after its 30s idle timeout.
	Stream bool
	// Progress receives a line per phase.
	Progress io.Writer
}

func (o ChaosOptions) withDefaults() ChaosOptions {
	if o.Concurrency <= 0 {
		o.Concurrency = 16
	}
	if o.MaxActions <= 0 {
		o.MaxActions = 3000
	}
	if o.ReloadEvery <= 0 {
		o.ReloadEvery = time.Second
	}
	if o.Generation <= 0 {
		o.Generation = 300 * time.Millisecond
	}
	if o.Pause <= 0 {
		o.Pause = 5 * time.Second
	}
	if o.KillDown <= 0 {
		o.KillDown = 5 * time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Minute
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return o
}

// Validate rejects options no run can honour.
func (o ChaosOptions) Validate() error {
	if o.Faults < 0 || o.Faults > 1 {
		return fmt.Errorf("cluster: chaos: --faults must be between 0 and 1, got %g", o.Faults)
	}
	return nil
}

// Fault is one fault the run injected and what it did.
type Fault struct {
	Name string
	// Start is when it began; End when what it hit served again.
	Start, End time.Time
	// Detail says how it went (a graceful stop's time, a SIGKILL).
	Detail string
	// InFlight counts the attempts running at some moment of the fault
	// (their span overlaps [Start, End]), but for those the provider
	// answered with a fault of its own.
	InFlight int
	// Delayed counts those that took longer than twice the run's p99 of
	// attempts no fault touched: their completion waited for the fault.
	Delayed int
	// Awaiting counts those that ended ambiguous and so waited for a
	// verdict, by why: the attempt's reason and what settled it.
	Awaiting map[string]int
}

// ChaosReport is what a chaos run on the cluster found: the chaos
// invariants' report (package report, executed twice included) plus the
// faults and the counts the cluster adds.
type ChaosReport struct {
	*report.Report
	Faults []*Fault
	// RollingRestarts counts graceful restarts of a server node,
	// ServerKills SIGKILLs of one, WorkerKills SIGKILLs of a worker.
	RollingRestarts, ServerKills, WorkerKills int
	// Lost lists actions that were started but never reached a terminal
	// state or awaiting_reconciliation (or whose result could not be
	// read): none may be.
	Lost []string
	// Slowest is the action that took longest from its start to its
	// result: what the run's end waited for.
	Slowest Slowest
	// Baseline is the p99 attempt duration outside every fault.
	Baseline time.Duration
	// ShardMoves counts history shards acquired by a node during the run
	// (range id bumps in the shards table): shards moving between nodes.
	ShardMoves int64
}

// Slowest is an action and how long its caller waited for it.
type Slowest struct {
	ID     string
	Took   time.Duration
	Result workflows.ActionResult
}

// String says how long the action took, how it ended and what each of
// its attempts was.
func (s Slowest) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s, %s, %s", s.ID, s.Took.Round(100*time.Millisecond), s.Result.State)
	for _, a := range s.Result.Attempts {
		fmt.Fprintf(&b, "; attempt %d on %s %s", a.N, a.Route, a.Classification.Class)
		if a.Classification.Reason != "" {
			fmt.Fprintf(&b, " (%s)", a.Classification.Reason)
		}
		fmt.Fprintf(&b, " after %s", a.Duration.Round(100*time.Millisecond))
		if a.VerdictBy != "" {
			fmt.Fprintf(&b, ", verdict %s by %s", a.Verdict, a.VerdictBy)
		}
	}
	return b.String()
}

// tally checks the run's n actions (their results, errors and durations)
// into rep: the chaos invariants, lost, twice, the slowest, the faults'
// effects and the shard moves since shards0.
func (c *Cluster) tally(ctx context.Context, rep *ChaosReport, results []workflows.ActionResult, errs []error, took []time.Duration, faults bool, shards0 int64) error {
	n := len(results)
	rep.Actions = n
	rep.Kills = rep.WorkerKills
	rep.Restarts = rep.RollingRestarts + rep.ServerKills
	for i := range n {
		id := chaos.ActionID(i)
		rep.Add(c.Provider, c.Journal, id, results[i], errs[i], faults)
		if errs[i] != nil || !(results[i].State.Terminal() || results[i].State == workflows.StateAwaitingReconciliation) {
			rep.Lost = append(rep.Lost, id)
		}
	}
	rep.ProviderRun = len(c.Provider.Processed())
	for i := range n {
		if took[i] > rep.Slowest.Took {
			rep.Slowest = Slowest{ID: chaos.ActionID(i), Took: took[i], Result: results[i]}
		}
	}
	rep.AddFaults(c.Provider, chaos.DefaultBehavior)
	shards1, err := c.ShardAcquisitions(ctx)
	if err != nil {
		return err
	}
	rep.ShardMoves = shards1 - shards0
	// An attempt the provider answered with a fault of its own is the
	// report's to count (what the provider did, how it was classified),
	// not the node faults' it happened to overlap.
	faulted := map[string]bool{}
	for _, rec := range c.Provider.Received() {
		if rec.Behavior != "" && rec.Behavior != chaos.DefaultBehavior {
			faulted[rec.AttemptID] = true
		}
	}
	rep.analyseFaults(results, faulted)
	return nil
}

// Chaos runs actions on c while it reloads the provider's haproxy, restarts
// each server node in turn (SIGTERM, then start), SIGKILLs one node and
// SIGKILLs one worker, with the provider injecting faults when o.Faults is
// set, then checks the chaos invariants on every action and that none was
// lost or executed twice. c must have been started without DirectProvider.
func Chaos(ctx context.Context, c *Cluster, o ChaosOptions) (*ChaosReport, error) {
	o = o.withDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if c.o.DirectProvider {
		return nil, fmt.Errorf("cluster: chaos needs the provider behind haproxy (not DirectProvider)")
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	say := func(format string, a ...any) { fmt.Fprintf(o.Progress, "· "+format+"\n", a...) }
	start := time.Now()
	c.Provider.SetDefault(providertest.Answer("ok").After(o.Generation))
	faults := o.Faults > 0
	if faults {
		c.Provider.Script(chaos.FaultScript(o.Faults, o.Stream))
	}
	dc, tc, err := c.Client(ctx)
	if err != nil {
		return nil, err
	}
	defer tc.Close()

	rep := &ChaosReport{Report: report.New(0)}
	shards0, err := c.ShardAcquisitions(ctx)
	if err != nil {
		return nil, err
	}
	results := make([]workflows.ActionResult, o.MaxActions)
	errs := make([]error, o.MaxActions)
	took := make([]time.Duration, o.MaxActions)
	var next atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	kind := "actions"
	if o.Stream {
		kind = "streamed actions"
	}
	say("running %s at concurrency %d (at most %d), reloading the provider's haproxy every %s", kind, o.Concurrency, o.MaxActions, o.ReloadEvery)
	if faults {
		say("the provider behind haproxy answers %.0f%% of requests with a fault", o.Faults*100)
	}
	for range o.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() && ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= o.MaxActions {
					return
				}
				t := time.Now()
				results[i], errs[i] = chaos.RunAction(ctx, dc, chaos.ActionID(i), chaos.Input(i, o.Stream, routeNames...))
				took[i] = time.Since(t)
			}
		}()
	}
	var reloads atomic.Int64
	stopReloads := tick.Every(o.ReloadEvery, ctx.Done(), func() {
		if c.ProviderProxy.Reload() == nil {
			reloads.Add(1)
		}
	})

	faultErr := c.injectFaults(ctx, o, rep, say)
	stop.Store(true)
	say("faults done; waiting for the actions in flight to settle")
	wg.Wait()
	stopReloads()
	if faultErr != nil {
		return nil, faultErr
	}

	n := min(int(next.Load()), o.MaxActions)
	rep.Reloads = int(reloads.Load())
	if err := c.tally(ctx, rep, results[:n], errs[:n], took[:n], faults, shards0); err != nil {
		return nil, err
	}
	rep.Elapsed = time.Since(start)
	return rep, nil
}

// injectFaults runs the fault sequence with Pause between faults.
func (c *Cluster) injectFaults(ctx context.Context, o ChaosOptions, rep *ChaosReport, say func(string, ...any)) error {
	pause := func() error {
		select {
		case <-time.After(o.Pause):
			return nil
		case <-ctx.Done():
			return fmt.Errorf("cluster: chaos: %w", ctx.Err())
		}
	}
	if err := pause(); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		f := &Fault{Name: fmt.Sprintf("rolling restart of node %d (SIGTERM, then start)", n.N), Start: time.Now()}
		say("%s", f.Name)
		t := time.Now()
		graceful := n.Stop(30 * time.Second)
		f.Detail = fmt.Sprintf("stopped in %s", time.Since(t).Round(100*time.Millisecond))
		if !graceful {
			f.Detail += " (did not stop within 30s: SIGKILLed)"
		}
		if err := n.Start(); err != nil {
			return err
		}
		if err := n.WaitServing(ctx); err != nil {
			return err
		}
		f.End = time.Now()
		f.Detail += fmt.Sprintf(", serving again %s later", f.End.Sub(t).Round(100*time.Millisecond))
		rep.Faults = append(rep.Faults, f)
		rep.RollingRestarts++
		if err := pause(); err != nil {
			return err
		}
	}

	n := c.Nodes[len(c.Nodes)-1]
	f := &Fault{Name: fmt.Sprintf("SIGKILL of node %d, down %s", n.N, o.KillDown), Start: time.Now()}
	say("%s", f.Name)
	n.Kill()
	select {
	case <-time.After(o.KillDown):
	case <-ctx.Done():
		return fmt.Errorf("cluster: chaos: %w", ctx.Err())
	}
	if err := n.Start(); err != nil {
		return err
	}
	if err := n.WaitServing(ctx); err != nil {
		return err
	}
	f.End = time.Now()
	f.Detail = fmt.Sprintf("serving again %s after the kill", f.End.Sub(f.Start).Round(100*time.Millisecond))
	rep.Faults = append(rep.Faults, f)
	rep.ServerKills++
	if err := pause(); err != nil {
		return err
	}

	w := c.Workers[0]
	f = &Fault{Name: fmt.Sprintf("SIGKILL of worker %d (started again after 1s)", w.N), Start: time.Now()}
	say("%s", f.Name)
	w.Kill()
	time.Sleep(time.Second)
	if err := w.Start(); err != nil {
		return err
	}
	if err := w.WaitReady(ctx); err != nil {
		return err
	}
	f.End = time.Now()
	f.Detail = fmt.Sprintf("ready again %s after the kill", f.End.Sub(f.Start).Round(100*time.Millisecond))
	rep.Faults = append(rep.Faults, f)
	rep.WorkerKills++
	return pause()
}

// analyseFaults attributes attempts to the faults whose span they overlap,
// leaving out those the provider answered with a fault (by attempt id).
func (r *ChaosReport) analyseFaults(results []workflows.ActionResult, providerFaulted map[string]bool) {
	type span struct {
		from, to time.Time
		a        workflows.AttemptRecord
		res      *workflows.ActionResult
	}
	var spans []span
	var calm []time.Duration
	for i := range results {
		for _, a := range results[i].Attempts {
			if providerFaulted[a.Evidence.AttemptID] {
				continue
			}
			s := span{from: a.Scheduled, to: a.Scheduled.Add(a.Duration), a: a, res: &results[i]}
			spans = append(spans, s)
			touched := false
			for _, f := range r.Faults {
				if overlaps(s.from, s.to, f.Start, f.End) {
					touched = true
				}
			}
			if !touched {
				calm = append(calm, a.Duration)
			}
		}
	}
	r.Baseline = percentile(calm, 0.99)
	for _, f := range r.Faults {
		f.Awaiting = map[string]int{}
		for _, s := range spans {
			if !overlaps(s.from, s.to, f.Start, f.End) {
				continue
			}
			f.InFlight++
			if r.Baseline > 0 && s.a.Duration > 2*r.Baseline {
				f.Delayed++
			}
			if s.a.Classification.Class == evidence.Ambiguous {
				f.Awaiting[awaitingWhy(s.a, s.res)]++
			}
		}
	}
}

// awaitingWhy says why an ambiguous attempt waited and how it was settled.
func awaitingWhy(a workflows.AttemptRecord, res *workflows.ActionResult) string {
	settled := string(res.State)
	switch {
	case a.VerdictBy != "":
		settled = "verdict " + string(a.Verdict) + " by " + a.VerdictBy
	case res.State == workflows.StateIndeterminate:
		settled = "indeterminate after the reconcile timeout (" + res.Reason + ")"
	}
	return a.Classification.Reason + " → " + settled
}

func overlaps(a0, a1, b0, b1 time.Time) bool { return !a1.Before(b0) && !a0.After(b1) }

func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// Failed reports whether an invariant broke: a chaos violation, an
// action lost or one executed twice.
func (r *ChaosReport) Failed() bool {
	return r.Report.Failed() || len(r.Lost) > 0
}

// Print writes the per-fault table, the cluster's counts and the chaos
// report's tables.
func (r *ChaosReport) Print(w io.Writer) {
	also := ""
	if len(r.Report.Faults) > 0 {
		also = "; attempts the provider answered with a fault are in the tables below, not here"
	}
	fmt.Fprintf(w, "\nfaults (p99 attempt outside every fault: %s; delayed = more than twice that%s)\n\n", r.Baseline.Round(time.Millisecond), also)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "fault\tattempts in flight\tcompletions delayed\tawaiting a verdict\thow it went")
	for _, f := range r.Faults {
		n := 0
		for _, v := range f.Awaiting {
			n += v
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", f.Name, f.InFlight, f.Delayed, n, f.Detail)
	}
	tw.Flush()
	for _, f := range r.Faults {
		for _, why := range sortedKeys(f.Awaiting) {
			fmt.Fprintf(w, "  %s: %d awaited a verdict: %s\n", f.Name, f.Awaiting[why], why)
		}
	}
	fmt.Fprintf(w, "\nrolling restarts %d, server SIGKILLs %d, worker SIGKILLs %d, history shards acquired by a node %d, lost %d, executed twice %d\n", r.RollingRestarts, r.ServerKills, r.WorkerKills, r.ShardMoves, len(r.Lost), len(r.Twice))
	for _, id := range r.Lost {
		fmt.Fprintf(w, "  LOST %s\n", id)
	}
	if r.Slowest.ID != "" {
		fmt.Fprintf(w, "slowest action: %s\n", r.Slowest)
	}
	r.Report.Print(w)
}

func sortedKeys(m map[string]int) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
