package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/contrib/envconfig"
	"go.temporal.io/sdk/converter"
	sdklog "go.temporal.io/sdk/log"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/resultstore/pgstore"
	"github.com/durallm/durallm/telemetry"
)

// The connection code every command shares: its flags, the Temporal
// client every durallm command dials (the SDK's logger, telemetry, the
// payload codec, no gzip on loopback), and the wait for a server that is
// not up yet.

// connFlags are the flags every client command shares. Connection details
// come from the standard Temporal client environment (TEMPORAL_ADDRESS,
// TEMPORAL_NAMESPACE, TEMPORAL_TLS_*, TEMPORAL_API_KEY, a profile file);
// --address and --namespace override it.
type connFlags struct {
	address, namespace, taskQueue string
	// dialed is the namespace the last dial used, for durallm.Client's
	// Delete.
	dialed                   string
	encryptionKey, resultDir string
	journalDSN               string
	jsonOut                  bool
	stderr                   io.Writer

	keys       *codec.Keyring // once loaded, from --encryption-key
	keysLoaded bool
	rs         resultstore.Store       // once made, by results
	dc         converter.DataConverter // once made, by converter
}

// keyring is --encryption-key's keyring (nil when unset), loaded once:
// the same keys encrypt history, the journal and stored results.
func (c *connFlags) keyring() (*codec.Keyring, error) {
	if c.keysLoaded {
		return c.keys, nil
	}
	stderr := c.stderr
	if stderr == nil {
		stderr = os.Stderr
	}
	k, err := loadKeyring(c.encryptionKey, stderr)
	if err != nil {
		return nil, err
	}
	c.keys, c.keysLoaded = k, true
	return k, nil
}

func (c *connFlags) register(fs interface {
	StringVar(*string, string, string, string)
	BoolVar(*bool, string, bool, string)
}) {
	fs.StringVar(&c.address, "address", "", "Temporal frontend host:port (default: TEMPORAL_ADDRESS, else 127.0.0.1:7233)")
	fs.StringVar(&c.namespace, "namespace", "", "Temporal namespace (default: TEMPORAL_NAMESPACE, else default)")
	fs.StringVar(&c.taskQueue, "task-queue", durallm.DefaultTaskQueue, "task queue the durallm worker polls")
	fs.BoolVar(&c.jsonOut, "json", false, "print JSON instead of a summary")
	fs.StringVar(&c.encryptionKey, "encryption-key", os.Getenv("DURALLM_ENCRYPTION_KEY"), encryptionKeyHelp)
	fs.StringVar(&c.resultDir, "result-dir", envOr("DURALLM_RESULT_DIR", "durallm-results"), "where workers keep responses too large for history (a directory every worker and client sees; 'dev' uses DATA_DIR/results)")
	fs.StringVar(&c.journalDSN, "journal-dsn", os.Getenv("DURALLM_JOURNAL_DSN"), "a postgres:// URL: the attempt journal and the result store are in PostgreSQL (database durallm unless the URL names one; a worker creates and migrates it at start), not in --journal-dir and --result-dir; default $DURALLM_JOURNAL_DSN")
}

// instrument routes the client's (and its workers') metrics and traces to
// tel.
func instrument(opts *client.Options, tel *telemetry.Telemetry) error {
	if tel == nil {
		return nil
	}
	opts.MetricsHandler = tel.TemporalMetricsHandler()
	ti, err := tel.TracingInterceptor()
	if err != nil {
		return err
	}
	if ti != nil {
		opts.Interceptors = append(opts.Interceptors, ti)
	}
	return nil
}

// hostPort is the address opts dial.
func hostPort(opts client.Options) string {
	if opts.HostPort == "" {
		return client.DefaultHostPort
	}
	return opts.HostPort
}

