// Package runbook runs the five recovery runbook cases against a path of
// your own: a proxy, a gateway or a load balancer between durallm's
// worker and the fault-injecting provider (testsuite/providertest). Each
// case makes the provider do one thing on the wire that durallm reads as
// evidence, and checks what durallm concluded through the path:
//
//	goaway_above        GOAWAY above the request's stream: provably not processed, retried on a fresh connection, executed once
//	goaway_at_boundary  GOAWAY at the request's stream after running it: maybe processed, never re-sent, awaits a verdict
//	misdirected         421: the connection is quarantined, one retry on a fresh one, executed once
//	bare_close          the connection closed after the request was read, no GOAWAY: maybe processed, awaits a verdict
//	refused_stream      RST_STREAM REFUSED_STREAM: provably not processed, retried on a fresh connection, executed once
//
// A path can keep a case's evidence (a GOAWAY relayed as such), hide it
// (a GOAWAY turned into a 502) or counterfeit it (REFUSED_STREAM for a
// request it had forwarded), and that changes what durallm can prove:
// Run says, case by case, what the path preserved and what it hid, and
// whether the request was executed twice because of it.
//
//	p, _ := providertest.NewProvider()
//	// ... point the proxy at p.HTTP1URL() (or p.URL(), p.H2CURL()) ...
//	rep, err := runbook.Run(ctx, runbook.Setup{Provider: p, Route: routes.Route{BaseURL: "https://proxy.internal/v1"}})
//	for _, r := range rep.Results { fmt.Println(r.Case.Name, r.Held, r.Preserved, r.Hid) }
//
// Each case runs the real LLMAction workflow with the real CallModel
// activity and recovery engine, in the Temporal SDK's test environment
// (virtual time for the workflow's waits; the attempts themselves are
// real exchanges over the path). `durallm check-path` runs it.
package runbook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"golang.org/x/net/http2"

	"github.com/durallm/durallm/activities"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// Case is one runbook case: what the provider does, and what durallm
// concludes when it reaches the provider directly.
type Case struct {
	// Name is the case's short name, e.g. "goaway_above".
	Name string
	// Title says it in words, e.g. "GOAWAY above the boundary".
	Title string
	// Fault is what the provider does with the request.
	Fault string
	// Evidence names what durallm reads from the wire in this case.
	Evidence string
	// Class and Reason are the first attempt's classification directly.
	Class  evidence.Class
	Reason string
	// Next is the workflow's decision after it (workflows.Decide*).
	Next string
	// Executed says whether the provider ran the faulted request.
	Executed bool

	fault func() providertest.Behavior
}

// Cases are the five runbook cases, in the runbook's order.
var Cases = []Case{
	{Name: "goaway_above", Title: "GOAWAY above the boundary", Fault: "GOAWAY NO_ERROR with a last-stream id below the request's stream, without running it", Evidence: "the GOAWAY",
		Class: evidence.Refused, Reason: "goaway_above_boundary", Next: workflows.DecideRetry,
		fault: func() providertest.Behavior { return providertest.GoAwayAbove(http2.ErrCodeNo) }},
	{Name: "goaway_at_boundary", Title: "GOAWAY at the boundary", Fault: "runs the request, then GOAWAY NO_ERROR with the request's stream as the last-stream id, and closes", Evidence: "the GOAWAY",
		Class: evidence.Ambiguous, Reason: "goaway_at_or_below_boundary", Next: workflows.DecideAwait, Executed: true,
		fault: func() providertest.Behavior { return providertest.GoAwayAfterProcessing(http2.ErrCodeNo) }},
	{Name: "misdirected", Title: "421 Misdirected Request", Fault: "answers 421 without running the request", Evidence: "the 421",
		Class: evidence.Misdirected, Reason: "421", Next: workflows.DecideRetry,
		fault: providertest.Misdirected},
	{Name: "bare_close", Title: "connection closed without GOAWAY", Fault: "reads the request, runs it and closes the connection without a word", Evidence: "the connection's close",
		Class: evidence.Ambiguous, Reason: "connection_closed_without_goaway", Next: workflows.DecideAwait, Executed: true,
		fault: providertest.CloseAfterRead},
	{Name: "refused_stream", Title: "RST_STREAM REFUSED_STREAM", Fault: "resets the request's stream with REFUSED_STREAM without running it", Evidence: "the REFUSED_STREAM",
		Class: evidence.Refused, Reason: "rst_refused_stream", Next: workflows.DecideRetry,
		fault: providertest.RefuseStream},
}

