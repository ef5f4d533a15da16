package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/durallm/durallm/providers/routes"
)

// WorkerProc is one `durallm worker` process.
type WorkerProc struct {
	N int
	// Address is the frontend it dials (TEMPORAL_ADDRESS).
	Address string
	// Metrics is where it serves /metrics, /healthz and /readyz.
	Metrics string
	proc
}

// SharedWorkerFlags are the worker flags the compose stack's workers run
// with too (TestComposeAndHarnessShareConfig): the stop grace the compose
// stop_grace_period is sized for, and cleartext HTTP/2 to the demo
// provider.
var SharedWorkerFlags = []string{"--stop-timeout", "20s", "--allow-h2c"}

// routeNames are the routes of deploy/routes.yaml, which the harness
// points at its provider proxy through the environment overrides.
var routeNames = []string{"primary", "fallback"}

func (c *Cluster) newWorker(n int) (*WorkerProc, error) {
	p, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	address := c.Nodes[(n-1)%len(c.Nodes)].Frontend
	if c.o.WorkersViaLB {
		address = c.Frontend
	}
	metrics := "127.0.0.1:" + strconv.Itoa(p[0])
	routesFile := filepath.Join(c.o.Root, RoutesFile)
	if c.o.Routes != "" {
		routesFile = filepath.Join(c.o.Dir, "routes.yaml")
	}
	args := []string{"worker",
		"--routes", routesFile,
		"--metrics-addr", metrics, "--stream-addr", "",
		// The attempt journal and the result store in the cluster's own
		// PostgreSQL, as compose's workers have them (DURALLM_JOURNAL_DSN).
		"--journal-dsn", c.JournalDSN,
		"--max-concurrent-attempts", strconv.Itoa(c.o.MaxConcurrentAttempts),
	}
	args = append(append(args, SharedWorkerFlags...), c.o.WorkerArgs...)
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + c.o.Dir,
		"TEMPORAL_ADDRESS=" + address, "TEMPORAL_NAMESPACE=" + c.o.Namespace,
		// routes.yaml names these; the provider ignores them.
		"DURALLM_PRIMARY_API_KEY=demo", "DURALLM_FALLBACK_API_KEY=demo",
	}
	for _, r := range routeNames {
		if c.o.Routes != "" {
			break // the benchmark's own routes name their providers
		}
		if c.o.ProviderRecord {
			env = append(env, routes.EnvPrefix(r)+"PROVIDER_RECORD="+routes.ProviderRecordStoredCompletions)
		}
		if c.o.DirectProvider {
			env = append(env, routes.EnvPrefix(r)+"BASE_URL="+c.Provider.H2CURL()+"/v1")
			continue
		}
		// Through haproxy, which answers REFUSED_STREAM when its origin
		// fails after forwarding: see Route.Intermediary.
		env = append(env,
			routes.EnvPrefix(r)+"BASE_URL=http://"+c.ProviderProxy.Addr+"/v1",
			routes.EnvPrefix(r)+"INTERMEDIARY=true")
	}
	return &WorkerProc{
		N: n, Address: address, Metrics: metrics,
		proc: proc{name: fmt.Sprintf("durallm worker %d", n), path: c.bins.durallm, args: args, env: env, logPath: filepath.Join(c.o.Dir, fmt.Sprintf("worker-%d.log", n))},
	}, nil
}

// Start starts the worker process (again, after Stop or Kill).
func (w *WorkerProc) Start() error { return w.start() }

// Stop stops the worker gracefully (SIGTERM: it stops polling and gives
// in-flight attempts its stop timeout), SIGKILLing it after 30s.
func (w *WorkerProc) Stop() bool { return w.stop(30 * time.Second) }

// Kill SIGKILLs the worker.
func (w *WorkerProc) Kill() { w.kill() }

// WaitReady waits until the worker's /readyz answers 200: it polls and
// its Temporal server answers.
func (w *WorkerProc) WaitReady(ctx context.Context) error {
	if err := waitHTTP(ctx, "http://"+w.Metrics+"/readyz", time.Minute, &w.proc); err != nil {
		return fmt.Errorf("cluster: worker %d: %w\n%s", w.N, err, w.tail(4000))
	}
	return nil
}

// Command is the worker's command line, for the summary.
func (w *WorkerProc) Command() string {
	return strings.Join(append([]string{filepath.Base(w.path)}, w.args...), " ")
}
