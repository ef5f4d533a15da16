// Package report holds what a chaos run found and the contract's
// invariants it checks: each action's result against the provider's own
// record of what it executed. It needs no Temporal server, so it is tested
// under the race detector.
package report

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/journal"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// Report is what a run found.
type Report struct {
	Actions     int
	Reloads     int
	States      map[workflows.State]int
	Classes     map[evidence.Class]int
	Attempts    int
	Violations  []string
	ProviderRun int // requests the provider executed
	Kills       int // worker processes SIGKILLed
	Restarts    int // embedded server restarts
	// Faults counts the faults the provider injected, by behaviour.
	Faults map[string]int
	// Seen maps what the provider did with an attempt's request (its
	// behaviour, "Answer" for the default) to how the client classified
	// the attempt through the proxy, with counts: how haproxy relays each
	// origin fault. Attempts the provider never received are under "".
	Seen map[string]map[evidence.Class]int
	// ExtraExecutions counts provider executions beyond one per completed
	// action: requests the provider ran whose answer never became the
	// action's (a 500, a reset or an empty 2xx after executing, or an
	// answer lost when its origin connection closed and the proxy said
	// 502). The contract allows each (upstream_error and empty_response
	// may be retried); it is reported, not a violation.
	ExtraExecutions int
	// Twice lists the actions the provider executed more than once where
	// nothing let it (ExecutedTwice), each with its attempts: none may be.
	Twice []string
	// Journal counts what the attempt journal decided for every attempt
	// that ended ambiguous (or committed on a lost worker): reconciled
	// from a response a worker received, proven not processed (the action
	// went on), or left to a person (the action ended indeterminate when
	// its short reconcile timeout passed), with what the journal held for
	// those (LeftBy: "none", "sent", "ended_unanswered", ...).
	Journal struct {
		Reconciled, NotProcessed, LeftToPerson int
		LeftBy                                 map[string]int
	}
	// Provider counts what a route's provider record decided (a run with
	// ProviderRecord): attempts settled from the provider's stored answer
	// (completed, by provider), and, for the actions left to a person,
	// what the lookup found (LeftBy: "not_found", "unreadable", ...).
	Provider struct {
		Settled int
		LeftBy  map[string]int
	}
	// Left says, for each action left to a person, why: what the journal
	// and the provider's record held for its last attempt, and whether
	// the provider ever received it.
	Left []string
	// GoAways counts GOAWAY frames the engine received, by code; Conns the
	// connections it opened (one per drain, when recovery works).
	GoAways map[string]int64
	Conns   int64
	Elapsed time.Duration
}

// New returns an empty report for a run of actions.
func New(actions int) *Report {
	return &Report{Actions: actions, States: map[workflows.State]int{}, Classes: map[evidence.Class]int{}, Faults: map[string]int{}, Seen: map[string]map[evidence.Class]int{}}
}

// Add checks one action's result (or the error that kept it from one)
// against the provider's record, and counts it. With faults, it also
// records how each origin behaviour was classified through the proxy.
func (r *Report) Add(p *providertest.Provider, j journal.Journal, id string, res workflows.ActionResult, err error, faults bool) {
	if err != nil {
		r.Violations = append(r.Violations, fmt.Sprintf("%s: %v", id, err))
		return
	}
	r.States[res.State]++
	r.Violations = append(r.Violations, Check(p, id, res, faults)...)
	r.Violations = append(r.Violations, r.checkJournal(p, j, id, res)...)
	if res.State == workflows.StateCompleted {
		r.ExtraExecutions += p.ExecutedCount(id) - 1
	}
	if ExecutedTwice(p, id, res, faults) {
		r.Twice = append(r.Twice, id+" ("+executions(p, id, res)+")")
	}
	for _, a := range res.Attempts {
		r.Attempts++
		r.Classes[a.Classification.Class]++
		if faults {
			b := BehaviorOf(p, a.Evidence.AttemptID)
			if r.Seen[b] == nil {
				r.Seen[b] = map[evidence.Class]int{}
			}
			r.Seen[b][a.Classification.Class]++
		}
	}
}

