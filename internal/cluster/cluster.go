// Package cluster runs durallm's production topology on loopback, for
// real: PostgreSQL (package pgserver), the temporal and
// temporal_visibility databases set up by the server's own schema tool,
// two Temporal server processes forming one cluster (each running
// frontend, history, matching and worker, with numHistoryShards > 1 so
// shards move between them), the namespace and durallm's search
// attributes, the Temporal Web UI, haproxy balancing the two frontends,
// the providertest provider behind an HTTP/2 haproxy, and two `durallm
// worker` processes on one task queue, each dialling a different
// frontend.
//
// The servers are the real go.temporal.io/server/cmd/server, built from
// the module pinned in go.mod (the same code the temporalio/server image
// runs), configured by the config template embedded in it with the
// settings of deploy/temporal/server.env and the dynamic config of
// deploy/temporal/dynamicconfig/durallm.yaml: the files docker-compose.yml
// uses. The schema is created by deploy/scripts/temporal-schema.sh, the
// compose stack's own job, with temporal-sql-tool built from the same
// module. The workers read deploy/routes.yaml with the environment
// overrides compose documents.
//
// scripts/cluster runs it (`up`, `chaos`, `bench`); docs/deploy.md says
// what it shows.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	uiserver "github.com/temporalio/ui-server/v2/server"
	"go.temporal.io/sdk/client"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/internal/chaos"
	"github.com/durallm/durallm/internal/demo"
	"github.com/durallm/durallm/internal/haproxy"
	"github.com/durallm/durallm/internal/pgserver"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/testsuite/providertest"
)

// The files the harness shares with docker-compose.yml, relative to the
// repository root.
const (
	ServerEnvFile     = "deploy/temporal/server.env"
	DynamicConfigFile = "deploy/temporal/dynamicconfig/durallm.yaml"
	SchemaScript      = "deploy/scripts/temporal-schema.sh"
	RoutesFile        = "deploy/routes.yaml"
	SearchAttrScript  = "deploy/scripts/register-search-attributes.sh"
)

// serverModule is the Temporal server's module; its version is the one
// this binary was built with (go.mod's pin).
const serverModule = "go.temporal.io/server"

// Namespace retention for a new namespace: the compose stack's default
// (DURALLM_NAMESPACE_RETENTION).
const retention = 72 * time.Hour

// TaskQueue is the task queue both workers poll: the durallm default, as
// in the compose stack.
const TaskQueue = attempt.DefaultTaskQueue

// JournalDatabase is the database of durallm's own state: the attempt
// journal and the result store the workers keep in PostgreSQL.
const JournalDatabase = "durallm"

// Options configure Start. Zero values take the defaults named.
type Options struct {
	// Root is the repository root (where deploy/ and go.mod are). Default:
	// found from the working directory upwards.
	Root string
	// Dir holds the run's files (PostgreSQL's data, logs, the journal);
	// default a fresh temporary directory, removed by Stop.
	Dir string
	// CacheDir keeps the built Temporal server and schema tool between
	// runs. Default $XDG_CACHE_HOME/durallm-cluster (os.UserCacheDir).
	CacheDir string
	// Namespace to create. Default "default".
	Namespace string
	// Nodes is the number of Temporal server processes. Default 2.
	Nodes int
	// Workers is the number of durallm worker processes. Default 2.
	Workers int
	// UIPort is the Web UI's port; 0 picks a free one; -1 turns it off.
	UIPort int
	// FrontendPort is the port of the load-balanced frontend address;
	// 0 picks a free one.
	FrontendPort int
	// HAProxy is the haproxy binary. Default "haproxy" on PATH.
	HAProxy string
	// Provider configures the providertest provider before the workers
	// start (its default behaviour, a script). Default: answer "ok".
	Provider func(*providertest.Provider)
	// DirectProvider points the workers' routes straight at the
	// provider, as the compose stack's demo provider is reached; the
	// default goes through ProviderProxy (haproxy), which the chaos run
	// reloads. The demonstration needs it direct: its GOAWAYs must reach
	// the worker, not haproxy.
	DirectProvider bool
	// WorkersViaLB gives every worker the load-balanced frontend address
	// instead of one node's frontend each.
	WorkersViaLB bool
	// ProviderRecord gives the workers' routes a provider record
	// (provider_record: stored_completions, through the environment
	// override DURALLM_ROUTE_<NAME>_PROVIDER_RECORD): the provider stores
	// what it generates, and the built-in reconciler settles an ambiguous
	// attempt no worker saw the answer of from it. Default false.
	ProviderRecord bool
	// WorkerArgs are extra flags for every worker.
	WorkerArgs []string
	// Routes, when set, is the workers' routes file (YAML), written into
	// the run's directory, instead of deploy/routes.yaml and its
	// environment overrides: for a benchmark with routes of its own.
	Routes string
	// MaxConcurrentAttempts per worker. Default 256 (the worker's).
	MaxConcurrentAttempts int
	// Log receives progress lines. Default io.Discard.
	Log io.Writer
}

