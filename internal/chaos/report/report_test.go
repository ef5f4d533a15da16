package report

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"golang.org/x/net/http2"

	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providertest"
	"github.com/durallm/durallm/recovery"
	"github.com/durallm/durallm/workflows"
)

// send has the provider execute one request of action as attempt, over
// real HTTP/2, so the invariants are checked against its own record.
func send(t *testing.T, p *providertest.Provider, action, attempt string) {
	t.Helper()
	c := &http.Client{Transport: &http2.Transport{TLSClientConfig: p.ClientTLSConfig()}}
	req, err := http.NewRequest(http.MethodPost, p.URL()+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
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

func attempt(n int, id string, class recovery.Class) workflows.AttemptRecord {
	return workflows.AttemptRecord{N: n, Evidence: recovery.Evidence{AttemptID: id}, Classification: recovery.Classification{Class: class}}
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

	completed := workflows.ActionResult{Status: workflows.Status{State: workflows.StateCompleted, Attempts: []workflows.AttemptRecord{attempt(1, "ok-1", recovery.Completed)}}}
	tests := []struct {
		name, id  string
		res       workflows.ActionResult
		violation string // "" when the action holds
	}{
		{"a completed action executed once holds", "ok", completed, ""},
		{"refused although the provider ran it", "refused-but-ran", workflows.ActionResult{Status: workflows.Status{State: workflows.StateCompleted,
			Attempts: []workflows.AttemptRecord{attempt(1, "r-1", recovery.Refused)}}}, "classified refused"},
		{"one attempt executed twice", "twice", workflows.ActionResult{Status: workflows.Status{State: workflows.StateCompleted,
			Attempts: []workflows.AttemptRecord{attempt(1, "t-1", recovery.Completed)}}}, "executed 2 times"},
		{"another attempt after an ambiguous one", "ok", workflows.ActionResult{Status: workflows.Status{State: workflows.StateCompleted,
			Attempts: []workflows.AttemptRecord{attempt(1, "x-1", recovery.Ambiguous), attempt(2, "ok-1", recovery.Completed)}}}, "without a verdict"},
		{"completed_partial without its text", "partial", workflows.ActionResult{Status: workflows.Status{State: workflows.StateCompletedPartial,
			Attempts: []workflows.AttemptRecord{attempt(1, "p-1", recovery.CommittedPartial)}}, Response: &providers.Response{Partial: true, Incomplete: "reset"}}, "without its partial text"},
		{"a worker-lost partial has its reason and no text", "partial", workflows.ActionResult{Status: workflows.Status{State: workflows.StateCompletedPartial,
			Attempts: []workflows.AttemptRecord{attempt(1, "p-1", recovery.CommittedPartial)}}, Response: &providers.Response{Partial: true, Incomplete: providers.IncompleteWorkerLost}}, ""},
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
	r.Add(p, "ok", completed, nil, true)
	r.Add(p, "twice", tests[2].res, nil, true)
	var out bytes.Buffer
	r.Print(&out)
	if r.Attempts != 2 || r.States[workflows.StateCompleted] != 2 || !strings.Contains(out.String(), "1 VIOLATED") {
		t.Fatalf("report %+v\n%s", r, out.String())
	}
}
