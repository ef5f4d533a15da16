// Command cluster runs durallm's production topology on loopback (package
// internal/cluster): scripts/cluster is its wrapper.
//
//	cluster up      bring it up, print where everything is, tear it down on Ctrl-C or SIGTERM
//	cluster chaos   bring it up, run a bounded chaos run (--faults, --stream), tear it down; exit 1 when an invariant broke
//	cluster bench   actions/s and p50/p99 on the cluster and on the embedded server, same run
//	cluster limits  four workers against a provider limited to R requests and T tokens a minute, with and without fleet-wide limits
//
// docs/deploy.md explains what each runs.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/durallm/durallm/internal/cluster"
	"github.com/durallm/durallm/testsuite/providertest"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: cluster up|chaos|bench|limits [flags]  (each has --help)")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "up":
		return up(ctx, args[1:], stdout, stderr)
	case "chaos":
		return chaosCmd(ctx, args[1:], stdout, stderr)
	case "bench":
		return benchCmd(ctx, args[1:], stdout, stderr)
	case "limits":
		return limitsCmd(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "cluster: unknown command %q (up, chaos, bench, limits)\n", args[0])
	return 2
}

// common are the flags every command shares.
func common(fs *flag.FlagSet, o *cluster.Options) {
	fs.StringVar(&o.Dir, "dir", "", "directory for the run's files (default: a temporary one, removed at the end)")
	fs.StringVar(&o.CacheDir, "cache-dir", "", "where the built Temporal server and schema tool are kept (default: the user cache dir)")
	fs.StringVar(&o.Namespace, "namespace", "default", "namespace to create")
	fs.StringVar(&o.HAProxy, "haproxy", "haproxy", "haproxy binary (Debian: apt-get install haproxy)")
	fs.BoolVar(&o.WorkersViaLB, "workers-via-lb", false, "give the workers the load-balanced frontend address instead of one node's frontend each")
	fs.BoolVar(&o.ProviderRecord, "provider-record", false, "give the workers' routes a provider record (provider_record: stored_completions): the provider stores what it generates, and the built-in reconciler settles from it an ambiguous attempt whose answer no worker saw")
}

func up(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cluster up", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := cluster.Options{Log: stderr}
	common(fs, &o)
	fs.IntVar(&o.UIPort, "ui-port", 0, "Web UI port (0: a free one; -1: no UI)")
	fs.IntVar(&o.FrontendPort, "port", 0, "port of the load-balanced frontend address (0: a free one)")
	demo := fs.Bool("demo", false, "once up, run the demonstration of 'durallm dev' (five actions, one left awaiting a verdict; the routes then reach the provider directly, without haproxy)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	o.DirectProvider = *demo
	start := time.Now()
	c, err := cluster.Start(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "cluster: %v\n", err)
		return 1
	}
	defer func() {
		fmt.Fprintln(stderr, "· stopping the workers, the servers and PostgreSQL")
		c.Stop()
		fmt.Fprintln(stderr, "· stopped; nothing left running")
	}()
	fmt.Fprintf(stderr, "· up in %s\n", time.Since(start).Round(time.Second))
	c.PrintSummary(stdout)
	if *demo {
		if err := cluster.RunDemo(ctx, c, stdout); err != nil {
			fmt.Fprintf(stderr, "cluster: demo: %v\n", err)
			return 1
		}
	}
	fmt.Fprintln(stdout, "Ctrl-C (or SIGTERM) stops everything.")
	<-ctx.Done()
	return 0
}

func chaosCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cluster chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := cluster.Options{Log: stderr, UIPort: -1}
	common(fs, &o)
	var co cluster.ChaosOptions
	fs.IntVar(&co.Concurrency, "concurrency", 16, "callers running actions one after another during the faults")
	fs.IntVar(&co.MaxActions, "max-actions", 3000, "cap on the actions started")
	fs.DurationVar(&co.ReloadEvery, "reload-every", time.Second, "graceful reload interval of the haproxy in front of the provider")
	fs.DurationVar(&co.Pause, "pause", 5*time.Second, "load-only time before, between and after the faults")
	fs.DurationVar(&co.KillDown, "kill-down", 5*time.Second, "how long the SIGKILLed server node stays down")
	fs.DurationVar(&co.Timeout, "timeout", 10*time.Minute, "bound on the chaos run (the cluster's start and stop come on top)")
	fs.Float64Var(&co.Faults, "faults", 0, "fraction of requests (0 to 1) the provider behind haproxy answers with a fault (the mix of 'durallm chaos --faults')")
	fs.BoolVar(&co.Stream, "stream", false, "stream every action (server-sent events); with --faults, stream stalls and cuts join the mix")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	// Before the cluster's start, which takes minutes.
	if err := co.Validate(); err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	co.Progress = stderr
	t0 := time.Now()
	c, err := cluster.Start(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "cluster: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "· up in %s\n", time.Since(t0).Round(time.Second))
	c.PrintSummary(stderr)
	rep, err := cluster.Chaos(ctx, c, co)
	fmt.Fprintln(stderr, "· stopping the workers, the servers and PostgreSQL")
	c.Stop()
	fmt.Fprintf(stderr, "· stopped; nothing left running (%s in all)\n", time.Since(t0).Round(time.Second))
	if err != nil {
		fmt.Fprintf(stderr, "cluster: chaos: %v\n", err)
		return 1
	}
	rep.Print(stdout)
	if rep.Failed() {
		return 1
	}
	return 0
}

func benchCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cluster bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := cluster.Options{Log: stderr, UIPort: -1, DirectProvider: true}
	common(fs, &o)
	var bo cluster.BenchOptions
	fs.IntVar(&bo.Actions, "actions", 200, "actions per concurrency level (at least 4 per caller)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	bo.Progress = stderr
	dir, err := os.MkdirTemp("", "durallm-bench-")
	if err != nil {
		fmt.Fprintf(stderr, "cluster: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	// The embedded default first, alone on the machine; then the cluster.
	p, err := providertest.NewProvider()
	if err != nil {
		fmt.Fprintf(stderr, "cluster: %v\n", err)
		return 1
	}
	fmt.Fprintln(stderr, "· the embedded default ('durallm dev': SQLite, one process)")
	rows, err := cluster.BenchEmbedded(ctx, dir, p, bo)
	p.Close()
	if err != nil {
		fmt.Fprintf(stderr, "cluster: %v\n", err)
		return 1
	}
	c, err := cluster.Start(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "cluster: %v\n", err)
		return 1
	}
	more, err := cluster.Bench(ctx, c, bo)
	c.Stop()
	if err != nil {
		fmt.Fprintf(stderr, "cluster: %v\n", err)
		return 1
	}
	cluster.PrintBench(stdout, append(rows, more...))
	return 0
}

func limitsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cluster limits", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := cluster.Options{Log: stderr, UIPort: -1}
	common(fs, &o)
	var lo cluster.LimitsOptions
	fs.IntVar(&o.Workers, "workers", 4, "durallm worker processes")
	fs.IntVar(&lo.RequestsPerMinute, "rpm", 300, "R: the provider's requests per minute, and the fleet's")
	fs.IntVar(&lo.TokensPerMinute, "tpm", 20000, "T: the provider's tokens per minute, and the fleet's")
	fs.IntVar(&lo.Concurrency, "concurrency", 64, "callers running actions one after another")
	fs.DurationVar(&lo.Duration, "duration", 2*time.Minute, "each limited run's length")
	fs.IntVar(&lo.LatencyActions, "latency-actions", 400, "actions of the latency comparison, half on each route")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if lo.RequestsPerMinute < 1 || lo.TokensPerMinute < 1 || lo.Concurrency < 1 || lo.Duration <= 0 || o.Workers < 1 {
		fmt.Fprintln(stderr, "cluster limits: --rpm, --tpm, --concurrency and --workers must be at least 1, --duration positive")
		return 2
	}
	lo.Progress = stderr
	ps, err := cluster.StartLimitsProviders(lo)
	if err != nil {
		fmt.Fprintf(stderr, "cluster: %v\n", err)
		return 1
	}
	defer ps.Close()
	o.Routes = ps.Routes(lo)
	c, err := cluster.Start(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "cluster: %v\n", err)
		return 1
	}
	rep, err := cluster.LimitsBench(ctx, c, ps, lo)
	c.Stop()
	if err != nil {
		fmt.Fprintf(stderr, "cluster: %v\n", err)
		return 1
	}
	rep.Print(stdout)
	return 0
}