// Cluster is a running topology. Stop ends every process it started.
type Cluster struct {
	o     Options
	bins  binaries
	say   func(format string, a ...any)
	shEnv map[string]string // deploy/temporal/server.env

	// PG is the PostgreSQL server of both Temporal databases and of
	// JournalDatabase.
	PG *pgserver.Server
	// Nodes are the Temporal server processes.
	Nodes []*Node
	// Frontend is the load-balanced frontend address (haproxy, TCP).
	Frontend string
	// Workers are the durallm worker processes.
	Workers []*WorkerProc
	// Provider is the providertest provider the routes point at, behind
	// ProviderProxy.
	Provider      *providertest.Provider
	ProviderProxy *haproxy.Proxy
	// Journal is the workers' shared attempt journal (in JournalDatabase).
	Journal journal.Journal
	// JournalDSN is JournalDatabase's connection URL.
	JournalDSN string
	// UIURL is the Web UI's base URL ("" when off).
	UIURL string

	frontendLB *haproxy.Proxy
	ui         *uiserver.Server
	uiDone     chan error
	undo       []func()
	stopOnce   sync.Once
}

// Start brings the topology up and returns once every worker reports
// ready. On error it stops what it started.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Cluster{o: o, say: func(format string, a ...any) { fmt.Fprintf(o.Log, "· "+format+"\n", a...) }}
	if err := c.start(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func (o Options) withDefaults() (Options, error) {
	if o.Root == "" {
		root, err := findRoot()
		if err != nil {
			return o, err
		}
		o.Root = root
	}
	if o.CacheDir == "" {
		d, err := os.UserCacheDir()
		if err != nil {
			return o, fmt.Errorf("cluster: no cache directory (set Options.CacheDir): %w", err)
		}
		o.CacheDir = filepath.Join(d, "durallm-cluster")
	}
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if o.Nodes <= 0 {
		o.Nodes = 2
	}
	if o.Workers <= 0 {
		o.Workers = 2
	}
	if o.HAProxy == "" {
		o.HAProxy = "haproxy"
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.MaxConcurrentAttempts <= 0 {
		o.MaxConcurrentAttempts = 256
	}
	return o, nil
}

// findRoot walks up from the working directory to the module root.
func findRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("cluster: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, ServerEnvFile)); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("cluster: no %s above the working directory; set Options.Root", ServerEnvFile)
		}
		dir = parent
	}
}

func (c *Cluster) start(ctx context.Context) error {
	for _, phase := range []func(context.Context) error{c.prepare, c.startDatabase, c.startServers, c.startFrontends, c.startProvider, c.startWorkers} {
		if err := phase(ctx); err != nil {
			return err
		}
	}
	return nil
}

// prepare makes the run's directory, reads the server's environment file
// and builds the binaries.
func (c *Cluster) prepare(ctx context.Context) error {
	o := c.o
	if o.Dir == "" {
		dir, err := os.MkdirTemp("", "durallm-cluster-")
		if err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
		c.o.Dir = dir
		c.undo = append(c.undo, func() { os.RemoveAll(dir) })
	} else if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if o.Routes != "" {
		if err := os.WriteFile(filepath.Join(c.o.Dir, "routes.yaml"), []byte(o.Routes), 0o644); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
	}
	env, err := ReadEnvFile(filepath.Join(o.Root, ServerEnvFile))
	if err != nil {
		return err
	}
	c.shEnv = env

	c.say("building the Temporal server, its schema tool and durallm (cached in %s)", o.CacheDir)
	c.bins, err = build(ctx, o.Root, o.CacheDir)
	return err
}

// startDatabase starts PostgreSQL with Temporal's schema and durallm's
// database.
func (c *Cluster) startDatabase(ctx context.Context) error {
	c.say("starting PostgreSQL")
	// In the system's temporary directory, not the run's: when root, the
	// server runs as the postgres user, who cannot enter a private
	// directory of root's (MkdirTemp makes them 0700).
	var err error
	if c.PG, err = pgserver.Start(ctx, pgserver.Options{Settings: []string{"max_connections=400"}}); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	c.undo = append(c.undo, func() { c.PG.Stop() })

	c.say("creating the temporal and temporal_visibility databases with temporal-sql-tool (%s)", SchemaScript)
	if err := c.setupSchema(ctx); err != nil {
		return err
	}
	return c.createJournalDatabase(ctx)
}

