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
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	uiserver "github.com/temporalio/ui-server/v2/server"
	uiserveroptions "github.com/temporalio/ui-server/v2/server/server_options"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/internal/chaos"
	"github.com/durallm/durallm/internal/demo"
	"github.com/durallm/durallm/internal/devserver"
	"github.com/durallm/durallm/internal/haproxy"
	"github.com/durallm/durallm/internal/pgserver"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
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
	// WorkerArgs are extra flags for every worker.
	WorkerArgs []string
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
	env, err := ReadEnvFile(filepath.Join(o.Root, ServerEnvFile))
	if err != nil {
		return err
	}
	c.shEnv = env

	c.say("building the Temporal server, its schema tool and durallm (cached in %s)", o.CacheDir)
	if c.bins, err = build(ctx, o.Root, o.CacheDir); err != nil {
		return err
	}

	c.say("starting PostgreSQL")
	// In the system's temporary directory, not the run's: when root, the
	// server runs as the postgres user, who cannot enter a private
	// directory of root's (MkdirTemp makes them 0700).
	if c.PG, err = pgserver.Start(ctx, pgserver.Options{Settings: []string{"max_connections=400"}}); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	c.undo = append(c.undo, func() { c.PG.Stop() })

	c.say("creating the temporal and temporal_visibility databases with temporal-sql-tool (%s)", SchemaScript)
	if err := c.setupSchema(ctx); err != nil {
		return err
	}
	if err := c.createJournalDatabase(ctx); err != nil {
		return err
	}

	for i := range o.Nodes {
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
		c.say("starting Temporal server node %d (frontend %s, %d history shards over %d nodes)", n.N, n.Frontend, c.shards(), o.Nodes)
		if err := n.Start(); err != nil {
			return err
		}
		if err := n.WaitServing(ctx); err != nil {
			return err
		}
	}
	// Every node's services join one ring through the membership table.
	want := int64(4 * len(c.Nodes))
	if err := poll(ctx, fmt.Sprintf("%d services in the membership table", want), func(ctx context.Context) error {
		n, err := c.MembershipHosts(ctx)
		if err == nil && n < want {
			err = fmt.Errorf("%d of %d services heartbeating", n, want)
		}
		return err
	}); err != nil {
		return err
	}
	if err := c.startFrontendLB(ctx); err != nil {
		return err
	}

	c.say("registering namespace %q and durallm's search attributes", o.Namespace)
	if err := c.registerNamespace(ctx); err != nil {
		return err
	}

	if o.UIPort >= 0 {
		if err := c.startUI(ctx); err != nil {
			return err
		}
	}

	if c.Provider, err = providertest.NewProvider(); err != nil {
		return fmt.Errorf("cluster: provider: %w", err)
	}
	c.undo = append(c.undo, func() { c.Provider.Close() })
	c.Provider.SetDefault(providertest.Answer("ok"))
	if o.Provider != nil {
		o.Provider(c.Provider)
	}
	if c.ProviderProxy, err = chaos.StartProviderProxy(ctx, o.HAProxy, c.o.Dir, strings.TrimPrefix(c.Provider.H2CURL(), "http://")); err != nil {
		return err
	}
	c.undo = append(c.undo, c.ProviderProxy.Stop)

	// The chaos report reads the workers' journal to check its
	// invariants; opening it also creates its schema before the workers.
	pj, err := journal.OpenPostgres(ctx, c.JournalDSN)
	if err != nil {
		return err
	}
	c.undo = append(c.undo, pj.Close)
	c.Journal = pj
	for i := range o.Workers {
		w, err := c.newWorker(i + 1)
		if err != nil {
			return err
		}
		c.Workers = append(c.Workers, w)
		c.undo = append(c.undo, func() { w.Stop() })
		if o.WorkersViaLB {
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

// binaries are the executables a cluster runs.
type binaries struct {
	server, sqlTool, durallm string
	schemaDir                string // the module's schema/postgresql/v12
	version                  string // the server module's version
}

// serverModuleInfo is the Temporal server module's directory and version
// in go.mod's build list, read in the repository at root.
func serverModuleInfo(ctx context.Context, root string) (dir, version string, err error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}\t{{.Version}}", serverModule)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", "", fmt.Errorf("cluster: locating %s: %w", serverModule, err)
	}
	dir, version, _ = strings.Cut(strings.TrimSpace(string(out)), "\t")
	return dir, version, nil
}

