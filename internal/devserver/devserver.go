// Package devserver runs a Temporal server and the Temporal Web UI inside
// the current process, persisting to a SQLite file, so that `durallm dev`
// gives a newcomer a working Temporal, its UI and the durallm worker from a
// single command with nothing else installed.
//
// It embeds go.temporal.io/server/temporal over the server's SQLite plugin
// and github.com/temporalio/ui-server/v2, wired the way the temporal CLI's
// own dev server does it (that package became internal in CLI v1.6.0).
package devserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	uiserver "github.com/temporalio/ui-server/v2/server"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/server/common/searchattribute/sadefs"
	"go.temporal.io/server/temporal"

	"github.com/durallm/durallm/telemetry"
)

// Defaults applied by Start to zero-valued Options fields.
const (
	// DefaultHost is the address the frontend and UI bind to: loopback
	// only, so a dev server is never reachable from the network by accident.
	DefaultHost = "127.0.0.1"
	// DefaultFrontendPort is Temporal's conventional frontend gRPC port, the
	// one the temporal CLI and SDKs assume.
	DefaultFrontendPort = 7233
	// DefaultNamespace is the namespace Temporal tooling assumes.
	DefaultNamespace = "default"
	// DefaultRetention keeps closed workflows for a week: the server's 24 h
	// default would make yesterday's actions disappear from a dev machine.
	DefaultRetention = 7 * 24 * time.Hour
	// DatabaseFileName is the SQLite file created inside Options.DataDir.
	DatabaseFileName = "temporal.db"

	// uiPortOffset follows the temporal CLI: UI on 8233 for frontend 7233.
	uiPortOffset = 1000
	// startupTimeout bounds how long Start waits for the frontend and UI
	// to answer. A cold start on 2 cores takes a few seconds; a minute
	// leaves room for a loaded machine while still failing eventually.
	startupTimeout = time.Minute
	// namespaceRefreshWait is how long a new search attribute alias can
	// take to reach every service's namespace cache (the server's
	// system.namespaceCacheRefreshInterval default is 2 s).
	namespaceRefreshWait = 2500 * time.Millisecond
)

// Options configures Start. The zero value of every field except DataDir
// selects a documented default.
type Options struct {
	// DataDir holds the SQLite database (DataDir/temporal.db). Required. It
	// is created (mode 0700) if missing; the schema is created on the first
	// start only, so later starts see earlier workflows.
	DataDir string

	// Host is the IP address the frontend and the UI bind to. Default
	// DefaultHost ("127.0.0.1"). "localhost" means 127.0.0.1. An
	// unspecified address ("0.0.0.0", "::") listens everywhere while the
	// advertised addresses (FrontendHostPort, UIURL) use 127.0.0.1. The
	// server's internal services always bind to 127.0.0.1.
	Host string

	// FrontendPort is the frontend gRPC port. 0 means DefaultFrontendPort
	// (7233); FreePort (-1) picks a free port.
	FrontendPort int

	// UIPort is the Web UI port. 0 means FrontendPort+1000 (8233 for 7233),
	// or a free port when FrontendPort is FreePort; FreePort (-1) picks a
	// free port. Ignored when DisableUI is set.
	UIPort int

	// DisableUI skips the Web UI; UIURL and WorkflowURL then return "".
	// Default false (UI on).
	DisableUI bool

	// CodecEndpoint, when set, is the codec server the Web UI asks to
	// decode payloads (see package codec). Default none.
	CodecEndpoint string

	// SQLitePragmas override the SQLite connection attributes (default
	// journal_mode=wal, synchronous=normal); a value "" removes one. For
	// benchmarks that compare settings.
	SQLitePragmas map[string]string
	// NoStatementCache runs the server's SQLite store without the
	// devserver's prepared-statement cache (see statementCache), as the
	// server alone would: for benchmarks that measure what it saves.
	NoStatementCache bool

	// DynamicConfig overrides the server's dynamic config on top of the
	// dev defaults (see devDynamicConfig), by key (for example
	// "history.transferProcessorMaxPollRPS"); a nil value removes a dev
	// default so the server's own default applies. Values take the types
	// the server's settings expect (int, float64, bool, string,
	// time.Duration). For benchmarks that compare settings and for
	// experiments. Default none.
	DynamicConfig map[string]any

	// Namespace is created if it does not exist yet (idempotent across
	// restarts). Default DefaultNamespace ("default").
	Namespace string

	// Retention is how long closed workflows are kept. It applies only when
	// Start creates the namespace; an existing namespace keeps its own.
	// Default DefaultRetention (7 days).
	Retention time.Duration

	// SearchAttributes are registered in Namespace. Registering one that
	// already exists with the same type is a no-op, so the same map can be
	// passed on every start; one that exists with a different type is an
	// error, because SQLite visibility cannot change a type in place.
	// Default none.
	SearchAttributes map[string]enumspb.IndexedValueType

	// Logger receives the server's (and UI's client's) log records at
	// LogLevel and above. Default slog.Default().
	Logger *slog.Logger

	// LogLevel is the minimum level forwarded to Logger; pass a
	// *slog.LevelVar to change it while running. Default slog.LevelWarn,
	// because the server logs hundreds of Info lines per start. Nothing
	// is forwarded once Stop begins unless LogLevel is Debug or lower.
	LogLevel slog.Leveler

	// Progress, if set, is called with human-readable lines as Start moves
	// through its steps ("opening SQLite at ...", "starting Temporal
	// server ...", "registering search attributes ...", "starting Web
	// UI ..."). Default: no progress output.
	Progress func(step string)
}

