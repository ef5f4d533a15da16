package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/durallm/durallm/attempt"

	"go.temporal.io/api/serviceerror"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/workflows"
)

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
	case workflows.StateSpendExhausted:
		return exitSpendExhausted
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