// build builds the Temporal server and temporal-sql-tool once per server
// version into cacheDir (a cold build takes minutes; go.mod's tool
// directives pin them to the module version the project builds with), and
// durallm every time (the Go build cache makes that quick).
func build(ctx context.Context, root, cacheDir string) (binaries, error) {
	modDir, version, err := serverModuleInfo(ctx, root)
	if err != nil {
		return binaries{}, err
	}
	bin := filepath.Join(cacheDir, "temporal-"+version, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return binaries{}, fmt.Errorf("cluster: %w", err)
	}
	b := binaries{
		server:  filepath.Join(bin, "temporal-server"),
		sqlTool: filepath.Join(bin, "temporal-sql-tool"),
		durallm: filepath.Join(cacheDir, "durallm"),
	}
	goBuild := func(out, pkg string, always bool) error {
		if _, err := os.Stat(out); err == nil && !always {
			return nil
		}
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out+".tmp", pkg)
		cmd.Dir = root
		if msg, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("cluster: go build %s: %w\n%s", pkg, err, msg)
		}
		return os.Rename(out+".tmp", out)
	}
	if err := goBuild(b.server, serverModule+"/cmd/server", false); err != nil {
		return b, err
	}
	if err := goBuild(b.sqlTool, serverModule+"/cmd/tools/sql", false); err != nil {
		return b, err
	}
	if err := goBuild(b.durallm, "./cmd/durallm", true); err != nil {
		return b, err
	}
	b.schemaDir = filepath.Join(modDir, "schema", "postgresql", "v12")
	b.version = version
	return b, nil
}

// ReadEnvFile reads KEY=VALUE lines (comments and blank lines skipped),
// the format docker compose's env_file takes.
func ReadEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("cluster: %s:%d: not KEY=VALUE: %q", path, n, line)
		}
		env[k] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("cluster: %s: %w", path, err)
	}
	return env, nil
}

// setupSchema runs the compose stack's schema job with the schema tool
// built from the server module and the module's own schema files.
func (c *Cluster) setupSchema(ctx context.Context) error {
	logPath := filepath.Join(c.o.Dir, "schema.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, "sh", filepath.Join(c.o.Root, SchemaScript))
	cmd.Env = []string{
		"PATH=" + filepath.Dir(c.bins.sqlTool) + string(os.PathListSeparator) + os.Getenv("PATH"),
		"SQL_PLUGIN=" + c.shEnv["DB"],
		"SQL_HOST=" + c.PG.Host,
		"SQL_PORT=" + strconv.Itoa(c.PG.Port),
		"SQL_USER=" + c.PG.User,
		// Trusted on loopback: the server asks for no password, and the
		// script requires one to be set.
		"SQL_PASSWORD=trust",
		"DB_NAME=" + c.shEnv["DBNAME"],
		"VISIBILITY_DB_NAME=" + c.shEnv["VISIBILITY_DBNAME"],
		"SCHEMA_DIR=" + c.bins.schemaDir,
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("cluster: %s failed (log: %s): %w", SchemaScript, logPath, err)
	}
	return nil
}

func (c *Cluster) createJournalDatabase(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.PG.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+JournalDatabase); err != nil {
		return fmt.Errorf("cluster: create database %s: %w", JournalDatabase, err)
	}
	c.JournalDSN = c.PG.DSN(JournalDatabase)
	return nil
}

func (c *Cluster) startFrontendLB(ctx context.Context) error {
	addr := "127.0.0.1:" + strconv.Itoa(c.o.FrontendPort)
	if c.o.FrontendPort == 0 {
		var err error
		if addr, err = haproxy.FreeAddr(); err != nil {
			return err
		}
	}
	var servers strings.Builder
	for _, n := range c.Nodes {
		// A node is out after one failed check and back after one good
		// one; a connection refused by a stopped node is redispatched.
		fmt.Fprintf(&servers, "  server node%d %s check inter 1s fall 1 rise 1\n", n.N, n.Frontend)
	}
	conf := fmt.Sprintf(`global
  hard-stop-after 30s
defaults
  mode tcp
  retries 3
  option redispatch
  timeout connect 2s
  # Longer than a long poll (70s) and a workflow Update's wait.
  timeout client 10m
  timeout server 10m
frontend temporal
  bind %s
  default_backend frontends
backend frontends
  balance roundrobin
%s`, addr, servers.String())
	c.say("starting haproxy (TCP) in front of the frontends on %s", addr)
	lb, err := haproxy.Start(ctx, c.o.HAProxy, c.o.Dir, "frontends", addr, conf)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	c.frontendLB, c.Frontend = lb, addr
	c.undo = append(c.undo, lb.Stop)
	return nil
}

