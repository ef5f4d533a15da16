package devserver

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"go.temporal.io/server/common/dynamicconfig"
	temporalserver "go.temporal.io/server/temporal"
)

const (
	testTaskQueue    = "devserver-test"
	testWorkflowName = "devserver-test-workflow"
	testUpdateName   = "set"
)

var (
	stateKey = temporal.NewSearchAttributeKeyKeyword("DurallmState")
	routeKey = temporal.NewSearchAttributeKeyKeyword("DurallmRoute")
	extraKey = temporal.NewSearchAttributeKeyInt64("DurallmExtra")
)

// testWorkflow waits for one Update, marks itself done through a search
// attribute, and returns: enough to exercise history, Updates, upserts and
// visibility in one short run.
func testWorkflow(ctx workflow.Context, in string) (string, error) {
	var got string
	if err := workflow.SetUpdateHandler(ctx, testUpdateName, func(ctx workflow.Context, v string) (string, error) {
		got = v
		return "ok:" + v, nil
	}); err != nil {
		return "", err
	}
	if err := workflow.Await(ctx, func() bool { return got != "" }); err != nil {
		return "", err
	}
	if err := workflow.UpsertTypedSearchAttributes(ctx, stateKey.ValueSet("done")); err != nil {
		return "", err
	}
	return in + "/" + got, nil
}

// testLogWriter forwards log output to t.Log until the test ends; server
// goroutines may still log during shutdown, and t.Log after the test
// panics.
type testLogWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func testLogger(t *testing.T) *slog.Logger {
	w := &testLogWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func portOf(t *testing.T, hostPort string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(hostPort)
	require.NoError(t, err)
	n, err := strconv.Atoi(p)
	require.NoError(t, err)
	return n
}

func startServer(t *testing.T, o Options) (*Server, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	begin := time.Now()
	s, err := Start(ctx, o)
	took := time.Since(begin)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop() })
	return s, took
}

