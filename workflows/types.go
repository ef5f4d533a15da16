package workflows

import (
	"time"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/evidence"

	"github.com/durallm/durallm/providers"
)

// Names of the workflow, its signals, Update and query, as they appear in
// the Temporal UI and CLI.
const (
	WorkflowName    = "LLMAction"
	SignalCancel    = "cancel"
	SignalReconcile = "reconcile"
	UpdateReconcile = "reconcile"
	QueryStatus     = "status"
)

// ActionInput is one user action. Zero values take the defaults named on
// each field; anything else invalid fails the action at start, naming the
// field, before anything is dispatched.
type ActionInput struct {
	// Request is the model request in the OpenAI chat-completions shape.
	Request providers.Request `json:"request"`
	// Routes are route names in order: the primary first, then fallbacks.
	// Required. Routes are configured on the worker; no URL or key here.
	Routes []string `json:"routes"`
	// Needs are the capabilities the action requires of every route it
	// uses. A route that lacks one is skipped, with the reason recorded.
	Needs providers.Capabilities `json:"needs"`
	// MaxAttempts is the one budget across every route, transport retry,
	// 421 retry, fallback and replay. Zero means 4; at most 50.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// Deadline bounds the whole action from its start. Zero means 5m.
	Deadline time.Duration `json:"deadline,omitempty"`
	// AttemptTimeout bounds one attempt; never past the deadline. Zero
	// means the route's attempt timeout, or 60s.
	AttemptTimeout time.Duration `json:"attempt_timeout,omitempty"`
	// QueueTimeout bounds how long an attempt may wait for a worker to pick
	// it up; past it the attempt is unsent. Zero means 30s.
	QueueTimeout time.Duration `json:"queue_timeout,omitempty"`
	// ReconcileTimeout bounds the wait for a reconciliation verdict, after
	// which the action ends indeterminate. Zero means 24h.
	ReconcileTimeout time.Duration `json:"reconcile_timeout,omitempty"`
	// ReplayPolicy says whether an ambiguous attempt may be replayed
	// without a verdict. Zero means ReplayNever.
	ReplayPolicy ReplayPolicy `json:"replay_policy,omitempty"`
	// IdempotencyKey is sent on every attempt. Empty means the workflow id.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// Backoff shapes waits between attempts. Zero means 500ms doubling to
	// a 30s cap, with full jitter.
	Backoff Backoff `json:"backoff,omitempty"`
	// RetriesPerRoute is how many retries a route gets after a retryable
	// failure (unsent, throttled, upstream_error) before the action falls
	// back to the next route. Zero means 1. Transport retries after a
	// GOAWAY and 421 retries do not count here (they do count against
	// MaxAttempts).
	RetriesPerRoute int `json:"retries_per_route,omitempty"`
	// NotifyParent makes an action started as a child workflow signal its
	// parent (ParentSignalName) each time it enters or leaves
	// awaiting_reconciliation, so the parent can stop waiting for a
	// verdict (package step sets it for step.ReturnIfAwaiting). Default
	// false: no signal.
	NotifyParent bool `json:"notify_parent,omitempty"`
	// Budget bounds what the action's attempts may spend, in tokens
	// and/or cost: each attempt's worst case is reserved before it is
	// sent, and an attempt whose worst case does not fit is not sent (the
	// action ends spend_exhausted). Nil means none: only MaxAttempts
	// bounds the action.
	Budget *Budget `json:"budget,omitempty"`
	// Caller names who the action is for (the gateway sets its caller's
	// id): a label on the durallm.tokens and durallm.cost metrics, so it
	// must come from a small set of names, never from content. At most
	// 128 bytes of UTF-8 without control characters. Empty means none.
	Caller string `json:"caller,omitempty"`
}

// ReplayPolicy says what may happen to an ambiguous attempt without a
// reconciliation verdict.
type ReplayPolicy string

const (
	// ReplayNever: always wait for reconciliation.
	ReplayNever ReplayPolicy = "never"
	// ReplayIdempotent: replay on the same route automatically when the
	// route declares it honours Idempotency-Key and the attempt is within
	// the route's idempotency window; otherwise wait for reconciliation.
	ReplayIdempotent ReplayPolicy = "idempotency_key"
)

// State is where an action is in the contract's state machine
// (docs/contract.md section 4).
type State string

// The states. The last eight are terminal.
const (
	StateQueued                 State = "queued"
	StateDispatching            State = "dispatching"
	StateBackingOff             State = "backing_off"
	StateAwaitingReconciliation State = "awaiting_reconciliation"

	StateCompleted        State = "completed"
	StateCompletedPartial State = "completed_partial"
	StateReconciled       State = "reconciled"
	StateFailed           State = "failed"
	StateRejected         State = "rejected"
	StateCanceled         State = "canceled"
	StateIndeterminate    State = "indeterminate"
	// StateSpendExhausted: the next attempt's worst case did not fit the
	// action's Budget, so it was not sent. Neither a provider failure nor
	// a rejection: the action's own limit ended it.
	StateSpendExhausted State = "spend_exhausted"
)