// Setup is the path under test.
type Setup struct {
	// Provider is the fault-injecting provider the path leads to.
	// Required. Run sets its script (Provider.Script) for its own
	// requests and leaves every other request to the provider's default.
	Provider *providertest.Provider
	// Route is the route the worker takes to the provider through the
	// path: BaseURL is the path's entry (e.g. "https://proxy:443/v1"),
	// and HTTPVersion, Intermediary and InsecureSkipVerify mean what they
	// mean in a routes file. Empty Name, Kind and Model mean "runbook",
	// "openai" and "runbook-model". Required: BaseURL.
	Route routes.Route
	// TLS is the client's TLS configuration for the path's entry (the
	// roots that trust its certificate). Nil means the system roots.
	TLS *tls.Config
	// AllowH2C makes an http:// BaseURL with HTTPVersion auto speak
	// cleartext HTTP/2, as durallm worker --allow-h2c does.
	AllowH2C bool
	// Timeout bounds each case's wait for the path, and how long one of
	// a case's workflow tasks may take before the SDK's deadlock
	// detection calls it stuck. Zero means 20s.
	Timeout time.Duration
}

// Result is one case through the path.
type Result struct {
	Case Case
	// Class, Reason and Next are the first attempt's classification and
	// the workflow's decision after it; Evidence is what the first attempt
	// saw.
	Class    evidence.Class
	Reason   string
	Next     string
	Evidence evidence.Evidence
	// State is how the action ended; an action that waits for a verdict
	// is let time out (indeterminate, reconcile_timeout) in virtual time.
	State    workflows.State
	Attempts int
	// Executed is how often the provider ran the action's request.
	Executed int
	// Held reports that durallm concluded through the path what it
	// concludes directly: the same class and decision, and the request
	// executed once (none for an unprocessed one left to a verdict).
	Held bool
	// Unsafe reports that durallm, misled by the path, sent a request the
	// provider had already run again, or took a request the provider had
	// run for one provably not processed.
	Unsafe bool
	// Preserved and Hid say, in words, what of the case's evidence reached
	// durallm through the path and what did not.
	Preserved, Hid string
	// Err is why the case could not run (the path refused it, the
	// provider never saw it); the fields above are then what there is.
	Err error
}

// Report is every case's result.
type Report struct {
	Results []Result
}

// Held counts the cases that held.
func (r Report) Held() int { return r.count(func(res Result) bool { return res.Held }) }

// Unsafe counts the cases in which the path made durallm unsafe.
func (r Report) Unsafe() int { return r.count(func(res Result) bool { return res.Unsafe }) }

func (r Report) count(f func(Result) bool) int {
	n := 0
	for _, res := range r.Results {
		if f(res) {
			n++
		}
	}
	return n
}

// ErrSetup is wrapped by the error Run returns for an unusable Setup.
var ErrSetup = errors.New("runbook: invalid setup")

// Run runs every case through the path, one after another, and reports
// each. It returns an error only for an unusable Setup or a canceled ctx;
// a case that could not run has its Result.Err.
func Run(ctx context.Context, s Setup) (Report, error) {
	if s.Provider == nil {
		return Report{}, fmt.Errorf("%w: no provider", ErrSetup)
	}
	r := s.Route
	if r.Name == "" {
		r.Name = "runbook"
	}
	if r.Kind == "" {
		r.Kind = routes.KindOpenAI
	}
	if r.Model == "" {
		r.Model = "runbook-model"
	}
	if err := (routes.Config{Routes: []routes.Route{r}}).Validate(); err != nil {
		return Report{}, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	s.Route = r
	if s.Timeout <= 0 {
		s.Timeout = 20 * time.Second
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	faults := map[string]func() providertest.Behavior{}
	var mu sync.Mutex
	s.Provider.Script(func(req providertest.Request) (providertest.Behavior, bool) {
		mu.Lock()
		defer mu.Unlock()
		f, ok := faults[req.IdempotencyKey]
		if !ok {
			return providertest.Behavior{}, false
		}
		// The fault goes to the action's first request only; a retry
		// the path or durallm makes is answered.
		delete(faults, req.IdempotencyKey)
		return f(), true
	})
	var rep Report
	for _, c := range Cases {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		id := "runbook-" + run + "-" + c.Name
		mu.Lock()
		faults[id] = c.fault
		mu.Unlock()
		rep.Results = append(rep.Results, runCase(s, c, id))
	}
	return rep, nil
}

// runCase runs one case as one action.
func runCase(s Setup, c Case, id string) Result {
	res := Result{Case: c}
	engine := recovery.New(recovery.Config{TLSClientConfig: s.TLS, AllowH2C: s.AllowH2C, Logger: slog.New(slog.DiscardHandler)})
	defer engine.Close()
	acts := &activities.Activities{Engine: engine, Routes: map[string]routes.Route{s.Route.Name: s.Route}, Logger: slog.New(slog.DiscardHandler)}
	if s.Route.InsecureSkipVerify {
		acts.InsecureEngine = recovery.New(recovery.Config{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, AllowH2C: s.AllowH2C, Logger: slog.New(slog.DiscardHandler)}) // #nosec G402 -- the route opted out
		defer acts.InsecureEngine.Close()
	}
	var suite testsuite.WorkflowTestSuite
	suite.SetLogger(log.NewStructuredLogger(slog.New(slog.DiscardHandler)))
	env := suite.NewTestWorkflowEnvironment()
	// A workflow task may take as long as an attempt may. The default
	// (1 s) fails a case on a busy machine: the SDK hashes the process's
	// binary for its build id inside the first workflow task that
	// schedules an activity, and the workflow is LLMAction, whose tasks
	// never block.
	env.SetWorkerOptions(worker.Options{DeadlockDetectionTimeout: s.Timeout})
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: id})
	// Real exchanges, each bounded by the attempt timeout, and a few
	// retries at most: this bounds the wall time of a case.
	env.SetTestTimeout(4*s.Timeout + 10*time.Second)
	env.RegisterWorkflowWithOptions(workflows.New(workflows.Options{Events: slog.New(slog.DiscardHandler)}), workflow.RegisterOptions{Name: workflows.WorkflowName})
	env.RegisterActivity(acts)
	env.ExecuteWorkflow(workflows.WorkflowName, workflows.ActionInput{
		Request:          providers.Request{Messages: []providers.Message{providers.TextMessage("user", "runbook case "+c.Name)}},
		Routes:           []string{s.Route.Name},
		MaxAttempts:      3,
		AttemptTimeout:   s.Timeout,
		Deadline:         10 * time.Minute,
		ReconcileTimeout: time.Minute, // virtual time: an awaiting action ends at once
	})
	var out workflows.ActionResult
	if err := env.GetWorkflowError(); err != nil {
		res.Err = err
		return res
	}
	if err := env.GetWorkflowResult(&out); err != nil {
		res.Err = err
		return res
	}
	res.State, res.Attempts = out.State, len(out.Attempts)
	res.Executed = s.Provider.ExecutedCount(id)
	if len(out.Attempts) > 0 {
		a := out.Attempts[0]
		res.Class, res.Reason, res.Next, res.Evidence = a.Classification.Class, a.Classification.Reason, a.Decision.Next, a.Evidence
	}
	if !receivedKey(s.Provider, id) {
		// The fault is keyed by the header: without it, nothing was tested.
		res.Err = errors.New("the provider never saw this case's request with its Idempotency-Key: the path drops the header, or leads elsewhere")
	}
	judge(&res, s.Route.Intermediary)
	return res
}