// checkJournal counts what the journal decided for the action's attempts
// and checks its invariants: no action is left to a person while the
// journal holds a response a worker received for its attempt; an action
// reconciled from the journal carries the answer the provider sent (for
// an attempt the provider answered by default, its "ok"), executed once;
// an attempt the journal proved not processed was not executed at all.
func (r *Report) checkJournal(p *providertest.Provider, j journal.Journal, id string, res workflows.ActionResult) []string {
	if j == nil || len(res.Attempts) == 0 {
		return nil
	}
	var v []string
	for _, a := range res.Attempts {
		if a.VerdictBy == attempt.ByProvider && a.Verdict == attempt.VerdictCompleted {
			r.Provider.Settled++
			v = append(v, settledRight(p, id, "the provider's record", a, res)...)
		}
		if a.VerdictBy != attempt.ByJournal {
			continue
		}
		switch a.Verdict {
		case attempt.VerdictCompleted:
			r.Journal.Reconciled++
			v = append(v, settledRight(p, id, "the journal", a, res)...)
		case attempt.VerdictNotExecuted:
			r.Journal.NotProcessed++
			if n := p.AttemptExecutions(a.Evidence.AttemptID); n != 0 {
				v = append(v, fmt.Sprintf("%s attempt %d: the journal said not processed, but the provider executed it %d times", id, a.N, n))
			}
		}
	}
	last := res.Attempts[len(res.Attempts)-1]
	if res.State == workflows.StateIndeterminate && res.Reason == "reconcile_timeout" {
		r.Journal.LeftToPerson++
		if r.Journal.LeftBy == nil {
			r.Journal.LeftBy = map[string]int{}
		}
		state := last.JournalState
		if state == "" {
			state = "not consulted"
		}
		r.Journal.LeftBy[state]++
		if e, ok, err := j.Lookup(context.Background(), last.Evidence.AttemptID); err == nil && ok && e.State == journal.Received {
			v = append(v, fmt.Sprintf("%s was left to a person although the journal holds the response a worker received", id))
		}
		received := "the provider never received it"
		if b := BehaviorOf(p, last.Evidence.AttemptID); b != "" {
			received = "the provider did " + b + " with it"
		}
		r.Left = append(r.Left, fmt.Sprintf("%s attempt %d (%s, %s): journal %s, provider record %s; %s",
			id, last.N, last.Classification.Class, last.Classification.Reason, orNone(last.JournalState), orNone(last.ProviderRecord), received))
		if last.ProviderRecord != "" {
			if r.Provider.LeftBy == nil {
				r.Provider.LeftBy = map[string]int{}
			}
			r.Provider.LeftBy[last.ProviderRecord]++
			if last.ProviderRecord == attempt.ProviderRecordNotFound && stored(p, last.Evidence.AttemptID) {
				v = append(v, fmt.Sprintf("%s was left to a person, the lookup finding nothing, although the provider stored its attempt's answer", id))
			}
		}
	}
	return v
}

func orNone(s string) string {
	if s == "" {
		return "not consulted"
	}
	return s
}

// settledRight checks an action settled from a record (the journal, the
// provider's): it carries the answer the provider sent (for an attempt the
// provider answered by default, its "ok"), and the provider executed the
// attempt once.
func settledRight(p *providertest.Provider, id, from string, a workflows.AttemptRecord, res workflows.ActionResult) []string {
	var v []string
	if res.Response == nil || res.Response.Text == "" {
		v = append(v, fmt.Sprintf("%s reconciled from %s without a response", id, from))
	} else if BehaviorOf(p, a.Evidence.AttemptID) == defaultAnswer && strings.TrimSpace(res.Response.Text) != "ok" {
		v = append(v, fmt.Sprintf("%s reconciled from %s with %d bytes of text the provider never sent", id, from, len(res.Response.Text)))
	}
	if n := p.AttemptExecutions(a.Evidence.AttemptID); n != 1 {
		v = append(v, fmt.Sprintf("%s reconciled from %s, but the provider executed its attempt %d times", id, from, n))
	}
	return v
}