// Terminal reports whether s ends the action.
func (s State) Terminal() bool {
	switch s {
	case StateCompleted, StateCompletedPartial, StateReconciled, StateFailed, StateRejected, StateCanceled, StateIndeterminate, StateSpendExhausted:
		return true
	}
	return false
}

// ParentSignalPrefix begins the name of the signal an action started with
// NotifyParent sends its parent workflow.
const ParentSignalPrefix = "durallm-awaiting:"

// ParentSignalName is the name of the signal the action actionRef sends
// its parent, ParentSignalPrefix + actionRef: one name per action, so
// each call a parent makes reads a channel of its own.
func ParentSignalName(actionRef string) string { return ParentSignalPrefix + actionRef }

// AwaitingNotice is the payload of that signal.
type AwaitingNotice struct {
	ActionRef string `json:"action_ref"`
	// Awaiting is true when the action entered awaiting_reconciliation,
	// false when a verdict moved it on to another attempt. (Its end is
	// the child workflow's completion, not a notice.)
	Awaiting bool `json:"awaiting"`
	// Attempt is the attempt a verdict must name, while awaiting.
	Attempt int `json:"attempt,omitempty"`
	// Since is when the action began to await the verdict (the action's
	// workflow time), while awaiting.
	Since time.Time `json:"since,omitzero"`
}

// CancelOrigin says who or what ended an action's scope.
type CancelOrigin string

// The origins.
const (
	OriginUserStop         CancelOrigin = "user_stop"
	OriginClientDisconnect CancelOrigin = "client_disconnect"
	OriginOperatorStop     CancelOrigin = "operator_stop"
	OriginOverallDeadline  CancelOrigin = "overall_deadline"
	OriginParentCanceled   CancelOrigin = "parent_canceled"
)

// Requestable reports whether o is an origin a cancel signal may carry
// (user_stop, client_disconnect, operator_stop); the other two are the
// workflow's own.
func (o CancelOrigin) Requestable() bool {
	switch o {
	case OriginUserStop, OriginClientDisconnect, OriginOperatorStop:
		return true
	}
	return false
}

// CancelRequest is the payload of the cancel signal.
type CancelRequest struct {
	// Origin is user_stop, client_disconnect or operator_stop.
	Origin CancelOrigin `json:"origin"`
	// Note is free text for the operator; never shown as content.
	Note string `json:"note,omitempty"`
}

// ReconcileRequest is the payload of the reconcile signal and Update.
type ReconcileRequest struct {
	// Attempt is the number of the ambiguous attempt being reconciled; a
	// stale number is rejected.
	Attempt int `json:"attempt"`
	// Verdict is completed, not_executed, allow_replay or abandon.
	Verdict attempt.Verdict `json:"verdict"`
	// Response is the result for a completed verdict (or ResultRef).
	Response *providers.Response `json:"response,omitempty"`
	// ResultRef points at a stored result for a completed verdict.
	ResultRef string `json:"result_ref,omitempty"`
	// By names who decided, for the record.
	By string `json:"by,omitempty"`
}

// Decision is what the workflow did after an attempt, and why: the
// contract's per-attempt decision (docs/contract.md section 2.3). It is recorded
// on the attempt and carried by the attempt's "llm.attempt" event.
type Decision struct {
	// Next is one of the Decide* values.
	Next string `json:"next"`
	// Why names what decided it: the classification's reason, or a rule
	// of the workflow's ("budget_exhausted", "retry_after_beyond_deadline",
	// "token_budget_exhausted", "cost_budget_exhausted").
	Why string `json:"why,omitempty"`
	// Route is the route of the next attempt, for a retry, fallback or
	// replay.
	Route string `json:"route,omitempty"`
	// Wait is the backoff before the next attempt, zero when none.
	Wait time.Duration `json:"wait,omitempty"`
}

// What can follow an attempt (Decision.Next).
const (
	// DecideFinish: the action ends with the attempt's response.
	DecideFinish = "finish"
	// DecideRetry: another attempt on the same route.
	DecideRetry = "retry"
	// DecideFallback: another attempt on another route.
	DecideFallback = "fallback"
	// DecideReplay: an ambiguous attempt replayed under the replay policy.
	DecideReplay = "replay"
	// DecideAwait: the action waits for a reconciliation verdict.
	DecideAwait = "await_reconciliation"
	// DecideStop: the action ends without a response.
	DecideStop = "stop"
)

// InvalidInputType is the type of the non-retryable application error an
// action fails with when its input is invalid. The Go client turns it
// back into an error matching ErrInvalidInput.
const InvalidInputType = "InvalidInput"

// The types of the application error a rejected reconcile Update carries
// (docs/contract.md section 5.3): a client decides on these, never on the text.
const (
	// RejectNotAwaiting: the action is not awaiting reconciliation.
	RejectNotAwaiting = "NotAwaitingReconciliation"
	// RejectVerdictPending: a verdict is already being applied.
	RejectVerdictPending = "VerdictPending"
	// RejectStaleAttempt: the verdict names another attempt than the one
	// awaiting reconciliation.
	RejectStaleAttempt = "StaleAttempt"
	// RejectInvalidVerdict: an unknown verdict, or completed without a
	// result.
	RejectInvalidVerdict = "InvalidVerdict"
)

