package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/durallm/durallm/attempt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/contrib/envconfig"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/codec"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/resultstore/pgstore"
	"github.com/durallm/durallm/telemetry"
	"github.com/durallm/durallm/workflows"
)

// connFlags are the flags every client command shares. Connection details
// come from the standard Temporal client environment (TEMPORAL_ADDRESS,
// TEMPORAL_NAMESPACE, TEMPORAL_TLS_*, TEMPORAL_API_KEY, a profile file);
// --address and --namespace override it.
type connFlags struct {
	address, namespace, taskQueue string
	encryptionKey, resultDir      string
	journalDSN                    string
	jsonOut                       bool
	stderr                        io.Writer

	keys       *codec.Keyring // once loaded, from --encryption-key
	keysLoaded bool
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

// client wraps a Temporal client as durallm's, resolving stored responses
// from --journal-dsn's database when set, else from --result-dir.
func (c *connFlags) client(tc client.Client) *durallm.Client {
	// dial loaded the keyring already.
	var rs resultstore.Store = resultstore.Dir{Path: c.resultDir, Keys: c.keys}
	if c.journalDSN != "" {
		rs = &pgResults{dsn: c.journalDSN, keys: c.keys}
	}
	return durallm.NewClient(tc, c.taskQueue).WithResults(rs)
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

func (c *connFlags) dial() (client.Client, error) { return c.dialWith(context.Background(), nil) }

// dialWith dials with the SDK's metrics and, when configured, tracing
// going to tel (nil: neither).
func (c *connFlags) dialWith(ctx context.Context, tel *telemetry.Telemetry) (client.Client, error) {
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
	opts.Logger = quietLogger(stderr)
	uncompressedOnLoopback(&opts)
	if err := instrument(&opts, tel); err != nil {
		return nil, err
	}
	if t := opts.ConnectionOptions.TLS; t != nil && t.InsecureSkipVerify {
		// Only an explicit TEMPORAL_TLS_DISABLE_HOST_VERIFICATION (or the
		// profile's disable_host_verification) gets here.
		fmt.Fprintln(stderr, "durallm: warning: TLS verification of the Temporal server is OFF (TEMPORAL_TLS_DISABLE_HOST_VERIFICATION); its identity is not checked")
	}
	k, err := c.keyring()
	if err != nil {
		return nil, err
	}
	if k != nil {
		opts.DataConverter = codec.DataConverter(k)
	}
	tc, err := client.DialContext(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("connect to Temporal at %s (is 'durallm dev' or a server running?): %w", hostPort(opts), err)
	}
	return tc, nil
}

func runStart(args []string, stdout, stderr io.Writer, wait bool) int {
	name := "start"
	if wait {
		name = "run"
	}
	fs := newFlags(name, "--route NAME[,NAME...] (--message TEXT | --input FILE) [flags]", stderr)
	var cf connFlags
	cf.register(fs)
	var routes listFlag
	fs.Var(&routes, "route", "route names in order: primary, then fallbacks (repeatable or comma-separated)")
	id := fs.String("id", "", "action id (default: a generated one); also the default idempotency key")
	message := fs.String("message", "", "a single user message")
	inputFile := fs.String("input", "", "a JSON file holding a whole ActionInput (see docs/workflow.md); - for stdin")
	maxAttempts := fs.Int("max-attempts", 0, "attempt budget (0: the workflow's default, 4)")
	deadline := fs.Duration("deadline", 0, "overall deadline (0: the workflow's default, 5m)")
	stream := fs.Bool("stream", false, "ask the provider to stream")
	waitFor := fs.Duration("wait", 0, "run: give up waiting after this long (0: wait for the terminal state)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	in, err := actionInput(*inputFile, *message, routes, *maxAttempts, *deadline, *stream)
	if err != nil {
		fmt.Fprintf(stderr, "durallm %s: %v\n", name, err)
		return exitUsage
	}
	if *id == "" {
		*id = "action-" + time.Now().UTC().Format("20060102-150405.000000")
	}
	tc, err := cf.dial()
	if err != nil {
		fmt.Fprintf(stderr, "durallm %s: %v\n", name, err)
		return exitError
	}
	defer tc.Close()
	c := cf.client(tc)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	act, err := c.Start(ctx, *id, in)
	if err != nil {
		fmt.Fprintf(stderr, "durallm %s: %v\n", name, err)
		var taken *serviceerror.WorkflowExecutionAlreadyStarted
		switch {
		case errors.Is(err, durallm.ErrInvalidInput):
			return exitUsage
		case errors.As(err, &taken):
			// An id names one action, once: nothing was started.
			fmt.Fprintf(stderr, "action id %q is taken; see it with: durallm status --id %s\n", *id, *id)
			return exitUsage
		}
		return exitError
	}
	if !wait {
		fmt.Fprintln(stdout, act.ID)
		return exitOK
	}
	fmt.Fprintf(stderr, "started %s; waiting for its result (Ctrl-C stops waiting, not the action)\n", act.ID)
	if *waitFor > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *waitFor)
		defer cancel()
	}
	res, err := act.Result(ctx)
	if err != nil && ctx.Err() != nil {
		status := func(ctx context.Context) (workflows.Status, error) { return c.Status(ctx, act.ID) }
		return afterGivingUp(stdout, stderr, cf.jsonOut, act.ID, context.Cause(ctx), status, statusRetry)
	}
	return printResult(stdout, stderr, cf.jsonOut, res, err)
}

// statusRetry is how `run --wait` retries the status query it makes when
// it stops waiting: many clients giving up at the same moment query the
// action together, and a query can fail for a moment (its workflow task
// busy, the frontend loaded). About 8 s in all.
var statusRetry = retry{first: 250 * time.Millisecond, tries: 6}

// retry is a bounded exponential retry: tries calls, waiting first, then
// twice as long each time.
type retry struct {
	first time.Duration
	tries int
}

// afterGivingUp is `run --wait`'s end when it stopped waiting: it asks the
// action's status (retried as r says, except for an action that does not
// exist), and an action awaiting a verdict exits exitAwaiting.
func afterGivingUp(stdout, stderr io.Writer, jsonOut bool, id string, cause error, status func(context.Context) (workflows.Status, error), r retry) int {
	var st workflows.Status
	var serr error
	wait := r.first
	for i := 0; i < r.tries; i++ {
		if i > 0 {
			time.Sleep(wait)
			wait *= 2
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, serr = status(ctx)
		cancel()
		if serr == nil || errors.Is(serr, durallm.ErrNotFound) {
			break
		}
	}
	if serr == nil && st.State == workflows.StateAwaitingReconciliation {
		printStatus(stdout, jsonOut, st)
		fmt.Fprintf(stderr, "%s awaits reconciliation of attempt %d: durallm reconcile --id %s --attempt %d --verdict ...\n", id, st.AwaitingAttempt, id, st.AwaitingAttempt)
		return exitAwaiting
	}
	if serr != nil {
		fmt.Fprintf(stderr, "durallm run: stopped waiting (%v), and its status could not be read: %v\n", cause, serr)
		return exitError
	}
	fmt.Fprintf(stderr, "durallm run: stopped waiting: %v\n", cause)
	return exitError
}

// actionInput builds the input from a file or from flags.
func actionInput(file, message string, routes []string, maxAttempts int, deadline time.Duration, stream bool) (workflows.ActionInput, error) {
	var in workflows.ActionInput
	switch {
	case file != "" && message != "":
		return in, errors.New("give --input or --message, not both")
	case file != "":
		r := io.Reader(os.Stdin)
		if file != "-" {
			f, err := os.Open(file)
			if err != nil {
				return in, err
			}
			defer f.Close()
			r = f
		}
		dec := json.NewDecoder(r)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil {
			return in, fmt.Errorf("read %s: %w", file, err)
		}
	case message != "":
		in.Request.Messages = []providers.Message{providers.TextMessage("user", message)}
	default:
		return in, errors.New("give --message TEXT or --input FILE")
	}
	if len(routes) > 0 {
		in.Routes = routes
	}
	if maxAttempts != 0 {
		in.MaxAttempts = maxAttempts
	}
	if deadline != 0 {
		in.Deadline = deadline
	}
	if stream {
		in.Request.Stream = true
	}
	return in, nil
}

// printResult prints a terminal result and returns its exit code.
func printResult(stdout, stderr io.Writer, jsonOut bool, res workflows.ActionResult, err error) int {
	var ae *durallm.ActionError
	switch {
	case err == nil:
	case errors.As(err, &ae):
	case errors.Is(err, durallm.ErrInvalidInput):
		fmt.Fprintln(stderr, err)
		return exitUsage
	default:
		fmt.Fprintln(stderr, err)
		return exitError
	}
	if jsonOut {
		_ = json.NewEncoder(stdout).Encode(res)
	} else {
		printStatus(stdout, false, res.Status)
		if res.Response != nil {
			fmt.Fprintf(stdout, "\n%s\n", res.Response.Text)
			if res.Response.Partial {
				fmt.Fprintf(stdout, "[stream incomplete: %s]\n", res.Response.Incomplete)
			}
		}
	}
	return exitCode(res.State)
}

func exitCode(s workflows.State) int {
	switch s {
	case workflows.StateCompleted, workflows.StateCompletedPartial, workflows.StateReconciled:
		return exitOK
	case workflows.StateFailed:
		return exitFailed
	case workflows.StateRejected:
		return exitRejected
	case workflows.StateCanceled:
		return exitCanceled
	case workflows.StateIndeterminate:
		return exitIndeterminate
	case workflows.StateAwaitingReconciliation:
		return exitAwaiting
	}
	return exitOK
}

func printStatus(w io.Writer, jsonOut bool, st workflows.Status) {
	if jsonOut {
		_ = json.NewEncoder(w).Encode(st)
		return
	}
	fmt.Fprintf(w, "%s  %s", st.ActionRef, st.State)
	if st.Reason != "" {
		fmt.Fprintf(w, " (%s: %s)", st.Outcome, st.Reason)
	}
	if st.Origin != "" {
		fmt.Fprintf(w, " by %s", st.Origin)
	}
	fmt.Fprintf(w, "  · %d of %d attempts\n", st.Used, st.Budget)
	for _, a := range st.Attempts {
		fmt.Fprintf(w, "  %s → %s (%s)", a.Summary, a.Classification.Class, a.Classification.Reason)
		if a.Evidence.ConnRef != "" {
			fmt.Fprintf(w, " conn=%s stream=%d", a.Evidence.ConnRef, a.Evidence.StreamID)
		}
		if a.Evidence.Status != 0 {
			fmt.Fprintf(w, " status=%d", a.Evidence.Status)
		}
		if a.JournalState != "" {
			fmt.Fprintf(w, " journal=%s", a.JournalState)
		}
		if a.ProviderRecord != "" {
			fmt.Fprintf(w, " provider_record=%s", a.ProviderRecord)
		}
		if a.Verdict != "" {
			fmt.Fprintf(w, " verdict=%s by %s", a.Verdict, a.VerdictBy)
		}
		fmt.Fprintln(w)
	}
	if st.AwaitingAttempt > 0 {
		fmt.Fprintf(w, "  awaiting a verdict on attempt %d\n", st.AwaitingAttempt)
		// What the reconcilers found is what the person deciding needs.
		for _, n := range st.Notes {
			if strings.HasPrefix(n.What, "reconciler") {
				fmt.Fprintf(w, "  %s\n", n.What)
			}
		}
	}
}

func runStatus(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("status", "--id ACTION_ID [flags]", stderr)
	var cf connFlags
	cf.register(fs)
	id := fs.String("id", "", "action id (required)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if *id == "" {
		fmt.Fprintln(stderr, "durallm status: --id is required")
		return exitUsage
	}
	tc, err := cf.dial()
	if err != nil {
		fmt.Fprintf(stderr, "durallm status: %v\n", err)
		return exitError
	}
	defer tc.Close()
	st, err := cf.client(tc).Status(context.Background(), *id)
	if err != nil {
		fmt.Fprintf(stderr, "durallm status: %v\n", err)
		return exitError
	}
	printStatus(stdout, cf.jsonOut, st)
	if st.State.Terminal() || st.State == workflows.StateAwaitingReconciliation {
		return exitCode(st.State)
	}
	return exitOK
}

func runCancel(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("cancel", "--id ACTION_ID --origin user_stop|client_disconnect|operator_stop [--note TEXT]", stderr)
	var cf connFlags
	cf.register(fs)
	id := fs.String("id", "", "action id (required)")
	origin := fs.String("origin", "", "who stops it: user_stop, client_disconnect or operator_stop (required)")
	note := fs.String("note", "", "a note for the record")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if *id == "" || *origin == "" {
		fmt.Fprintln(stderr, "durallm cancel: --id and --origin are required")
		return exitUsage
	}
	if !workflows.CancelOrigin(*origin).Requestable() {
		fmt.Fprintf(stderr, "durallm cancel: --origin %q: want user_stop, client_disconnect or operator_stop\n", *origin)
		return exitUsage
	}
	tc, err := cf.dial()
	if err != nil {
		fmt.Fprintf(stderr, "durallm cancel: %v\n", err)
		return exitError
	}
	defer tc.Close()
	if err := cf.client(tc).Cancel(context.Background(), *id, workflows.CancelOrigin(*origin), *note); err != nil {
		fmt.Fprintf(stderr, "durallm cancel: %v\n", err)
		if errors.Is(err, durallm.ErrInvalidInput) {
			return exitUsage
		}
		return exitError
	}
	fmt.Fprintf(stdout, "cancel (%s) sent to %s\n", *origin, *id)
	return exitOK
}

func runReconcile(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("reconcile", "--id ACTION_ID --attempt N --verdict completed|not_executed|allow_replay|abandon [--text TEXT | --result-ref REF]", stderr)
	var cf connFlags
	cf.register(fs)
	id := fs.String("id", "", "action id (required)")
	attemptN := fs.Int("attempt", 0, "the ambiguous attempt's number, as 'status' shows it (required)")
	verdict := fs.String("verdict", "", "completed, not_executed, allow_replay or abandon (required)")
	text := fs.String("text", "", "completed: the result text")
	ref := fs.String("result-ref", "", "completed: a reference to a stored result")
	by := fs.String("by", os.Getenv("USER"), "who decided, for the record")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if *id == "" || *attemptN <= 0 || *verdict == "" {
		fmt.Fprintln(stderr, "durallm reconcile: --id, --attempt and --verdict are required")
		return exitUsage
	}
	req := workflows.ReconcileRequest{Attempt: *attemptN, Verdict: attempt.Verdict(*verdict), ResultRef: *ref, By: *by}
	if *text != "" {
		req.Response = &providers.Response{Text: *text}
	}
	tc, err := cf.dial()
	if err != nil {
		fmt.Fprintf(stderr, "durallm reconcile: %v\n", err)
		return exitError
	}
	defer tc.Close()
	if err := cf.client(tc).Reconcile(context.Background(), *id, req); err != nil {
		fmt.Fprintf(stderr, "durallm reconcile: %v\n", err)
		var rerr *durallm.ReconcileError
		if errors.As(err, &rerr) {
			return exitUsage
		}
		return exitError
	}
	fmt.Fprintf(stdout, "verdict %s accepted for %s attempt %d\n", *verdict, *id, *attemptN)
	return exitOK
}

func runList(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("list", "--state STATE [flags]", stderr)
	var cf connFlags
	cf.register(fs)
	state := fs.String("state", string(workflows.StateAwaitingReconciliation), "the DurallmState to list")
	limit := fs.Int("limit", 100, "at most this many")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	tc, err := cf.dial()
	if err != nil {
		fmt.Fprintf(stderr, "durallm list: %v\n", err)
		return exitError
	}
	defer tc.Close()
	ids, err := cf.client(tc).List(context.Background(), workflows.State(*state), *limit)
	if err != nil {
		fmt.Fprintf(stderr, "durallm list: %v\n", err)
		return exitError
	}
	if cf.jsonOut {
		_ = json.NewEncoder(stdout).Encode(ids)
		return exitOK
	}
	if len(ids) > 0 {
		fmt.Fprintln(stdout, strings.Join(ids, "\n"))
	}
	return exitOK
}