// stored reports whether the provider keeps a stored completion for the
// attempt.
func stored(p *providertest.Provider, attemptID string) bool {
	for _, s := range p.Stored() {
		if s.AttemptID == attemptID {
			return true
		}
	}
	return false
}

// defaultAnswer is what the chaos provider's default behaviour records;
// listStored what a lookup of its stored completions records.
var (
	defaultAnswer = providertest.Answer("ok").String()
	listStored    = providertest.ListStored().String()
)

// AddFaults counts the faults the provider injected: every behaviour it
// recorded but its default answer and the lookups of its stored
// completions.
func (r *Report) AddFaults(p *providertest.Provider, defaultBehavior string) {
	for _, rec := range p.Received() {
		if rec.Behavior != "" && rec.Behavior != defaultBehavior && rec.Behavior != listStored {
			r.Faults[rec.Behavior]++
		}
	}
}

// Check applies the invariants to one action. With faults, a completed
// action may have been executed more than once (an upstream_error or an
// empty_response is retried, and a proxy's 502 may hide an origin that
// ran); what must still hold is that its completing attempt ran exactly
// once and that nothing was sent after an outcome that forbids it.
func Check(p *providertest.Provider, id string, res workflows.ActionResult, faults bool) []string {
	var v []string
	for i, a := range res.Attempts {
		ev, cl := a.Evidence, a.Classification
		last := i == len(res.Attempts)-1
		switch cl.Class {
		case evidence.Completed, evidence.CommittedPartial:
			if !last {
				v = append(v, fmt.Sprintf("%s attempt %d was %s and another attempt followed", id, a.N, cl.Class))
			}
			// More than once is caught below, for every attempt.
			if cl.Class == evidence.Completed && p.AttemptExecutions(ev.AttemptID) == 0 {
				v = append(v, fmt.Sprintf("%s attempt %d completed but the provider never executed it", id, a.N))
			}
		case evidence.Refused, evidence.Unsent:
			if n := p.AttemptExecutions(ev.AttemptID); n > 0 {
				v = append(v, fmt.Sprintf("%s attempt %d classified %s (%s) but the provider executed it %d time(s) (%s)", id, a.N, cl.Class, cl.Reason, n, BehaviorOf(p, ev.AttemptID)))
			}
		case evidence.Ambiguous:
			if !last && !verdictLetsAnotherFollow(a) {
				v = append(v, fmt.Sprintf("%s attempt %d was ambiguous and another attempt followed without a verdict", id, a.N))
			}
		}
		if ev.SentAfterGoAway {
			v = append(v, fmt.Sprintf("%s attempt %d was sent on a connection that had received GOAWAY", id, a.N))
		}
		if ev.TransportReplays > 0 {
			v = append(v, fmt.Sprintf("%s attempt %d was replayed by the transport", id, a.N))
		}
		// The provider records the attempt id of every request it runs: two
		// runs of one attempt are a replay by some layer below the workflow
		// (the engine, or a proxy retrying on its own).
		if n := p.AttemptExecutions(ev.AttemptID); n > 1 {
			v = append(v, fmt.Sprintf("%s attempt %d was executed %d times by the provider (%s)", id, a.N, n, BehaviorOf(p, ev.AttemptID)))
		}
	}
	// A partial committed on a worker that was then killed has a reason
	// but no text: the text went to that worker's subscribers only.
	lost := res.Response != nil && res.Response.Incomplete == providers.IncompleteWorkerLost
	if res.State == workflows.StateCompletedPartial && (res.Response == nil || !res.Response.Partial || (res.Response.Text == "" && !lost) || res.Response.Incomplete == "") {
		v = append(v, fmt.Sprintf("%s ended completed_partial without its partial text and reason", id))
	}
	if res.State == workflows.StateCompleted && !faults {
		if n := p.ExecutedCount(id); n != 1 {
			v = append(v, fmt.Sprintf("%s completed but the provider executed it %d times", id, n))
		}
	}
	if !res.State.Terminal() && res.State != workflows.StateAwaitingReconciliation {
		v = append(v, fmt.Sprintf("%s stuck in %s", id, res.State))
	}
	return v
}

