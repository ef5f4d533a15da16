package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"go.temporal.io/api/workflowservice/v1"

	"github.com/durallm/durallm/workflows"
)

// Node is one Temporal server process: frontend, history, matching and
// worker services, joined to the others through the membership table in
// PostgreSQL.
type Node struct {
	N int
	// Frontend is the node's own frontend gRPC address; HTTP its HTTP API.
	Frontend, HTTP string
	// Env is the environment the node runs with: server.env plus where
	// things are (written to node-N.env in the run's directory).
	Env map[string]string
	proc
}

// TopologyKeys are the server settings the harness sets per node on top
// of deploy/temporal/server.env: where the database is and how to log
// in, the addresses and ports, the dynamic config file's path and the
// metrics endpoint. docker-compose.yml's temporal service may set these
// and nothing else (TestComposeAndHarnessShareConfig).
var TopologyKeys = []string{
	"POSTGRES_SEEDS", "DB_PORT", "POSTGRES_USER", "POSTGRES_PWD",
	"BIND_ON_IP", "TEMPORAL_BROADCAST_ADDRESS", "DYNAMIC_CONFIG_FILE_PATH", "PROMETHEUS_ENDPOINT",
	"FRONTEND_GRPC_PORT", "FRONTEND_HTTP_PORT", "FRONTEND_MEMBERSHIP_PORT",
	"HISTORY_GRPC_PORT", "HISTORY_MEMBERSHIP_PORT",
	"MATCHING_GRPC_PORT", "MATCHING_MEMBERSHIP_PORT",
	"WORKER_GRPC_PORT", "WORKER_MEMBERSHIP_PORT",
}

func (c *Cluster) newNode(n int) (*Node, error) {
	p, err := freePorts(10)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	for k, v := range c.shEnv {
		env[k] = v
	}
	for k, v := range map[string]string{
		"POSTGRES_SEEDS": c.PG.Host, "DB_PORT": strconv.Itoa(c.PG.Port),
		"POSTGRES_USER": c.PG.User, "POSTGRES_PWD": "",
		"BIND_ON_IP": "127.0.0.1", "TEMPORAL_BROADCAST_ADDRESS": "127.0.0.1",
		"DYNAMIC_CONFIG_FILE_PATH": filepath.Join(c.o.Root, DynamicConfigFile),
		"PROMETHEUS_ENDPOINT":      "127.0.0.1:" + strconv.Itoa(p[8]),
		"FRONTEND_GRPC_PORT":       strconv.Itoa(p[0]), "FRONTEND_HTTP_PORT": strconv.Itoa(p[1]), "FRONTEND_MEMBERSHIP_PORT": strconv.Itoa(p[2]),
		"HISTORY_GRPC_PORT": strconv.Itoa(p[3]), "HISTORY_MEMBERSHIP_PORT": strconv.Itoa(p[4]),
		"MATCHING_GRPC_PORT": strconv.Itoa(p[5]), "MATCHING_MEMBERSHIP_PORT": strconv.Itoa(p[6]),
		"WORKER_GRPC_PORT": strconv.Itoa(p[7]), "WORKER_MEMBERSHIP_PORT": strconv.Itoa(p[9]),
	} {
		env[k] = v
	}
	// Only these variables: a caller's TEMPORAL_TLS_* or TEMPORAL_AUTH_*
	// must not change what the template renders.
	list := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + c.o.Dir}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var file []byte
	for _, k := range keys {
		list = append(list, k+"="+env[k])
		file = append(file, k+"="+env[k]+"\n"...)
	}
	if err := os.WriteFile(filepath.Join(c.o.Dir, fmt.Sprintf("node-%d.env", n)), file, 0o600); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	return &Node{
		N: n, Env: env,
		Frontend: net.JoinHostPort("127.0.0.1", env["FRONTEND_GRPC_PORT"]),
		HTTP:     "http://" + net.JoinHostPort("127.0.0.1", env["FRONTEND_HTTP_PORT"]),
		// No config file: the server renders its embedded template from
		// the environment, as the temporalio/server image does.
		proc: proc{name: fmt.Sprintf("temporal server node %d", n), path: c.bins.server, args: []string{"start"}, env: list, logPath: filepath.Join(c.o.Dir, fmt.Sprintf("node-%d.log", n))},
	}, nil
}

// Start starts the node's process (again, after Stop or Kill).
func (n *Node) Start() error { return n.start() }

// Stop stops the node gracefully (SIGTERM), SIGKILLing it after grace;
// it reports whether it ended within grace.
func (n *Node) Stop(grace time.Duration) bool { return n.stop(grace) }

// Kill SIGKILLs the node.
func (n *Node) Kill() { n.kill() }

// WaitServing waits until the node's frontend answers its HTTP API (the
// compose healthcheck's test).
func (n *Node) WaitServing(ctx context.Context) error {
	if err := waitHTTP(ctx, n.HTTP+"/api/v1/system-info", 2*time.Minute, &n.proc); err != nil {
		return fmt.Errorf("cluster: node %d: %w\n%s", n.N, err, n.tail(4000))
	}
	return nil
}

// waitNamespace waits until the node's frontend knows the namespace.
func (n *Node) waitNamespace(ctx context.Context, ns string) error {
	tc, err := dial(ctx, n.Frontend, ns)
	if err != nil {
		return err
	}
	defer tc.Close()
	return poll(ctx, fmt.Sprintf("namespace %q on node %d", ns, n.N), func(ctx context.Context) error {
		_, err := tc.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: ns})
		return err
	})
}

// waitSearchAttributes waits until the node's frontend accepts a query
// on each of durallm's search attributes.
func (n *Node) waitSearchAttributes(ctx context.Context, ns string) error {
	tc, err := dial(ctx, n.Frontend, ns)
	if err != nil {
		return err
	}
	defer tc.Close()
	return poll(ctx, fmt.Sprintf("durallm's search attributes on node %d", n.N), func(ctx context.Context) error {
		for name := range workflows.SearchAttributes {
			if _, err := tc.CountWorkflow(ctx, &workflowservice.CountWorkflowExecutionsRequest{Namespace: ns, Query: name + " IS NULL"}); err != nil {
				return err
			}
		}
		return nil
	})
}

// poll calls f until it succeeds or ctx ends.
func poll(ctx context.Context, what string, f func(context.Context) error) error {
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := f(actx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: waiting for %s: %w (last error: %w)", what, ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