// startServers starts the Temporal server nodes and waits until all their
// services share one membership ring.
func (c *Cluster) startServers(ctx context.Context) error {
	for i := range c.o.Nodes {
		n, err := c.newNode(i + 1)
		if err != nil {
			return err
		}
		c.Nodes = append(c.Nodes, n)
		c.undo = append(c.undo, func() { n.Stop(30 * time.Second) })
	}
	// One after the other: on a fresh database the first node writes the
	// cluster metadata, and a second one racing it fails ("duplicate key
	// value violates unique constraint cluster_metadata_info_pkey").
	for _, n := range c.Nodes {
		c.say("starting Temporal server node %d (frontend %s, %d history shards over %d nodes)", n.N, n.Frontend, c.shards(), c.o.Nodes)
		if err := n.Start(); err != nil {
			return err
		}
		if err := n.WaitServing(ctx); err != nil {
			return err
		}
	}
	// Every node's services join one ring through the membership table.
	want := int64(4 * len(c.Nodes))
	return poll(ctx, fmt.Sprintf("%d services in the membership table", want), func(ctx context.Context) error {
		n, err := c.MembershipHosts(ctx)
		if err == nil && n < want {
			err = fmt.Errorf("%d of %d services heartbeating", n, want)
		}
		return err
	})
}

// startFrontends puts haproxy in front of the frontends, registers the
// namespace and starts the UI.
func (c *Cluster) startFrontends(ctx context.Context) error {
	if err := c.startFrontendLB(ctx); err != nil {
		return err
	}
	c.say("registering namespace %q and durallm's search attributes", c.o.Namespace)
	if err := c.registerNamespace(ctx); err != nil {
		return err
	}
	if c.o.UIPort >= 0 {
		return c.startUI(ctx)
	}
	return nil
}

// startProvider starts the fault-injecting provider behind its haproxy.
func (c *Cluster) startProvider(ctx context.Context) error {
	var err error
	if c.Provider, err = providertest.NewProvider(); err != nil {
		return fmt.Errorf("cluster: provider: %w", err)
	}
	c.undo = append(c.undo, func() { c.Provider.Close() })
	c.Provider.SetDefault(providertest.Answer("ok"))
	if c.o.Provider != nil {
		c.o.Provider(c.Provider)
	}
	if c.ProviderProxy, err = chaos.StartProviderProxy(ctx, c.o.HAProxy, c.o.Dir, strings.TrimPrefix(c.Provider.H2CURL(), "http://")); err != nil {
		return err
	}
	c.undo = append(c.undo, c.ProviderProxy.Stop)
	return nil
}

// startWorkers opens the workers' journal and starts the worker
// processes.
func (c *Cluster) startWorkers(ctx context.Context) error {
	// The chaos report reads the workers' journal to check its
	// invariants; opening it also creates its schema before the workers.
	pj, err := journal.OpenPostgres(ctx, c.JournalDSN)
	if err != nil {
		return err
	}
	c.undo = append(c.undo, pj.Close)
	c.Journal = pj
	for i := range c.o.Workers {
		w, err := c.newWorker(i + 1)
		if err != nil {
			return err
		}
		c.Workers = append(c.Workers, w)
		c.undo = append(c.undo, func() { w.Stop() })
		if c.o.WorkersViaLB {
			c.say("starting durallm worker %d on task queue %q, dialling the load-balanced frontend %s", w.N, TaskQueue, w.Address)
		} else {
			c.say("starting durallm worker %d on task queue %q, dialling node %d's frontend %s", w.N, TaskQueue, (i%len(c.Nodes))+1, w.Address)
		}
		if err := w.Start(); err != nil {
			return err
		}
	}
	for _, w := range c.Workers {
		if err := w.WaitReady(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Stop stops the workers, the UI, the proxies, the servers and
// PostgreSQL, and removes the run's directory unless Options.Dir named
// it. It is safe to call more than once.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		for i := len(c.undo) - 1; i >= 0; i-- {
			c.undo[i]()
		}
	})
}

// shards is NUM_HISTORY_SHARDS from server.env.
func (c *Cluster) shards() int {
	n, _ := strconv.Atoi(c.shEnv["NUM_HISTORY_SHARDS"])
	return n
}

// Dial returns a Temporal client on the load-balanced frontend.
func (c *Cluster) Dial(ctx context.Context) (client.Client, error) {
	return dial(ctx, c.Frontend, c.o.Namespace)
}