// registerNamespace creates the namespace (an existing one is kept),
// registers durallm's search attributes (workflows.SearchAttributes, the
// list deploy/scripts/register-search-attributes.sh also registers) and
// waits until every node's frontend accepts queries on them.
func (c *Cluster) registerNamespace(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	tc, err := c.Dial(ctx)
	if err != nil {
		return err
	}
	defer tc.Close()
	_, err = tc.WorkflowService().RegisterNamespace(ctx, &workflowservice.RegisterNamespaceRequest{
		Namespace: c.o.Namespace, WorkflowExecutionRetentionPeriod: durationpb.New(retention),
	})
	var exists *serviceerror.NamespaceAlreadyExists
	if err != nil && !errors.As(err, &exists) {
		return fmt.Errorf("cluster: register namespace %q: %w", c.o.Namespace, err)
	}
	for _, n := range c.Nodes {
		if err := n.waitNamespace(ctx, c.o.Namespace); err != nil {
			return err
		}
	}
	if err := devserver.RegisterSearchAttributes(ctx, tc, c.o.Namespace, workflows.SearchAttributes); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	for _, n := range c.Nodes {
		if err := n.waitSearchAttributes(ctx, c.o.Namespace); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) startUI(ctx context.Context) error {
	port := c.o.UIPort
	if port == 0 {
		addr, err := haproxy.FreeAddr()
		if err != nil {
			return err
		}
		_, p, _ := net.SplitHostPort(addr)
		port, _ = strconv.Atoi(p)
	}
	c.UIURL = "http://127.0.0.1:" + strconv.Itoa(port)
	c.say("starting the Temporal Web UI on %s (through the load-balanced frontend)", c.UIURL)
	c.ui = uiserver.NewServer(uiserveroptions.WithConfigProvider(devserver.UIConfig("127.0.0.1", port, c.Frontend, c.o.Namespace, "")))
	c.uiDone = make(chan error, 1)
	ui := c.ui
	go func() { c.uiDone <- ui.Start() }()
	c.undo = append(c.undo, func() { ui.Stop(); <-c.uiDone })
	return waitHTTP(ctx, c.UIURL+"/healthz", time.Minute, nil)
}

// waitHTTP polls url until it answers 200 or the wait ends; p, when not
// nil, is the process that serves it, and its exit ends the wait.
func waitHTTP(ctx context.Context, url string, wait time.Duration, p *proc) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	hc := &http.Client{Timeout: 2 * time.Second}
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		last = err
		if p != nil && !p.running() {
			return fmt.Errorf("cluster: %s exited before %s answered (log %s)", p.name, url, p.logPath)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: %s did not answer 200 within %s: %w", url, wait, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// maxMembershipPort bounds the ports the harness picks: the server keeps
// each membership port in cluster_membership.rpc_port, a PostgreSQL
// smallint, and refuses to start on one above 32767 ("value out of range
// for type smallint"), which is where Linux hands out ephemeral ports
// (32768-60999). Every port is picked below it, so nothing the kernel
// picks for a client connection takes it either.
const maxMembershipPort = 32767

// nextPort is where the search for a free port goes on.
var (
	portMu   sync.Mutex
	nextPort = 20000 + os.Getpid()%10000
)

// freePorts picks n free loopback ports in [20000, 32767].
func freePorts(n int) ([]int, error) {
	portMu.Lock()
	defer portMu.Unlock()
	var ports []int
	for tries := 0; len(ports) < n && tries < 12768; tries++ {
		p := nextPort
		if nextPort++; nextPort > maxMembershipPort {
			nextPort = 20000
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		l.Close()
		ports = append(ports, p)
	}
	if len(ports) < n {
		return nil, fmt.Errorf("cluster: no %d free ports in 20000-%d", n, maxMembershipPort)
	}
	return ports, nil
}

// proc is a child process that can be stopped, killed and started again
// with the same command line and environment.
type proc struct {
	name    string
	path    string
	args    []string
	env     []string
	logPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(p.path, p.args...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = logf, logf
	// A harness that dies without its clean-up takes its children along.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cluster: start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.cmd, p.done = cmd, done
	return nil
}

// running reports whether the process was started and has not exited.
func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Pid is the running process's id (0 when none).
func (p *proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// stop sends SIGTERM and waits up to grace, then SIGKILLs; it reports
// whether the process ended within grace.
func (p *proc) stop(grace time.Duration) bool {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return true
	}
	select {
	case <-done:
		return true
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
		return true
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
		return false
	}
}

// kill sends SIGKILL and reaps the process.
func (p *proc) kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// tail is the last n bytes of the process's log.
func (p *proc) tail(n int) string {
	b, _ := os.ReadFile(p.logPath)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.TrimSpace(b))
}

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

// ShardAcquisitions is the sum of the history shards' range ids: each
// time a node acquires a shard (at start, or taking it over from another
// node) it bumps the shard's range id, so the growth of this sum over a
// run counts the shard movements.
func (c *Cluster) ShardAcquisitions(ctx context.Context) (int64, error) {
	return c.queryInt(ctx, c.shEnv["DBNAME"], "SELECT COALESCE(SUM(range_id), 0) FROM shards")
}

// MembershipHosts counts the services heartbeating in the cluster's
// membership table in the last 30 s: 4 per node (frontend, history,
// matching, worker) when every node has joined the one cluster.
func (c *Cluster) MembershipHosts(ctx context.Context) (int64, error) {
	return c.queryInt(ctx, c.shEnv["DBNAME"], "SELECT COUNT(*) FROM cluster_membership WHERE last_heartbeat > NOW() - INTERVAL '30 seconds'")
}

func (c *Cluster) queryInt(ctx context.Context, db, q string) (int64, error) {
	conn, err := pgx.Connect(ctx, c.PG.DSN(db))
	if err != nil {
		return 0, fmt.Errorf("cluster: %w", err)
	}
	defer conn.Close(ctx)
	var n int64
	if err := conn.QueryRow(ctx, q).Scan(&n); err != nil {
		return 0, fmt.Errorf("cluster: %s: %w", q, err)
	}
	return n, nil
}