// verdictLetsAnotherFollow reports whether a's verdict let another
// attempt follow an ambiguous one: not_executed (a person's, or the
// journal's not processed) or allow_replay.
func verdictLetsAnotherFollow(a workflows.AttemptRecord) bool {
	return a.Verdict == attempt.VerdictNotExecuted || a.Verdict == attempt.VerdictAllowReplay
}

// ExecutedTwice reports whether the provider executed action id more
// than once where nothing let it. Without provider faults, any second
// execution is that. With them, an attempt the provider executed may be
// followed by another only when its outcome let one follow (contract
// section 4): upstream_error (retried by policy), empty_response (executed,
// unusable: falls back), or ambiguous under a verdict that allowed
// another attempt. One attempt executed twice, or an execution under an
// attempt the action never recorded, always counts.
func ExecutedTwice(p *providertest.Provider, id string, res workflows.ActionResult, faults bool) bool {
	n := p.ExecutedCount(id)
	if n <= 1 {
		return false
	}
	if !faults {
		return true
	}
	recorded := 0
	for i, a := range res.Attempts {
		e := p.AttemptExecutions(a.Evidence.AttemptID)
		if e == 0 {
			continue
		}
		recorded += e
		if e > 1 {
			return true
		}
		if i == len(res.Attempts)-1 {
			continue
		}
		switch a.Classification.Class {
		case evidence.UpstreamError, evidence.EmptyResponse:
		case evidence.Ambiguous:
			if !verdictLetsAnotherFollow(a) {
				return true
			}
		default:
			return true
		}
	}
	return recorded != n
}

// executions says how often the provider ran the action and each attempt,
// with its class and what the provider did.
func executions(p *providertest.Provider, id string, res workflows.ActionResult) string {
	parts := []string{fmt.Sprintf("%d executions", p.ExecutedCount(id))}
	for _, a := range res.Attempts {
		parts = append(parts, fmt.Sprintf("attempt %d %s%s ran %d (%s)", a.N, a.Classification.Class, verdictNote(a), p.AttemptExecutions(a.Evidence.AttemptID), BehaviorOf(p, a.Evidence.AttemptID)))
	}
	return strings.Join(parts, "; ")
}

func verdictNote(a workflows.AttemptRecord) string {
	if a.Verdict == attempt.VerdictNone {
		return ""
	}
	return ", verdict " + string(a.Verdict) + " by " + a.VerdictBy
}

// Failed reports whether an invariant broke: a violation, or an action
// executed twice.
func (r *Report) Failed() bool { return len(r.Violations) > 0 || len(r.Twice) > 0 }

// BehaviorOf names what the provider did with an attempt's request(s).
func BehaviorOf(p *providertest.Provider, attemptID string) string {
	var names []string
	for _, r := range p.Received() {
		if r.AttemptID == attemptID {
			names = append(names, r.Behavior)
		}
	}
	return strings.Join(names, ", ")
}