// Server is a running dev server. Its methods are safe for concurrent use.
type Server struct {
	temporal         temporal.Server
	ui               *uiserver.Server
	uiDone           chan error
	frontendHostPort string
	namespace        string
	uiURL            string
	quietLogs        *atomic.Bool
	stmtCache        *statementCache // nil with Options.NoStatementCache

	stopOnce sync.Once
	stopErr  error
}

// resolved is Options after defaults and validation, plus derived values.
type resolved struct {
	Options
	bindHost string // address services listen on
	dialHost string // address clients connect to
	dbPath   string
	logger   *slog.Logger // already filtered to LogLevel
	quiet    *atomic.Bool // silences logger during Stop
}

func (o Options) resolve() (*resolved, error) {
	if o.DataDir == "" {
		return nil, errors.New("devserver: Options.DataDir is required")
	}
	dataDir, err := filepath.Abs(o.DataDir)
	if err != nil {
		return nil, fmt.Errorf("devserver: resolving DataDir %q: %w", o.DataDir, err)
	}
	o.DataDir = dataDir

	if o.Host == "" {
		o.Host = DefaultHost
	}
	bindHost := o.Host
	if bindHost == "localhost" {
		bindHost = "127.0.0.1"
	}
	ip := net.ParseIP(bindHost)
	if ip == nil {
		return nil, fmt.Errorf("devserver: Host %q must be an IP address (or \"localhost\")", o.Host)
	}
	dialHost := bindHost
	if ip.IsUnspecified() {
		dialHost = "127.0.0.1"
	}

	if err := checkPort("FrontendPort", o.FrontendPort); err != nil {
		return nil, err
	}
	if o.FrontendPort == 0 {
		o.FrontendPort = DefaultFrontendPort
	}
	if !o.DisableUI {
		if err := checkPort("UIPort", o.UIPort); err != nil {
			return nil, err
		}
		if o.UIPort == 0 {
			if o.FrontendPort == FreePort {
				o.UIPort = FreePort
			} else if o.UIPort = o.FrontendPort + uiPortOffset; o.UIPort > 65535 {
				return nil, fmt.Errorf("devserver: default UIPort %d (FrontendPort+%d) is out of range; set UIPort", o.UIPort, uiPortOffset)
			}
		}
	}

	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.Retention == 0 {
		o.Retention = DefaultRetention
	}
	if o.Retention < 0 {
		return nil, fmt.Errorf("devserver: Retention %v must not be negative", o.Retention)
	}
	for name, typ := range o.SearchAttributes {
		if sadefs.IsReserved(name) {
			return nil, fmt.Errorf("devserver: search attribute %q is a reserved Temporal name; pick another", name)
		}
		if _, ok := enumspb.IndexedValueType_name[int32(typ)]; !ok || typ == enumspb.INDEXED_VALUE_TYPE_UNSPECIFIED {
			return nil, fmt.Errorf("devserver: search attribute %q has no valid type (%v)", name, typ)
		}
	}

	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.LogLevel == nil {
		o.LogLevel = slog.LevelWarn
	}
	if o.Progress == nil {
		o.Progress = func(string) {}
	}
	quiet := new(atomic.Bool)
	return &resolved{
		Options:  o,
		bindHost: bindHost,
		dialHost: dialHost,
		dbPath:   filepath.Join(dataDir, DatabaseFileName),
		logger:   newFilteredLogger(o.Logger, o.LogLevel, quiet),
		quiet:    quiet,
	}, nil
}