func receivedKey(p *providertest.Provider, key string) bool {
	for _, r := range p.Received() {
		if r.IdempotencyKey == key {
			return true
		}
	}
	return false
}

// want is what durallm concludes for c directly, on a route that is (or
// is not) marked intermediary: a REFUSED_STREAM from an intermediary is
// no proof, so it waits for a verdict.
func want(c Case, intermediary bool) (evidence.Class, string) {
	if intermediary && c.Name == "refused_stream" {
		return evidence.Ambiguous, workflows.DecideAwait
	}
	return c.Class, c.Next
}

// judge fills in Held, Unsafe, Preserved and Hid.
func judge(r *Result, intermediary bool) {
	class, next := want(r.Case, intermediary)
	// Executed once: the faulted request when it ran, else the retry; an
	// unprocessed request that waits for a verdict is never sent again.
	executed := 1
	if next == workflows.DecideAwait && !r.Case.Executed {
		executed = 0
	}
	r.Held = r.Err == nil && r.Class == class && r.Next == next && r.Executed == executed
	// Sent again after the provider ran it, or taken for provably
	// unprocessed when the provider ran it.
	replaySafe := r.Class == evidence.Refused || r.Class == evidence.Unsent
	r.Unsafe = r.Executed > 1 || (r.Case.Executed && replaySafe)
	seen := Seen(r.Evidence)
	if kept(r.Case, r.Evidence) {
		r.Preserved = r.Case.Evidence + " (" + seen + ")"
		return
	}
	r.Hid = r.Case.Evidence + "; durallm saw " + seen
}

// kept reports whether the case's own evidence reached durallm.
func kept(c Case, ev evidence.Evidence) bool {
	switch c.Name {
	case "goaway_above", "goaway_at_boundary":
		return ev.GoAway != nil
	case "misdirected":
		return ev.Status == 421
	case "bare_close":
		return ev.ConnClosed && ev.Status == 0 && ev.GoAway == nil && ev.RSTStream == nil
	case "refused_stream":
		return ev.RSTStream != nil && *ev.RSTStream == evidence.CodeRefusedStream
	}
	return false
}

// Seen says in words what an attempt saw on the wire: a status, a
// GOAWAY, a reset, a close, or nothing.
func Seen(ev evidence.Evidence) string {
	var parts []string
	if ev.Status != 0 {
		parts = append(parts, "HTTP "+strconv.Itoa(ev.Status))
	}
	if g := ev.GoAway; g != nil {
		parts = append(parts, fmt.Sprintf("GOAWAY %s last-stream id %d (its stream %d)", g.Code, g.LastStreamID, ev.StreamID))
	}
	if ev.RSTStream != nil {
		parts = append(parts, "RST_STREAM "+ev.RSTStream.String())
	}
	if ev.ConnClosed {
		parts = append(parts, "the connection closed")
	}
	if ev.TimedOut {
		parts = append(parts, "no answer before the attempt timeout")
	}
	if len(parts) == 0 {
		if !ev.RequestSent {
			return "nothing: the request was not sent"
		}
		return "no response"
	}
	return strings.Join(parts, ", ")
}