// uncompressedOnLoopback turns the SDK's gRPC compression (gzip by
// default) off for a server on this machine, where it costs CPU on both
// ends and saves nothing: 6% of an action's CPU on the embedded server
// (docs/performance.md, "Where the CPU of an action goes"). A
// compression already chosen in o is kept.
func uncompressedOnLoopback(o *client.Options) {
	if o.ConnectionOptions.GrpcCompression != nil {
		return
	}
	addr := o.HostPort
	if addr == "" {
		addr = client.DefaultHostPort
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return
	}
	if host == "localhost" || net.ParseIP(host).IsLoopback() {
		o.ConnectionOptions.GrpcCompression = &client.GrpcCompressionNone{}
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// results is the result store a client of these flags reads and writes:
// --journal-dsn's database when set (connected on first use), else
// --result-dir. The keyring must be loaded first (keyring).
func (c *connFlags) results() resultstore.Store {
	if c.rs == nil {
		c.rs = resultstore.Dir{Path: c.resultDir, Keys: c.keys}
		if c.journalDSN != "" {
			c.rs = &pgResults{dsn: c.journalDSN, keys: c.keys}
		}
	}
	return c.rs
}

// converter is the data converter a client of these flags is dialed
// with (payloadConverter over results).
func (c *connFlags) converter() converter.DataConverter {
	if c.dc == nil {
		stderr := c.stderr
		if stderr == nil {
			stderr = os.Stderr
		}
		c.dc = payloadConverter(c.keys, c.results(), stderr)
	}
	return c.dc
}

// client wraps a Temporal client dialed by these flags as durallm's,
// resolving stored responses and payloads from results.
func (c *connFlags) client(tc client.Client) *durallm.Client {
	// dial loaded the keyring already.
	return durallm.NewClient(tc, c.taskQueue).WithResults(c.results()).WithDataConverter(c.converter()).WithNamespace(c.dialed)
}

// pgResults connects to the PostgreSQL result store on first use: only an
// action whose answer was stored by reference needs it.
type pgResults struct {
	dsn  string
	keys *codec.Keyring
	once sync.Once
	s    *pgstore.Store
	err  error
}

func (p *pgResults) store(ctx context.Context) (*pgstore.Store, error) {
	p.once.Do(func() {
		if p.s, p.err = pgstore.Connect(ctx, p.dsn); p.err == nil {
			p.s.Keys = p.keys
		}
	})
	return p.s, p.err
}

func (p *pgResults) Put(ctx context.Context, data []byte) (string, error) {
	s, err := p.store(ctx)
	if err != nil {
		return "", err
	}
	return s.Put(ctx, data)
}

func (p *pgResults) PutFor(ctx context.Context, actionRef string, data []byte) (string, error) {
	s, err := p.store(ctx)
	if err != nil {
		return "", err
	}
	return s.PutFor(ctx, actionRef, data)
}

func (p *pgResults) PutForAll(ctx context.Context, actionRefs []string, data []byte) (string, error) {
	s, err := p.store(ctx)
	if err != nil {
		return "", err
	}
	return s.PutForAll(ctx, actionRefs, data)
}

// Older and Release are the sweeper's: a client never sweeps.
func (p *pgResults) Older(ctx context.Context, t time.Time, each func(resultstore.Claim) error) error {
	s, err := p.store(ctx)
	if err != nil {
		return err
	}
	return s.Older(ctx, t, each)
}

func (p *pgResults) Release(ctx context.Context, claims []resultstore.Claim) (int, error) {
	s, err := p.store(ctx)
	if err != nil {
		return 0, err
	}
	return s.Release(ctx, claims)
}

// Limit is the store's: a pgstore.Store's default.
func (p *pgResults) Limit() int64 { return (&pgstore.Store{}).Limit() }

func (p *pgResults) Get(ctx context.Context, ref string) ([]byte, error) {
	if _, err := resultstore.Digest(pgstore.Scheme, ref); err != nil {
		return nil, err // not this store's: no connection needed to say so
	}
	s, err := p.store(ctx)
	if err != nil {
		return nil, err
	}
	return s.Get(ctx, ref)
}

func (c *connFlags) dial() (client.Client, error) { return c.dialWith(context.Background(), nil, nil) }

// dialWith dials with the SDK's metrics and, when configured, tracing
// going to tel (nil: neither), and data converter dc (nil: the flags'
// own, converter).
func (c *connFlags) dialWith(ctx context.Context, tel *telemetry.Telemetry, dc converter.DataConverter) (client.Client, error) {
	opts, err := envconfig.LoadDefaultClientOptions()
	if err != nil {
		return nil, fmt.Errorf("load Temporal client settings from the environment: %w", err)
	}
	if c.address != "" {
		opts.HostPort = c.address
	}
	if c.namespace != "" {
		opts.Namespace = c.namespace
	}
	stderr := c.stderr
	if stderr == nil {
		stderr = os.Stderr
	}
	if t := opts.ConnectionOptions.TLS; t != nil && t.InsecureSkipVerify {
		// Only an explicit TEMPORAL_TLS_DISABLE_HOST_VERIFICATION (or the
		// profile's disable_host_verification) gets here.
		fmt.Fprintln(stderr, "durallm: warning: TLS verification of the Temporal server is OFF (TEMPORAL_TLS_DISABLE_HOST_VERIFICATION); its identity is not checked")
	}
	if _, err := c.keyring(); err != nil {
		return nil, err
	}
	if dc == nil {
		dc = c.converter()
	}
	if err := finishClient(&opts, stderr, tel, dc); err != nil {
		return nil, err
	}
	c.dialed = opts.Namespace
	tc, err := client.DialContext(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("connect to Temporal at %s (is 'durallm dev' or a server running?): %w", hostPort(opts), err)
	}
	return tc, nil
}

// quietLogger keeps the Temporal SDK's own chatter, written to w, to
// warnings and errors, and withholds any result it logs
// (telemetry.TemporalLogger, which also logs a canceled activity, an
// expected outcome, below warnings).
func quietLogger(w io.Writer) sdklog.Logger {
	return telemetry.TemporalLogger(slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn})))
}

// Bounds of the wait between tries to reach Temporal at start.
const (
	firstRetry = time.Second
	maxRetry   = 15 * time.Second
)

// dialUntilReachable dials Temporal until it answers or ctx ends (SIGTERM,
// Ctrl-C). A worker started before its cluster, as a deploy that starts
// everything at once does, waits and says so on each try instead of
// exiting. Only an unreachable server is waited for: any other error
// (bad TLS or API-key settings, a refused credential) needs a person and
// ends the worker at once.
func dialUntilReachable(ctx context.Context, cf *connFlags, tel *telemetry.Telemetry, dc converter.DataConverter, log *slog.Logger) (client.Client, error) {
	wait := firstRetry
	for try := 1; ; try++ {
		tc, err := cf.dialWith(ctx, tel, dc)
		var unavailable *serviceerror.Unavailable
		switch {
		case err == nil:
			if try > 1 {
				log.Info("durallm worker: Temporal is reachable now", "tries", try)
			}
			return tc, nil
		case ctx.Err() != nil:
			return nil, fmt.Errorf("stopped while waiting for Temporal: %w", err)
		case !errors.As(err, &unavailable):
			return nil, err
		}
		log.Warn("durallm worker: Temporal not reachable yet; retrying (the worker waits, it does not exit)", "error", err, "try", try, "retry_in", wait)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("stopped while waiting for Temporal: %w", err)
		case <-time.After(wait):
		}
		wait = min(2*wait, maxRetry)
	}
}
