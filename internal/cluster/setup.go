package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	uiserver "github.com/temporalio/ui-server/v2/server"
	uiserveroptions "github.com/temporalio/ui-server/v2/server/server_options"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/durallm/durallm/internal/devserver"
	"github.com/durallm/durallm/internal/haproxy"
	"github.com/durallm/durallm/workflows"
)

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
