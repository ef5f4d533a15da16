package report

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/net/http2"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// send has the provider execute one request of action as attempt, over
// real HTTP/2, so the invariants are checked against its own record.
func send(t *testing.T, p *providertest.Provider, action, attempt string) {
	t.Helper()
	sendBody(t, p, action, attempt, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
}

// sendStored is send with a request that asks the provider to store it.
func sendStored(t *testing.T, p *providertest.Provider, action, attempt string) {
	t.Helper()
	sendBody(t, p, action, attempt, `{"model":"m","store":true,"metadata":{"durallm_attempt_id":"`+attempt+`"},"messages":[{"role":"user","content":"hi"}]}`)
}

func sendBody(t *testing.T, p *providertest.Provider, action, attempt, body string) {
	t.Helper()
	c := &http.Client{Transport: &http2.Transport{TLSClientConfig: p.ClientTLSConfig()}}
	req, err := http.NewRequest(http.MethodPost, p.URL()+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(recovery.HeaderAttemptID, attempt)
	req.Header.Set(recovery.HeaderIdempotencyKey, action)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

func record(n int, id string, class evidence.Class) workflows.AttemptRecord {
	return workflows.AttemptRecord{N: n, Evidence: evidence.Evidence{AttemptID: id}, Classification: evidence.Classification{Class: class}}
}

// The invariants a chaos run checks, each against the provider's record:
// it must fail for every way an action can break the contract, and hold
// for the ways the contract allows.
func TestCheckFindsEveryViolation(t *testing.T) {
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	send(t, p, "refused-but-ran", "r-1")
	send(t, p, "twice", "t-1")
	send(t, p, "twice", "t-1")
	send(t, p, "ok", "ok-1")
	send(t, p, "partial", "p-1")

	completed := workflows.ActionResult{Status: workflows.Status{State: workflows.StateCompleted, Attempts: []workflows.AttemptRecord{record(1, "ok-1", evidence.Completed)}}}
	tests := []struct {
		name, id  string
		res       workflows.ActionResult
		violation string // "" when the action holds
	}{
		{"a completed action executed once holds", "ok", completed, ""},
		{"refused although the provider ran it", "refused-but-ran", workflows.ActionResult{Status: workflows.Status{State: workflows.StateCompleted,
			Attempts: []workflows.AttemptRecord{record(1, "r-1", evidence.Refused)}}}, "classified refused"},
		{"one attempt executed twice", "twice", workflows.ActionResult{Status: workflows.Status{State: workflows.StateCompleted,
			Attempts: []workflows.AttemptRecord{record(1, "t-1", evidence.Completed)}}}, "executed 2 times"},
		{"another attempt after an ambiguous one", "ok", workflows.ActionResult{Status: workflows.Status{State: workflows.StateCompleted,
			Attempts: []workflows.AttemptRecord{record(1, "x-1", evidence.Ambiguous), record(2, "ok-1", evidence.Completed)}}}, "without a verdict"},
		{"completed_partial without its text", "partial", workflows.ActionResult{Status: workflows.Status{State: workflows.StateCompletedPartial,
			Attempts: []workflows.AttemptRecord{record(1, "p-1", evidence.CommittedPartial)}}, Response: &providers.Response{Partial: true, Incomplete: "reset"}}, "without its partial text"},
		{"a worker-lost partial has its reason and no text", "partial", workflows.ActionResult{Status: workflows.Status{State: workflows.StateCompletedPartial,
			Attempts: []workflows.AttemptRecord{record(1, "p-1", evidence.CommittedPartial)}}, Response: &providers.Response{Partial: true, Incomplete: providers.IncompleteWorkerLost}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := Check(p, tt.id, tt.res, false)
			switch {
			case tt.violation == "" && len(v) > 0:
				t.Fatalf("violations %v", v)
			case tt.violation != "" && !strings.Contains(strings.Join(v, "\n"), tt.violation):
				t.Fatalf("violations %v, want one saying %q", v, tt.violation)
			}
		})
	}

	r := New(2)
	r.Add(p, nil, "ok", completed, nil, true)
	r.Add(p, nil, "twice", tests[2].res, nil, true)
	var out bytes.Buffer
	r.Print(&out)
	if r.Attempts != 2 || r.States[workflows.StateCompleted] != 2 || !strings.Contains(out.String(), "1 VIOLATED") {
		t.Fatalf("report %+v\n%s", r, out.String())
	}
}

// The journal's invariants: no action is left to a person while the
// journal holds a response a worker received for it, and one reconciled
// from the journal carries the provider's answer, executed once.
func TestJournalInvariants(t *testing.T) {
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	send(t, p, "held", "h-1")
	send(t, p, "lost", "l-1")
	j := journal.Dir{Path: t.TempDir()}
	if err := j.Record(context.Background(), journal.Entry{AttemptID: "h-1", State: journal.Received, Response: &providers.Response{Text: "ok"}}); err != nil {
		t.Fatal(err)
	}
	reconciled := record(1, "h-1", evidence.Ambiguous)
	reconciled.Verdict, reconciled.VerdictBy = attempt.VerdictCompleted, attempt.ByJournal
	left := workflows.ActionResult{Status: workflows.Status{State: workflows.StateIndeterminate, Reason: "reconcile_timeout",
		Attempts: []workflows.AttemptRecord{record(1, "h-1", evidence.Ambiguous)}}}
	r := New(3)
	r.Add(p, j, "held", workflows.ActionResult{Status: workflows.Status{State: workflows.StateReconciled, Attempts: []workflows.AttemptRecord{reconciled}},
		Response: &providers.Response{Text: "ok"}}, nil, false)
	if len(r.Violations) != 0 || r.Journal.Reconciled != 1 {
		t.Fatalf("a journal-reconciled action: %v %+v", r.Violations, r.Journal)
	}
	r.Add(p, j, "lost", workflows.ActionResult{Status: workflows.Status{State: workflows.StateIndeterminate, Reason: "reconcile_timeout",
		Attempts: []workflows.AttemptRecord{record(1, "l-1", evidence.Ambiguous)}}}, nil, false)
	if len(r.Violations) != 0 || r.Journal.LeftToPerson != 1 {
		t.Fatalf("an action the journal could not settle: %v %+v", r.Violations, r.Journal)
	}
	r.Add(p, j, "held", left, nil, false)
	if len(r.Violations) != 1 || !strings.Contains(r.Violations[0], "left to a person although the journal holds") {
		t.Fatalf("violations %v", r.Violations)
	}
	// "Not processed" must mean it: the provider never executed it.
	send(t, p, "refused", "r-1")
	send(t, p, "refused", "r-2")
	notProcessed := record(1, "r-1", evidence.Ambiguous)
	notProcessed.Verdict, notProcessed.VerdictBy = attempt.VerdictNotExecuted, attempt.ByJournal
	r = New(1)
	r.Add(p, j, "refused", workflows.ActionResult{Status: workflows.Status{State: workflows.StateCompleted,
		Attempts: []workflows.AttemptRecord{notProcessed, record(2, "r-2", evidence.Completed)}}, Response: &providers.Response{Text: "ok"}}, nil, false)
	// Both checks see it: the attempt the journal cleared ran, and so the
	// action ran twice.
	if got := strings.Join(r.Violations, "\n"); r.Journal.NotProcessed != 1 || len(r.Violations) != 2 ||
		!strings.Contains(got, "said not processed, but the provider executed it") || !strings.Contains(got, "executed it 2 times") {
		t.Fatalf("journal %+v violations %v", r.Journal, r.Violations)
	}
}

// Defect: the checker flagged an ambiguous attempt followed by another as
// "another attempt followed without a verdict" even when a verdict
// (not_executed, allow_replay) had allowed the next attempt.
func TestAnAmbiguousAttemptFollowedUnderAVerdictIsNoViolation(t *testing.T) {
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, v := range []attempt.Verdict{attempt.VerdictNotExecuted, attempt.VerdictAllowReplay} {
		id := "v-" + string(v)
		send(t, p, id, id+"-2")
		first := record(1, id+"-1", evidence.Ambiguous)
		first.Verdict, first.VerdictBy = v, "person"
		r := New(1)
		r.Add(p, nil, id, workflows.ActionResult{Status: workflows.Status{State: workflows.StateCompleted,
			Attempts: []workflows.AttemptRecord{first, record(2, id+"-2", evidence.Completed)}}, Response: &providers.Response{Text: "ok"}}, nil, false)
		if len(r.Violations) != 0 {
			t.Errorf("%s: violations %v", v, r.Violations)
		}
	}
}

// An action the provider executed more than once is "executed twice"
// unless every execution but the last came from an attempt whose outcome
// let another follow: upstream_error (retried by policy), empty_response
// (falls back), or an ambiguous attempt under a verdict. Without provider
// faults nothing excuses a second execution.
func TestExecutedTwiceOnlyWhereAnOutcomeLetAnotherAttemptFollow(t *testing.T) {
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	withVerdict := func(r workflows.AttemptRecord, v attempt.Verdict, by string) workflows.AttemptRecord {
		r.Verdict, r.VerdictBy = v, by
		return r
	}
	tests := []struct {
		name     string
		executed []string // attempt ids the provider runs, in order
		attempts []workflows.AttemptRecord
		faults   bool
		twice    bool
	}{
		{"once", []string{"1"}, []workflows.AttemptRecord{record(1, "1", evidence.Completed)}, true, false},
		{"a 500 after executing, retried by policy", []string{"1", "2"},
			[]workflows.AttemptRecord{record(1, "1", evidence.UpstreamError), record(2, "2", evidence.Completed)}, true, false},
		{"an empty 2xx, fallen back", []string{"1", "2"},
			[]workflows.AttemptRecord{record(1, "1", evidence.EmptyResponse), record(2, "2", evidence.Completed)}, true, false},
		{"a throttled attempt never ran", []string{"2"},
			[]workflows.AttemptRecord{record(1, "1", evidence.Throttled), record(2, "2", evidence.Completed)}, true, false},
		{"an ambiguous attempt that ran, left to a person", []string{"1"},
			[]workflows.AttemptRecord{record(1, "1", evidence.Ambiguous)}, true, false},
		{"an ambiguous attempt that ran, then another without a verdict", []string{"1", "2"},
			[]workflows.AttemptRecord{record(1, "1", evidence.Ambiguous), record(2, "2", evidence.Completed)}, true, true},
		{"an ambiguous attempt that ran, then another under allow_replay", []string{"1", "2"},
			[]workflows.AttemptRecord{withVerdict(record(1, "1", evidence.Ambiguous), attempt.VerdictAllowReplay, "person"), record(2, "2", evidence.Completed)}, true, false},
		{"the journal's not processed let another follow", []string{"1", "2"},
			[]workflows.AttemptRecord{withVerdict(record(1, "1", evidence.Ambiguous), attempt.VerdictNotExecuted, attempt.ByJournal), record(2, "2", evidence.Completed)}, true, false},
		{"a refused attempt that ran", []string{"1", "2"},
			[]workflows.AttemptRecord{record(1, "1", evidence.Refused), record(2, "2", evidence.Completed)}, true, true},
		{"one attempt run twice", []string{"1", "1"},
			[]workflows.AttemptRecord{record(1, "1", evidence.Completed)}, true, true},
		{"a run under an attempt the action never recorded", []string{"0", "1"},
			[]workflows.AttemptRecord{record(1, "1", evidence.Completed)}, true, true},
		{"without faults, a 500 retried still ran twice", []string{"1", "2"},
			[]workflows.AttemptRecord{record(1, "1", evidence.UpstreamError), record(2, "2", evidence.Completed)}, false, true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := "action-" + strconv.Itoa(i)
			res := workflows.ActionResult{Status: workflows.Status{State: workflows.StateCompleted}, Response: &providers.Response{Text: "ok"}}
			for _, a := range tt.attempts {
				a.Evidence.AttemptID = id + "-" + a.Evidence.AttemptID
				res.Attempts = append(res.Attempts, a)
			}
			for _, a := range tt.executed {
				send(t, p, id, id+"-"+a)
			}
			if got := ExecutedTwice(p, id, res, tt.faults); got != tt.twice {
				t.Fatalf("ExecutedTwice = %v, want %v", got, tt.twice)
			}
			r := New(1)
			r.Add(p, nil, id, res, nil, tt.faults)
			if got := len(r.Twice) == 1; got != tt.twice || r.Failed() != (tt.twice || len(r.Violations) > 0) {
				t.Fatalf("Report.Twice %v, Failed %v, violations %v", r.Twice, r.Failed(), r.Violations)
			}
		})
	}
}

// The provider record's invariants: an action settled from it carries the
// provider's answer, executed once, and none is left to a person with the
// lookup finding nothing while the provider holds its answer.
func TestProviderRecordInvariants(t *testing.T) {
	p, err := providertest.NewProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sendStored(t, p, "settled", "s-1")
	sendStored(t, p, "missed", "m-1")
	send(t, p, "unstored", "u-1")
	j := journal.Dir{Path: t.TempDir()}
	settled := record(1, "s-1", evidence.Ambiguous)
	settled.Verdict, settled.VerdictBy, settled.ProviderRecord = attempt.VerdictCompleted, attempt.ByProvider, attempt.ProviderRecordFound
	leftWith := func(id, found string) workflows.ActionResult {
		a := record(1, id, evidence.Ambiguous)
		a.ProviderRecord = found
		return workflows.ActionResult{Status: workflows.Status{State: workflows.StateIndeterminate, Reason: "reconcile_timeout", Attempts: []workflows.AttemptRecord{a}}}
	}
	r := New(4)
	r.Add(p, j, "settled", workflows.ActionResult{Status: workflows.Status{State: workflows.StateReconciled, Attempts: []workflows.AttemptRecord{settled}},
		Response: &providers.Response{Text: "ok"}}, nil, false)
	r.Add(p, j, "unstored", leftWith("u-1", attempt.ProviderRecordNotFound), nil, false)
	if len(r.Violations) != 0 || r.Provider.Settled != 1 || r.Provider.LeftBy[attempt.ProviderRecordNotFound] != 1 {
		t.Fatalf("violations %v provider %+v", r.Violations, r.Provider)
	}
	r.Add(p, j, "settled", workflows.ActionResult{Status: workflows.Status{State: workflows.StateReconciled, Attempts: []workflows.AttemptRecord{settled}},
		Response: &providers.Response{Text: "not what the provider said"}}, nil, false)
	r.Add(p, j, "missed", leftWith("m-1", attempt.ProviderRecordNotFound), nil, false)
	got := strings.Join(r.Violations, "\n")
	if len(r.Violations) != 2 || !strings.Contains(got, "from the provider's record with") || !strings.Contains(got, "although the provider stored its attempt's answer") {
		t.Fatalf("violations %v", r.Violations)
	}
	r.Add(p, j, "never-sent", leftWith("n-1", attempt.ProviderRecordNotFound), nil, false)
	// A lookup of the store is no fault.
	c := &http.Client{Transport: &http2.Transport{TLSClientConfig: p.ClientTLSConfig()}}
	if resp, err := c.Get(p.URL() + "/v1/chat/completions?metadata[durallm_attempt_id]=s-1"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	r.AddFaults(p, defaultAnswer)
	var out bytes.Buffer
	r.Print(&out)
	got = out.String()
	if !strings.Contains(got, "provider's record: 2 attempts settled from the provider's record") || !strings.Contains(got, "the lookup: not_found 3") ||
		!strings.Contains(got, "never-sent attempt 1 (ambiguous, ): journal not consulted, provider record not_found; the provider never received it") ||
		!strings.Contains(got, "unstored attempt 1") || len(r.Faults) != 0 {
		t.Fatalf("faults %v, report:\n%s", r.Faults, got)
	}
}
