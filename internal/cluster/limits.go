package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// The fleet-wide limits benchmark (`cluster limits`): the cluster's
// workers, all on one task queue, against providertest routes that
// enforce R requests and T tokens per minute of their own, once with
// the route's limits left to the provider and once kept by the fleet
// (routes' limits:, in the cluster's PostgreSQL); then, against a
// provider without limits, a route whose limits never bind beside one
// without any, for what the limiter adds to an attempt that need not
// wait. docs/performance.md has the figures.

// LimitsOptions bound the benchmark. Zero values take the defaults named.
type LimitsOptions struct {
	// RequestsPerMinute and TokensPerMinute are R and T, the provider's
	// limits and the fleet's. Default 300 and 20000.
	RequestsPerMinute, TokensPerMinute int
	// Concurrency is how many callers run actions one after another.
	// Default 64.
	Concurrency int
	// Duration is each limited run's length. Default 2m.
	Duration time.Duration
	// LatencyActions are the actions of the latency comparison, half on
	// each route. Default 400.
	LatencyActions int
	// Progress receives a line per phase.
	Progress io.Writer
}

func (o LimitsOptions) withDefaults() LimitsOptions {
	if o.RequestsPerMinute <= 0 {
		o.RequestsPerMinute = 300
	}
	if o.TokensPerMinute <= 0 {
		o.TokensPerMinute = 20000
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 64
	}
	if o.Duration <= 0 {
		o.Duration = 2 * time.Minute
	}
	if o.LatencyActions <= 0 {
		o.LatencyActions = 400
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return o
}

// The benchmark's routes.
const (
	routeOpen  = "open"  // no fleet limits, to a provider with R and T
	routeFleet = "fleet" // fleet limits R and T, to another provider with R and T
	routePlain = "plain" // no limits, to a provider without any
	routeRoomy = "roomy" // limits that never bind, to the same provider
)

// LimitsProviders are the providers the benchmark's routes reach: one
// per limited run (each with buckets of its own, full at the start) and
// one without limits. Start them before the cluster, whose routes name
// them (Routes).
type LimitsProviders struct {
	Open, Fleet, Plain *providertest.Provider
}

// StartLimitsProviders starts them.
func StartLimitsProviders(o LimitsOptions) (*LimitsProviders, error) {
	o = o.withDefaults()
	var ps LimitsProviders
	var err error
	limited := []providertest.Option{providertest.WithRequestsPerMinute(o.RequestsPerMinute), providertest.WithTokensPerMinute(o.TokensPerMinute)}
	if ps.Open, err = providertest.NewProvider(limited...); err != nil {
		return nil, err
	}
	if ps.Fleet, err = providertest.NewProvider(limited...); err != nil {
		ps.Close()
		return nil, err
	}
	if ps.Plain, err = providertest.NewProvider(); err != nil {
		ps.Close()
		return nil, err
	}
	for _, p := range []*providertest.Provider{ps.Open, ps.Fleet, ps.Plain} {
		p.SetDefault(providertest.Answer("ok"))
	}
	return &ps, nil
}

// Close stops them.
func (ps *LimitsProviders) Close() {
	for _, p := range []*providertest.Provider{ps.Open, ps.Fleet, ps.Plain} {
		if p != nil {
			p.Close()
		}
	}
}

// Routes is the workers' routes file (Options.Routes).
func (ps *LimitsProviders) Routes(o LimitsOptions) string {
	o = o.withDefaults()
	route := func(name string, p *providertest.Provider, limits string) string {
		s := fmt.Sprintf("  - name: %s\n    kind: openai\n    base_url: %s/v1\n    model: m\n", name, p.H2CURL())
		if limits != "" {
			s += "    limits: " + limits + "\n"
		}
		return s
	}
	return "routes:\n" +
		route(routeOpen, ps.Open, "") +
		route(routeFleet, ps.Fleet, fmt.Sprintf("{requests_per_minute: %d, tokens_per_minute: %d}", o.RequestsPerMinute, o.TokensPerMinute)) +
		route(routePlain, ps.Plain, "") +
		route(routeRoomy, ps.Plain, "{requests_per_minute: 1000000, tokens_per_minute: 100000000}")
}

// LimitsRun is one limited run.
type LimitsRun struct {
	Name string
	// Requests is every request the provider received, Throttled those
	// its limits answered 429.
	Requests, Throttled int
	// Completed are the actions completed within the run; Failed those
	// that ended otherwise (their attempts ran out on 429s).
	Completed, Failed int
	// Allowed is what the provider's limits admit over the run: a full
	// bucket at the start and the refill over Elapsed, in requests (the
	// tighter of R and T at the provider's own count per request).
	Allowed float64
	Elapsed time.Duration
	// Waited counts the attempts that waited for room; NoWait those that
	// had it at once, whose time in the limiter has p50 NoWaitP50.
	Waited, NoWait int
	NoWaitP50      time.Duration
	// Load is the machine's load average when the run began.
	Load string
}

// LimitsReport is the benchmark's result.
type LimitsReport struct {
	R, T int
	// TokensPerRequest is what the provider counts for one request.
	TokensPerRequest   int
	Unlimited, Fleet   LimitsRun
	Workers            int
	Concurrency        int
	LatencyN           int
	PlainP50, RoomyP50 time.Duration
	RoomyLimiterP50    time.Duration
	LatencyLoad        string
}

// run starts an action and waits for its result.
func run(ctx context.Context, dc *durallm.Client, id string, in workflows.ActionInput) (workflows.ActionResult, error) {
	a, err := dc.Start(ctx, id, in)
	if err != nil {
		return workflows.ActionResult{}, err
	}
	return a.Result(ctx)
}

// benchRequest is every action's request: a short prompt with an output
// bound, which OpenAI (and providertest) count against the tokens per
// minute whatever is generated.
func benchRequest(route string) workflows.ActionInput {
	return workflows.ActionInput{
		Request: providers.Request{Messages: []providers.Message{providers.TextMessage("user", "bench")},
			Params: map[string]json.RawMessage{providers.ParamMaxTokens: json.RawMessage("16")}},
		Routes: []string{route},
	}
}

// LimitsBench runs the benchmark on c, whose routes are ps.Routes(o).
func LimitsBench(ctx context.Context, c *Cluster, ps *LimitsProviders, o LimitsOptions) (LimitsReport, error) {
	o = o.withDefaults()
	dc, tc, err := c.Client(ctx)
	if err != nil {
		return LimitsReport{}, err
	}
	defer tc.Close()
	rep := LimitsReport{R: o.RequestsPerMinute, T: o.TokensPerMinute, Workers: len(c.Workers), Concurrency: o.Concurrency}
	prefix := "limits-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	// One action on the provider without limits gives the provider's
	// count of a request, and warms every worker's connections.
	for i := range 2 * len(c.Workers) {
		res, err := run(ctx, dc, fmt.Sprintf("%s-warm-%d", prefix, i), benchRequest(routePlain))
		if err != nil {
			return rep, fmt.Errorf("cluster: limits: warm-up: %w", err)
		}
		if len(res.Attempts) > 0 && res.Attempts[0].Usage != nil {
			rep.TokensPerRequest = res.Attempts[0].Usage.PromptTokens + 16
		}
	}
	if rep.TokensPerRequest == 0 {
		return rep, errors.New("cluster: limits: the provider reported no usage")
	}
	for _, ph := range []struct {
		out   *LimitsRun
		name  string
		route string
		p     *providertest.Provider
	}{
		{&rep.Unlimited, "without fleet limits", routeOpen, ps.Open},
		{&rep.Fleet, "with fleet limits", routeFleet, ps.Fleet},
	} {
		fmt.Fprintf(o.Progress, "· %s: %d callers for %s on route %s\n", ph.name, o.Concurrency, o.Duration, ph.route)
		r, err := limitedRun(ctx, dc, fmt.Sprintf("%s-%s", prefix, ph.route), ph.route, ph.p, o, rep.TokensPerRequest)
		if err != nil {
			return rep, err
		}
		r.Name = ph.name
		*ph.out = r
		fmt.Fprintf(o.Progress, "· %s: %d completed of %.0f allowed, %d of %d requests answered 429\n", ph.name, r.Completed, r.Allowed, r.Throttled, r.Requests)
	}
	fmt.Fprintf(o.Progress, "· latency: %d actions, alternating routes %s and %s\n", o.LatencyActions, routePlain, routeRoomy)
	rep.LatencyLoad = loadAverage()
	plain, roomy, limiter, err := latencyRun(ctx, dc, prefix+"-lat", o)
	if err != nil {
		return rep, err
	}
	rep.LatencyN = len(plain)
	rep.PlainP50, rep.RoomyP50, rep.RoomyLimiterP50 = percentile(plain, 0.5), percentile(roomy, 0.5), percentile(limiter, 0.5)
	return rep, nil
}

// limitedRun runs o.Concurrency callers, each starting an action on route
// as soon as its last one ended, for o.Duration; it waits for the last
// ones to end before it returns.
func limitedRun(ctx context.Context, dc *durallm.Client, prefix, route string, p *providertest.Provider, o LimitsOptions, perRequest int) (LimitsRun, error) {
	r := LimitsRun{Load: loadAverage()}
	start := time.Now()
	end := start.Add(o.Duration)
	var mu sync.Mutex
	var noWait []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	for caller := range o.Concurrency {
		wg.Go(func() {
			for n := 0; time.Now().Before(end); n++ {
				res, err := run(ctx, dc, fmt.Sprintf("%s-%d-%d", prefix, caller, n), benchRequest(route))
				done := time.Now()
				var ae *durallm.ActionError
				mu.Lock()
				switch {
				case errors.As(err, &ae):
					r.Failed++
				case err != nil:
					if firstErr == nil {
						firstErr = err
					}
				case done.Before(end):
					r.Completed++
				}
				for _, a := range res.Attempts {
					if c := a.Evidence.Capacity; c != nil {
						if c.Limit == "" {
							r.NoWait++
							noWait = append(noWait, c.Wait)
						} else {
							r.Waited++
						}
					}
				}
				mu.Unlock()
				if err != nil && ae == nil {
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return r, fmt.Errorf("cluster: limits: %s: %w", route, firstErr)
	}
	r.Elapsed = o.Duration
	r.Requests, r.Throttled = len(p.Received()), p.RateLimited().Total()
	minutes := o.Duration.Minutes()
	byRequests := float64(o.RequestsPerMinute) * (1 + minutes)
	byTokens := float64(o.TokensPerMinute) * (1 + minutes) / float64(perRequest)
	r.Allowed = min(byRequests, byTokens)
	r.NoWaitP50 = percentile(noWait, 0.5)
	return r, nil
}

// latencyRun alternates actions on the route without limits and the one
// whose limits never bind, 16 at a time: each attempt's time from its
// start in the worker to its evidence (the limiter's part included), and
// the limiter's part alone.
func latencyRun(ctx context.Context, dc *durallm.Client, prefix string, o LimitsOptions) (plain, roomy, limiter []time.Duration, err error) {
	var mu sync.Mutex
	next := make(chan int)
	var wg sync.WaitGroup
	var firstErr error
	for range 16 {
		wg.Go(func() {
			for i := range next {
				route := routePlain
				if i%2 == 1 {
					route = routeRoomy
				}
				res, err := run(ctx, dc, fmt.Sprintf("%s-%d", prefix, i), benchRequest(route))
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil && len(res.Attempts) == 1 {
					ev := res.Attempts[0].Evidence
					if route == routePlain {
						plain = append(plain, ev.Elapsed)
					} else if ev.Capacity != nil {
						roomy = append(roomy, ev.Capacity.Wait+ev.Elapsed)
						limiter = append(limiter, ev.Capacity.Wait)
					}
				}
				mu.Unlock()
			}
		})
	}
	for i := range o.LatencyActions {
		next <- i
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return nil, nil, nil, fmt.Errorf("cluster: limits: latency: %w", firstErr)
	}
	return plain, roomy, limiter, nil
}

// loadAverage is /proc/loadavg's first three figures ("" elsewhere).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// Print writes the report.
func (r LimitsReport) Print(w io.Writer) {
	fmt.Fprintf(w, "\nfleet-wide limits: %d worker processes, %d callers, a providertest route limited to %d requests and %d tokens per minute (%d tokens a request at its count)\n\n",
		r.Workers, r.Concurrency, r.R, r.T, r.TokensPerRequest)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "run\tload\trequests\t429s\t429s/requests\tcompleted\tfailed\tallowed\tcompleted/allowed\twaited\tno-wait p50 in limiter")
	for _, ph := range []LimitsRun{r.Unlimited, r.Fleet} {
		share := 0.0
		if ph.Requests > 0 {
			share = float64(ph.Throttled) / float64(ph.Requests)
		}
		p50 := "-"
		if ph.NoWait > 0 {
			p50 = ph.NoWaitP50.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.2f%%\t%d\t%d\t%.0f\t%.3f\t%d\t%s\n", ph.Name, ph.Load, ph.Requests, ph.Throttled, 100*share,
			ph.Completed, ph.Failed, ph.Allowed, float64(ph.Completed)/ph.Allowed, ph.Waited, p50)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nan attempt that need not wait (%d actions a route, load %s): p50 from its start in the worker to its evidence\n", r.LatencyN, r.LatencyLoad)
	fmt.Fprintf(w, "  without limits %s · with limits that never bind %s · added %s · of which in the limiter %s\n",
		r.PlainP50, r.RoomyP50, r.RoomyP50-r.PlainP50, r.RoomyLimiterP50)
}