// Print writes the report as tables.
func (r *Report) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if r.Provider.Settled > 0 || len(r.Provider.LeftBy) > 0 {
		// Deferred before the journal's line, so printed after it.
		defer fmt.Fprintf(w, "provider's record: %d attempts settled from the provider's record (completed, by provider)%s\n",
			r.Provider.Settled, leftBy("of those left to a person, the lookup", r.Provider.LeftBy))
	}
	if r.Journal.Reconciled+r.Journal.NotProcessed+r.Journal.LeftToPerson > 0 {
		defer fmt.Fprintf(w, "\nattempt journal: %d reconciled from a response a worker received, %d proven not processed (sent on), %d left to a person%s\n",
			r.Journal.Reconciled, r.Journal.NotProcessed, r.Journal.LeftToPerson, leftBy("journal", r.Journal.LeftBy))
	}
	fmt.Fprintf(tw, "actions\t%d\nserver restarts\t%d\nworker processes SIGKILLed\t%d\nhaproxy reloads\t%d\nattempts\t%d\nexecuted by the provider\t%d\n", r.Actions, r.Restarts, r.Kills, r.Reloads, r.Attempts, r.ProviderRun)
	// Only a run with an in-process worker counts its engine's connections.
	if r.Conns > 0 {
		fmt.Fprintf(tw, "connections opened (in-process worker)\t%d\n", r.Conns)
	}
	fmt.Fprintf(tw, "executed twice where nothing let it\t%d\n", len(r.Twice))
	fmt.Fprintf(tw, "elapsed\t%s\n", r.Elapsed.Round(time.Millisecond))
	for _, k := range sortedKeys(r.GoAways) {
		fmt.Fprintf(tw, "GOAWAY %s received\t%d\n", k, r.GoAways[k])
	}
	if len(r.Faults) > 0 {
		fmt.Fprintf(tw, "extra executions (allowed; see Report)\t%d\n", r.ExtraExecutions)
		fmt.Fprintln(tw, "\nfault injected\trequests")
		for _, k := range sortedKeys(r.Faults) {
			fmt.Fprintf(tw, "%s\t%d\n", k, r.Faults[k])
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "final state\tactions")
	for _, k := range sortedKeys(r.States) {
		fmt.Fprintf(tw, "%s\t%d\n", k, r.States[workflows.State(k)])
	}
	fmt.Fprintln(tw, "\nattempt classification\tattempts")
	for _, k := range sortedKeys(r.Classes) {
		fmt.Fprintf(tw, "%s\t%d\n", k, r.Classes[evidence.Class(k)])
	}
	if len(r.Seen) > 0 {
		fmt.Fprintln(tw, "\nthe provider did\tthe client classified (through haproxy)")
		for _, b := range sortedKeys(r.Seen) {
			var parts []string
			for _, c := range sortedKeys(r.Seen[b]) {
				parts = append(parts, fmt.Sprintf("%s %d", c, r.Seen[b][evidence.Class(c)]))
			}
			name := b
			if name == "" {
				name = "(never received)"
			}
			fmt.Fprintf(tw, "%s\t%s\n", name, strings.Join(parts, ", "))
		}
	}
	tw.Flush()
	if len(r.Twice) > 0 {
		fmt.Fprintln(w)
	}
	for _, id := range r.Twice {
		fmt.Fprintf(w, "EXECUTED TWICE %s\n", id)
	}
	if len(r.Left) > 0 {
		fmt.Fprintln(w, "\nleft to a person:")
	}
	for _, l := range r.Left {
		fmt.Fprintln(w, "  "+l)
	}
	if len(r.Violations) == 0 {
		fmt.Fprintln(w, "\ninvariants: all held")
		return
	}
	fmt.Fprintf(w, "\ninvariants: %d VIOLATED\n", len(r.Violations))
	for _, v := range r.Violations {
		fmt.Fprintln(w, "  "+v)
	}
}

func sortedKeys[K ~string, V any](m map[K]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, string(k))
	}
	sort.Strings(ks)
	return ks
}

// leftBy renders what a source (the journal, the provider's record) held
// for the actions left to a person, in a stable order.
func leftBy(source string, m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return " (" + source + ": " + strings.Join(parts, ", ") + ")"
}