// Start opens (or creates) the SQLite database under o.DataDir, starts the
// Temporal server, makes sure the namespace and search attributes exist,
// starts the Web UI, and returns once the frontend answers for the
// namespace and the UI accepts HTTP requests. ctx bounds that wait (which
// is also capped at one minute); it does not control the server's
// lifetime: call Stop for that.
//
// On error Start stops whatever it started. The one exception is a port
// lost to another process between Start's check and the server binding
// it: the server then fails while being constructed, before there is
// anything to stop, and the listeners it had already opened stay open
// until the process exits.
func Start(ctx context.Context, o Options) (*Server, error) {
	r, err := o.resolve()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("devserver: not starting: %w", err)
	}

	// Ports are checked first: a port clash is the likeliest failure, and
	// finding it before touching DataDir leaves no half-initialized state.
	var reservation portReservation
	defer func() { _ = reservation.release() }()
	p, err := r.reservePorts(&reservation)
	if err != nil {
		return nil, err
	}

	r.Progress(fmt.Sprintf("opening SQLite at %s", r.dbPath))
	sqlConf, err := r.prepareDatabase()
	if err != nil {
		return nil, err
	}

	conf := r.buildServerConfig(sqlConf, p)
	srvOpts, err := r.buildServerOptions(conf, p)
	if err != nil {
		return nil, err
	}

	s := &Server{
		frontendHostPort: net.JoinHostPort(r.dialHost, strconv.Itoa(p.frontend)),
		namespace:        r.Namespace,
		quietLogs:        r.quiet,
	}
	if !r.NoStatementCache {
		s.stmtCache, err = newStatementCache(sqlConf, serverLogger{l: r.logger})
		switch {
		case errors.Is(err, errNotCacheable):
			r.logger.Warn("SQLite runs without the statement cache", "error", err)
		case err != nil:
			return nil, err
		}
	}
	started := false
	defer func() {
		if !started && s.stmtCache != nil {
			_ = s.stmtCache.Close() // every failed start; Stop's call is a no-op then
		}
	}()
	r.Progress(fmt.Sprintf("starting Temporal server on %s", s.frontendHostPort))
	// The reservation must end right before the server is built: it binds
	// its gRPC listeners while its components are constructed, and neither
	// it nor the UI can take over an already-open listener.
	if err := reservation.release(); err != nil {
		return nil, fmt.Errorf("devserver: releasing reserved ports: %w", err)
	}
	// recoverFatal turns the server's Fatal log calls (e.g. a port taken
	// in the instant since the check) into errors, which beats the process
	// exit the server's own logger would do.
	err = recoverFatal(func() error {
		var err error
		s.temporal, err = temporal.NewServer(srvOpts...)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("devserver: creating Temporal server: %w", err)
	}
	if err := recoverFatal(s.temporal.Start); err != nil {
		// A failed Start can leave some services running; Stop cleans up
		// whatever did start, and its shutdown chatter is not news.
		r.quiet.Store(true)
		_ = recoverFatal(s.temporal.Stop)
		return nil, fmt.Errorf("devserver: starting Temporal server: %w", err)
	}

	ctx, cancel := context.WithTimeout(ctx, startupTimeout)
	defer cancel()
	if err := s.finishStart(ctx, r, p); err != nil {
		_ = s.Stop()
		return nil, err
	}
	started = true
	return s, nil
}