// AttemptRecord is one attempt in the action's timeline. It holds evidence
// and decisions, never content.
type AttemptRecord struct {
	N     int    `json:"n"`
	Route string `json:"route"`
	// Why says why this attempt was made on this route: "primary",
	// "retry after throttled", "fallback after empty_response on a", ...
	Why string `json:"why"`
	// Summary is the one-line activity summary shown in the UI.
	Summary        string                  `json:"summary"`
	Evidence       evidence.Evidence       `json:"evidence"`
	Classification evidence.Classification `json:"classification"`
	// HealthMoved reports whether this outcome counts against the route's
	// health (docs/contract.md section 4.8).
	HealthMoved bool `json:"health_moved"`
	// Scheduled is when the attempt was dispatched (workflow time).
	Scheduled time.Time `json:"scheduled"`
	// Deadline is the latest its activity can run to (queue timeout,
	// attempt timeout and grace after Scheduled): until then the attempt
	// may still end on a live worker even when Temporal has lost track of
	// it, and the built-in reconciler waits for that end.
	Deadline time.Time `json:"deadline"`
	// Duration is how long the workflow waited for it.
	Duration time.Duration `json:"duration"`
	// BackoffAfter is the wait that followed it, zero when none.
	BackoffAfter time.Duration `json:"backoff_after,omitempty"`
	// Decision is what the workflow did next, and why. Empty only while
	// the attempt runs.
	Decision Decision `json:"decision"`
	// Verdict and VerdictBy record the reconciliation verdict applied to
	// this attempt and its source: "journal", "provider" (the route's
	// provider record), "reconciler", or "person" for one sent by a
	// signal or Update (its own By is in the notes); empty when none was.
	Verdict   attempt.Verdict `json:"verdict,omitempty"`
	VerdictBy string          `json:"verdict_by,omitempty"`
	// JournalState is what the attempt journal held for this attempt when
	// the built-in reconciler looked (attempt.ReconcileOutput.JournalState);
	// empty when it did not look.
	JournalState string `json:"journal_state,omitempty"`
	// ProviderRecord is what the built-in reconciler found in the route's
	// provider record (attempt.ReconcileOutput.ProviderRecord: found,
	// not_found, unusable, unreadable); empty when it did not look.
	ProviderRecord string `json:"provider_record,omitempty"`
	// Usage is the token usage the provider reported for this attempt
	// (or the usage of a completed verdict's response); nil when none.
	Usage *providers.Usage `json:"usage,omitempty"`
	// Cost is Usage at the route's prices; zero when the route has none.
	Cost float64 `json:"cost,omitempty"`
	// Reservation is what the action's budget reserved for the attempt
	// and charged it; nil without a budget.
	Reservation *Reservation `json:"reservation,omitempty"`
}

// Note is something the workflow recorded that is not an attempt: a route
// skipped, a signal ignored, a verdict applied.
type Note struct {
	At   time.Time `json:"at"`
	What string    `json:"what"`
}

// Status is the action's state and timeline, as the status query and the
// final result report it.
type Status struct {
	ActionRef string          `json:"action_ref"`
	State     State           `json:"state"`
	Outcome   string          `json:"outcome,omitempty"`
	Reason    string          `json:"reason,omitempty"`
	Origin    CancelOrigin    `json:"origin,omitempty"`
	Attempts  []AttemptRecord `json:"attempts"`
	Notes     []Note          `json:"notes,omitempty"`
	// AwaitingAttempt is the attempt a reconcile must name, when awaiting.
	AwaitingAttempt int `json:"awaiting_attempt,omitempty"`
	// AwaitingSince is when the action began to await that verdict
	// (workflow time), when awaiting.
	AwaitingSince time.Time `json:"awaiting_since,omitzero"`
	// Budget is MaxAttempts; Used is attempts started.
	Budget int `json:"budget"`
	Used   int `json:"used"`
	// Usage is the sum of the usage the attempts reported, and Cost its
	// cost at the routes' prices: what the action used, as the providers
	// count it.
	Usage providers.Usage `json:"usage"`
	Cost  float64         `json:"cost,omitempty"`
	// Ledger is the action's Budget and what its attempts were charged
	// and still hold against it; nil without a budget.
	Ledger *Ledger `json:"ledger,omitempty"`
}

// InlineInHistory keeps a Status, and an ActionResult, in history under
// a data converter that stores large payloads by reference
// (claimcheck.Inline): apps in any language, and parent workflows whose
// workers store nothing by reference, read them. Both are bounded: a
// response over 256 KiB is stored by the worker (ResultRef).
func (Status) InlineInHistory() {}

// ActionResult is the terminal result: the final state, the timeline, and
// the response when there is one.
type ActionResult struct {
	Status
	Response *providers.Response `json:"response,omitempty"`
	// ResultRef is set instead of Response when the response was too
	// large for history (a result-store reference the client resolves), or
	// when a reconcile verdict supplied a reference.
	ResultRef string `json:"result_ref,omitempty"`
}