func dial(t *testing.T, s *Server) client.Client {
	t.Helper()
	c, err := client.Dial(client.Options{
		HostPort:  s.FrontendHostPort(),
		Namespace: s.Namespace(),
		Logger:    sdklog.NewStructuredLogger(newFilteredLogger(testLogger(t), slog.LevelWarn, new(atomic.Bool))),
	})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

func httpGet(t *testing.T, url string) (int, string, string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(body)
}

func checkUI(t *testing.T, s *Server) {
	t.Helper()
	code, ctype, body := httpGet(t, s.UIURL())
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, ctype, "text/html")
	require.Contains(t, strings.ToLower(body), "<html")

	// The UI's API proxies to the frontend over gRPC.
	code, ctype, body = httpGet(t, s.UIURL()+"/api/v1/namespaces")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, ctype, "application/json")
	var list struct {
		Namespaces []struct {
			NamespaceInfo struct {
				Name string `json:"name"`
			} `json:"namespaceInfo"`
		} `json:"namespaces"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &list), body)
	var names []string
	for _, ns := range list.Namespaces {
		names = append(names, ns.NamespaceInfo.Name)
	}
	require.Contains(t, names, s.Namespace())
}

// waitForWorkflowIDs polls a visibility query until it returns wantID;
// visibility is written asynchronously after the workflow's own events.
func waitForWorkflowIDs(t *testing.T, c client.Client, query, wantID string) {
	t.Helper()
	var last []string
	require.Eventually(t, func() bool {
		resp, err := c.ListWorkflow(context.Background(), &workflowservice.ListWorkflowExecutionsRequest{Query: query})
		if err != nil {
			t.Logf("list %q: %v", query, err)
			return false
		}
		last = last[:0]
		for _, e := range resp.GetExecutions() {
			last = append(last, e.GetExecution().GetWorkflowId())
		}
		for _, id := range last {
			if id == wantID {
				return true
			}
		}
		return false
	}, 30*time.Second, 100*time.Millisecond, "query %q never returned %s (last: %v)", query, wantID, last)
}

func TestPersistenceAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	opts := Options{
		DataDir:      dir,
		FrontendPort: FreePort,
		UIPort:       FreePort,
		Namespace:    "durallm-test",
		SearchAttributes: map[string]enumspb.IndexedValueType{
			"DurallmState": enumspb.INDEXED_VALUE_TYPE_KEYWORD,
			"DurallmRoute": enumspb.INDEXED_VALUE_TYPE_KEYWORD,
		},
		Logger:   testLogger(t),
		Progress: func(step string) { t.Log("progress:", step) },
	}

	s1, firstStart := startServer(t, opts)
	t.Logf("first start (schema creation) took %v", firstStart)
	require.True(t, strings.HasPrefix(s1.FrontendHostPort(), "127.0.0.1:"), s1.FrontendHostPort())
	require.True(t, strings.HasPrefix(s1.UIURL(), "http://127.0.0.1:"), s1.UIURL())
	require.Equal(t, "durallm-test", s1.Namespace())
	require.FileExists(t, filepath.Join(dir, DatabaseFileName))
	checkUI(t, s1)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c1 := dial(t, s1)
	w := worker.New(c1, testTaskQueue, worker.Options{})
	w.RegisterWorkflowWithOptions(testWorkflow, workflow.RegisterOptions{Name: testWorkflowName})
	require.NoError(t, w.Start())

	run, err := c1.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                    "wf-1",
		TaskQueue:             testTaskQueue,
		TypedSearchAttributes: temporal.NewSearchAttributes(stateKey.ValueSet("started"), routeKey.ValueSet("r1")),
	}, testWorkflowName, "hello")
	require.NoError(t, err)

	upd, err := c1.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
		WorkflowID:   "wf-1",
		UpdateName:   testUpdateName,
		Args:         []any{"x"},
		WaitForStage: client.WorkflowUpdateStageCompleted,
	})
	require.NoError(t, err)
	var updResult string
	require.NoError(t, upd.Get(ctx, &updResult))
	require.Equal(t, "ok:x", updResult)

	var result string
	require.NoError(t, run.Get(ctx, &result))
	require.Equal(t, "hello/x", result)
	waitForWorkflowIDs(t, c1, `DurallmState = "done"`, "wf-1")

	w.Stop()
	c1.Close()
	require.NoError(t, s1.Stop())
	require.NoError(t, s1.Stop(), "Stop must be idempotent")

	// Restart with identical options on the same ports (so Stop must have
	// released them): nothing may fail as "already registered".
	opts.FrontendPort = portOf(t, s1.FrontendHostPort())
	opts.UIPort = portOf(t, strings.TrimPrefix(s1.UIURL(), "http://"))
	s2, restart := startServer(t, opts)
	t.Logf("restart took %v", restart)
	require.Equal(t, s1.FrontendHostPort(), s2.FrontendHostPort())
	require.Equal(t, s1.UIURL(), s2.UIURL())
	checkUI(t, s2)

	c2 := dial(t, s2)
	desc, err := c2.DescribeWorkflowExecution(ctx, "wf-1", "")
	require.NoError(t, err)
	require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, desc.GetWorkflowExecutionInfo().GetStatus())
	requireSearchAttributes(t, c2, s2.Namespace(), opts.SearchAttributes)
	waitForWorkflowIDs(t, c2, `DurallmState = "done" AND DurallmRoute = "r1"`, "wf-1")

	code, ctype, _ := httpGet(t, s2.WorkflowURL("wf-1"))
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, ctype, "text/html")
	require.Equal(t, s2.UIURL()+"/namespaces/durallm-test/workflows/wf-1", s2.WorkflowURL("wf-1"))
	c2.Close()
	require.NoError(t, s2.Stop())

	// A third start asks for one more search attribute, as a newer durallm
	// would; it must be usable as soon as Start returns.
	opts.SearchAttributes["DurallmExtra"] = enumspb.INDEXED_VALUE_TYPE_INT
	s3, addStart := startServer(t, opts)
	t.Logf("restart adding a search attribute took %v", addStart)
	c3 := dial(t, s3)
	requireSearchAttributes(t, c3, s3.Namespace(), opts.SearchAttributes)
	_, err = c3.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                    "wf-2",
		TaskQueue:             testTaskQueue,
		TypedSearchAttributes: temporal.NewSearchAttributes(extraKey.ValueSet(5)),
	}, testWorkflowName, "again")
	require.NoError(t, err)
	waitForWorkflowIDs(t, c3, `DurallmExtra = 5`, "wf-2")
	waitForWorkflowIDs(t, c3, `DurallmState = "done"`, "wf-1")
	require.NoError(t, s3.Stop())
}

func requireSearchAttributes(t *testing.T, c client.Client, ns string, want map[string]enumspb.IndexedValueType) {
	t.Helper()
	sas, err := c.OperatorService().ListSearchAttributes(context.Background(), &operatorservice.ListSearchAttributesRequest{Namespace: ns})
	require.NoError(t, err)
	for name, typ := range want {
		require.Equal(t, typ, sas.GetCustomAttributes()[name], "search attribute %s", name)
	}
}

func TestDisabledUIAndSearchAttributeTypeConflict(t *testing.T) {
	dir := t.TempDir()
	opts := Options{
		DataDir:          dir,
		FrontendPort:     FreePort,
		DisableUI:        true,
		SearchAttributes: map[string]enumspb.IndexedValueType{"DurallmState": enumspb.INDEXED_VALUE_TYPE_KEYWORD},
		Logger:           testLogger(t),
	}
	s, _ := startServer(t, opts)
	require.Equal(t, DefaultNamespace, s.Namespace())
	require.Empty(t, s.UIURL())
	require.Empty(t, s.WorkflowURL("wf"))
	require.NoError(t, s.Stop())

	opts.SearchAttributes["DurallmState"] = enumspb.INDEXED_VALUE_TYPE_INT
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := Start(ctx, opts)
	require.ErrorContains(t, err, `search attribute "DurallmState" already exists`)
}

func TestPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = ln.Close() }()
	busy := ln.Addr().(*net.TCPAddr).Port

	for _, tc := range []struct {
		service string
		opts    Options
	}{
		{"frontend", Options{FrontendPort: busy}},
		{"UI", Options{FrontendPort: FreePort, UIPort: busy}},
	} {
		t.Run(tc.service, func(t *testing.T) {
			dir := t.TempDir()
			tc.opts.DataDir = dir
			_, err := Start(context.Background(), tc.opts)
			var pe *PortInUseError
			require.True(t, errors.As(err, &pe), "got %v", err)
			require.Equal(t, tc.service, pe.Service)
			require.Contains(t, err.Error(), strconv.Itoa(busy))
			require.Contains(t, err.Error(), "choose another port")
			// Failing on the port leaves DataDir untouched.
			_, statErr := os.Stat(filepath.Join(dir, DatabaseFileName))
			require.True(t, os.IsNotExist(statErr), "database created despite port error")
		})
	}
}

func TestOptionsValidation(t *testing.T) {
	dir := t.TempDir()
	for name, o := range map[string]Options{
		"missing DataDir":    {},
		"bad frontend port":  {DataDir: dir, FrontendPort: 70000},
		"bad UI port":        {DataDir: dir, UIPort: -5},
		"UI port overflow":   {DataDir: dir, FrontendPort: 65000},
		"host not an IP":     {DataDir: dir, Host: "example.com"},
		"reserved attribute": {DataDir: dir, SearchAttributes: map[string]enumspb.IndexedValueType{"WorkflowId": enumspb.INDEXED_VALUE_TYPE_KEYWORD}},
		"untyped attribute":  {DataDir: dir, SearchAttributes: map[string]enumspb.IndexedValueType{"X": enumspb.INDEXED_VALUE_TYPE_UNSPECIFIED}},
		"negative retention": {DataDir: dir, Retention: -time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := o.resolve()
			require.Error(t, err)
		})
	}

	r, err := Options{DataDir: dir}.resolve()
	require.NoError(t, err)
	require.Equal(t, DefaultHost, r.bindHost)
	require.Equal(t, DefaultFrontendPort, r.FrontendPort)
	require.Equal(t, DefaultFrontendPort+1000, r.UIPort)
	require.Equal(t, DefaultNamespace, r.Namespace)
	require.Equal(t, DefaultRetention, r.Retention)
	require.Equal(t, slog.LevelWarn, r.LogLevel.Level())

	r, err = Options{DataDir: dir, Host: "0.0.0.0"}.resolve()
	require.NoError(t, err)
	require.Equal(t, "0.0.0.0", r.bindHost)
	require.Equal(t, "127.0.0.1", r.dialHost, "clients must dial loopback, not the wildcard")
}

// TestInternalPortRaceIsAnError covers the window between the port check
// and the server binding: a port taken in that instant makes the server
// call Fatal, which must come back as an error rather than end the process.
func TestInternalPortRaceIsAnError(t *testing.T) {
	r, err := Options{DataDir: t.TempDir(), FrontendPort: FreePort, DisableUI: true, Logger: testLogger(t)}.resolve()
	require.NoError(t, err)
	var res portReservation
	p, err := r.reservePorts(&res)
	require.NoError(t, err)
	require.NoError(t, res.release())
	ln, err := net.Listen("tcp", net.JoinHostPort(internalHost, strconv.Itoa(p.history)))
	require.NoError(t, err)
	defer func() { _ = ln.Close() }()

	sqlConf, err := r.prepareDatabase()
	require.NoError(t, err)
	opts, err := r.buildServerOptions(r.buildServerConfig(sqlConf, p), p)
	require.NoError(t, err)
	err = recoverFatal(func() error {
		_, err := temporalserver.NewServer(opts...)
		return err
	})
	require.ErrorContains(t, err, "address already in use")
}

// TestDynamicConfigOverrides: Options.DynamicConfig sets keys on top of
// the dev defaults (case-insensitively, as the server reads them), and a
// nil value removes a dev default.
func TestDynamicConfigOverrides(t *testing.T) {
	def := devDynamicConfig()
	cacheKey := dynamicconfig.HistoryCacheHostLevelMaxSize.Key()
	require.Contains(t, def, cacheKey)
	require.Equal(t, 1000, def[dynamicconfig.TransferProcessorMaxPollRPS.Key()], "the server's 20/s makes every action wait")

	r, err := Options{DataDir: t.TempDir(), DynamicConfig: map[string]any{
		"History.HostLevelCacheMaxSize": nil,
		"frontend.namespaceRPS":         5,
	}}.resolve()
	require.NoError(t, err)
	dc := r.dynamicConfig()
	require.NotContains(t, dc, cacheKey, "nil removes a dev default")
	require.Equal(t, 5, dc[dynamicconfig.FrontendMaxNamespaceRPSPerInstance.Key()])
	require.Len(t, dc, len(def))
	require.Contains(t, devDynamicConfig(), cacheKey, "the defaults are not mutated")
}