// finishStart runs the steps that need a live frontend.
func (s *Server) finishStart(ctx context.Context, r *resolved, p ports) error {
	c, err := s.dialFrontend(ctx, r)
	if err != nil {
		return err
	}
	defer c.Close()

	if len(r.SearchAttributes) > 0 {
		r.Progress(fmt.Sprintf("registering search attributes in namespace %q", r.Namespace))
		if err := RegisterSearchAttributes(ctx, c, r.Namespace, r.SearchAttributes); err != nil {
			return err
		}
	}

	if r.DisableUI {
		return nil
	}
	s.uiURL = "http://" + net.JoinHostPort(r.dialHost, strconv.Itoa(p.ui))
	r.Progress(fmt.Sprintf("starting Web UI on %s", s.uiURL))
	return s.startUI(ctx, r, p.ui)
}

// dialFrontend connects an SDK client and waits until the frontend serves
// the namespace, which is the point at which a worker can start.
func (s *Server) dialFrontend(ctx context.Context, r *resolved) (client.Client, error) {
	var c client.Client
	err := poll(ctx, "the Temporal frontend at "+s.frontendHostPort, func(ctx context.Context) error {
		var err error
		o := client.Options{HostPort: s.frontendHostPort, Namespace: r.Namespace, Logger: telemetry.TemporalLogger(r.logger)}
		o.ConnectionOptions.GrpcCompression = &client.GrpcCompressionNone{} // loopback: see ClientOptions
		c, err = client.DialContext(ctx, o)
		return err
	})
	if err != nil {
		return nil, err
	}
	err = poll(ctx, fmt.Sprintf("namespace %q", r.Namespace), func(ctx context.Context) error {
		_, err := c.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: r.Namespace})
		return err
	})
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// RegisterSearchAttributes adds the attributes namespace ns lacks, refuses
// one that exists with another type, and returns once they can be used.
// The dev server created its namespace with the requested attributes on
// its first start (see prepareDatabase), so there it only does work when a
// later start asks for new ones; the cluster harness (internal/cluster)
// registers durallm's attributes with it.
func RegisterSearchAttributes(ctx context.Context, c client.Client, ns string, want map[string]enumspb.IndexedValueType) error {
	have, err := c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: ns})
	if err != nil {
		return fmt.Errorf("devserver: listing search attributes of %q: %w", ns, err)
	}
	missing := make(map[string]enumspb.IndexedValueType)
	for name, typ := range want {
		got, ok := have.GetCustomAttributes()[name]
		if !ok {
			missing[name] = typ
			continue
		}
		if got != typ {
			return fmt.Errorf("devserver: search attribute %q already exists in namespace %q as %v, not %v; "+
				"a type cannot be changed, use another name or a new DataDir", name, ns, got, typ)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if _, err := c.OperatorService().AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{
		Namespace:        ns,
		SearchAttributes: missing,
	}); err != nil {
		return fmt.Errorf("devserver: adding search attributes to %q: %w", ns, err)
	}
	// The new aliases are read through each service's namespace cache.
	// Wait until the frontend's cache accepts them in a query, then one
	// refresh interval more for history's cache (which maps them when a
	// workflow upserts), so that callers can use them as soon as Start
	// returns.
	err = poll(ctx, "new search attributes to become queryable", func(ctx context.Context) error {
		for name := range missing {
			if _, err := c.CountWorkflow(ctx, &workflowservice.CountWorkflowExecutionsRequest{
				Namespace: ns,
				Query:     name + " IS NULL",
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	select {
	case <-time.After(namespaceRefreshWait):
		return nil
	case <-ctx.Done():
		return fmt.Errorf("devserver: waiting for search attributes to propagate: %w", ctx.Err())
	}
}

// startUI starts the UI server and waits until it answers its health route.
func (s *Server) startUI(ctx context.Context, r *resolved, port int) error {
	s.ui = r.buildUIServer(s.frontendHostPort, port)
	s.uiDone = make(chan error, 1)
	ui := s.ui
	go func() {
		// Start blocks until Stop. It returns nil after Stop; on a bind
		// failure the UI library exits the process itself, which the
		// port check in Start exists to prevent.
		s.uiDone <- ui.Start()
	}()

	health := s.uiURL + "/healthz"
	hc := &http.Client{Timeout: 2 * time.Second}
	return poll(ctx, "the Web UI at "+s.uiURL, func(ctx context.Context) error {
		select {
		case err := <-s.uiDone:
			s.uiDone <- err // keep it for Stop
			return errors.Join(errStop, fmt.Errorf("devserver: Web UI server exited: %w", err))
		default:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, health, nil)
		if err != nil {
			return errors.Join(errStop, err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", health, resp.Status)
		}
		return nil
	})
}

// errStop marks a poll error as final.
var errStop = errors.New("devserver: not retrying")

// poll calls f until it succeeds, returns an error wrapping errStop, or ctx
// ends. Each attempt gets at most 5 s so one hung call cannot use up the
// whole startup budget.
func poll(ctx context.Context, what string, f func(context.Context) error) error {
	for {
		attemptCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := f(attemptCtx)
		cancel()
		if err == nil {
			return nil
		}
		if errors.Is(err, errStop) {
			return fmt.Errorf("devserver: waiting for %s: %w", what, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("devserver: waiting for %s: %w (last error: %w)", what, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// FrontendHostPort is the host:port clients and workers dial, e.g.
// "127.0.0.1:7233".
func (s *Server) FrontendHostPort() string { return s.frontendHostPort }

// ClientOptions are the SDK client options for this server: its address
// and namespace, and no gRPC compression, which on loopback costs CPU
// (6% of an action's, gzip on both ends) and saves nothing. Callers add
// their logger, interceptors and data converter.
func (s *Server) ClientOptions() client.Options {
	return client.Options{HostPort: s.frontendHostPort, Namespace: s.namespace, ConnectionOptions: client.ConnectionOptions{GrpcCompression: &client.GrpcCompressionNone{}}}
}

// Namespace is the namespace Start created or found.
func (s *Server) Namespace() string { return s.namespace }

// UIURL is the Web UI's base URL, e.g. "http://127.0.0.1:8233", or "" when
// the UI is disabled.
func (s *Server) UIURL() string { return s.uiURL }

// WorkflowURL links to the UI page of the latest run of workflowID in the
// server's namespace, or returns "" when the UI is disabled.
func (s *Server) WorkflowURL(workflowID string) string {
	if s.uiURL == "" {
		return ""
	}
	return s.uiURL + "/namespaces/" + url.PathEscape(s.namespace) + "/workflows/" + url.PathEscape(workflowID)
}

// Stop stops the UI, then the server, and waits for both. It is
// idempotent: later calls return the first call's result. Server logs are
// silenced from here on unless LogLevel is Debug, because a graceful
// shutdown logs a burst of expected warnings and errors.
//
// Ports are free again when Stop returns, so Start can be called again in
// the same process. One limitation comes from the server's SQLite plugin
// (v1.32): it keeps a process-wide pool of database handles that it never
// closes, so the SQLite file stays open until the process exits (a later
// Start over the same DataDir reuses that handle).
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		s.quietLogs.Store(true)
		var errs []error
		if s.ui != nil {
			s.ui.Stop()
			if err := <-s.uiDone; err != nil {
				errs = append(errs, fmt.Errorf("devserver: Web UI server: %w", err))
			}
		}
		if err := recoverFatal(s.temporal.Stop); err != nil {
			errs = append(errs, fmt.Errorf("devserver: stopping Temporal server: %w", err))
		}
		if s.stmtCache != nil {
			if err := s.stmtCache.Close(); err != nil {
				errs = append(errs, fmt.Errorf("devserver: closing SQLite: %w", err))
			}
		}
		s.stopErr = errors.Join(errs...)
	})
	return s.stopErr
}

// ensureDir creates dir with owner-only permissions: the database holds
// workflow payloads, which may include prompts and model output.
func ensureDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("devserver: creating DataDir: %w", err)
	}
	return nil
}