func dial(ctx context.Context, addr, ns string) (client.Client, error) {
	tc, err := client.DialContext(ctx, client.Options{HostPort: addr, Namespace: ns, Logger: telemetry.TemporalLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		return nil, fmt.Errorf("cluster: dial %s: %w", addr, err)
	}
	return tc, nil
}

// Namespace is the namespace the cluster serves durallm in.
func (c *Cluster) Namespace() string { return c.o.Namespace }

// Dir is the run's directory (logs, the journal).
func (c *Cluster) Dir() string { return c.o.Dir }

// PrintSummary writes where everything is and how to point durallm and
// the temporal CLI at it.
func (c *Cluster) PrintSummary(w io.Writer) {
	fmt.Fprintf(w, "\ndurallm on a %d-node Temporal cluster (server %s, %d history shards, PostgreSQL persistence and SQL visibility)\n\n", len(c.Nodes), c.bins.version, c.shards())
	fmt.Fprintf(w, "  PostgreSQL          %s (databases %s, %s, %s)\n", c.PG.DSN("postgres"), c.shEnv["DBNAME"], c.shEnv["VISIBILITY_DBNAME"], JournalDatabase)
	for _, n := range c.Nodes {
		fmt.Fprintf(w, "  Temporal node %d     frontend %s, HTTP %s, pid %d, log %s\n", n.N, n.Frontend, n.HTTP, n.Pid(), n.logPath)
	}
	fmt.Fprintf(w, "  frontends (haproxy) %s  <- clients, the UI\n", c.Frontend)
	if c.UIURL != "" {
		fmt.Fprintf(w, "  Web UI              %s/namespaces/%s/workflows\n", c.UIURL, c.o.Namespace)
	}
	if c.o.DirectProvider {
		fmt.Fprintf(w, "  provider            %s (providertest; the routes reach it directly)\n", c.Provider.H2CURL())
	} else {
		fmt.Fprintf(w, "  provider            %s (providertest; the routes reach it through haproxy %s)\n", c.Provider.H2CURL(), c.ProviderProxy.Addr)
	}
	if c.o.ProviderRecord {
		fmt.Fprintf(w, "  provider record     stored_completions on both routes: the provider stores what it generates\n")
	}
	for _, wk := range c.Workers {
		fmt.Fprintf(w, "  durallm worker %d    TEMPORAL_ADDRESS=%s, /readyz on http://%s, pid %d, log %s\n", wk.N, wk.Address, wk.Metrics, wk.Pid(), wk.logPath)
	}
	fmt.Fprintf(w, "  attempt journal     %s (journal and result store, shared by the workers)\n", c.JournalDSN)
	fmt.Fprintf(w, "\nPoint durallm and the temporal CLI at it:\n\n")
	fmt.Fprintf(w, "  export TEMPORAL_ADDRESS=%s TEMPORAL_NAMESPACE=%s\n", c.Frontend, c.o.Namespace)
	fmt.Fprintf(w, "  durallm run --route primary --message hello --journal-dsn '%s'\n", c.JournalDSN)
	fmt.Fprintf(w, "  durallm list --state completed\n")
	fmt.Fprintf(w, "  temporal workflow list --query 'DurallmState=\"completed\"'\n")
	fmt.Fprintf(w, "  temporal operator cluster describe\n\n")
}

// WorkflowURL links to an action's page in the Web UI ("" when off).
func (c *Cluster) WorkflowURL(id string) string {
	if c.UIURL == "" {
		return ""
	}
	return c.UIURL + "/namespaces/" + url.PathEscape(c.o.Namespace) + "/workflows/" + url.PathEscape(id)
}

// Client is a durallm client on the load-balanced frontend, resolving
// stored responses from the workers' result directory; close tc when done.
func (c *Cluster) Client(ctx context.Context) (dc *durallm.Client, tc client.Client, err error) {
	if tc, err = c.Dial(ctx); err != nil {
		return nil, nil, err
	}
	return durallm.NewClient(tc, TaskQueue).WithResults(resultstore.Dir{Path: filepath.Join(c.o.Dir, "results")}), tc, nil
}

// RunDemo runs the demonstration of 'durallm dev' (package demo) on the
// cluster; it needs Options.DirectProvider.
func RunDemo(ctx context.Context, c *Cluster, out io.Writer) error {
	if !c.o.DirectProvider {
		return errors.New("cluster: the demonstration needs Options.DirectProvider")
	}
	dc, tc, err := c.Client(ctx)
	if err != nil {
		return err
	}
	defer tc.Close()
	return demo.Run(ctx, out, dc, c.Provider, demo.Options{Routes: routeNames, Frontend: c.Frontend, WorkflowURL: c.WorkflowURL})
}
