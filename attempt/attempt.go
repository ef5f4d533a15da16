// Package attempt is the contract between the LLMAction workflow and the
// activities it schedules: the activities' names, what each is given and
// what each returns. The workflow refers to its activities by these names
// and types alone, so the workflow package, and the app-facing client
// above it, link no provider adapter, metrics or HTTP code; the
// activities package implements the contract on the worker.
package attempt

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
)

// DefaultTaskQueue is the task queue durallm's workflow and activities
// run on unless a worker is told otherwise. Every default of the project
// (the worker's, the client's, the cluster harness's) is this one.
const DefaultTaskQueue = "durallm"

// DefaultAttemptTimeout is an attempt's timeout when neither the action
// nor its route sets one (docs/contract.md section 4.4).
const DefaultAttemptTimeout = 60 * time.Second

// The activities' registered names, as history records them.
const (
	// CallModel makes one attempt: Input in, Outcome out.
	CallModel = "CallModel"
	// DescribeRoutes answers a PlanInput with the Plan (a local
	// activity).
	DescribeRoutes = "DescribeRoutes"
	// Reconcile asks the worker's reconciler about an ambiguous attempt:
	// ReconcileInput in, ReconcileOutput out.
	Reconcile = "Reconcile"
)

// Input is one CallModel execution: one attempt of one action.
type Input struct {
	ActionRef      string            `json:"action_ref"`
	Attempt        int               `json:"attempt"`
	AttemptID      string            `json:"attempt_id"`
	IdempotencyKey string            `json:"idempotency_key"`
	Route          string            `json:"route"`
	Request        providers.Request `json:"request"`
	// Avoid lists connection refs earlier attempts saw GOAWAY or 421 on.
	Avoid []string `json:"avoid,omitempty"`
	// FreshConnection demands a newly dialed connection (after a 421).
	FreshConnection bool `json:"fresh_connection,omitempty"`
	// AfterMisdirected says an earlier attempt of the action got a 421:
	// any later 421, on any route, is misdirected_repeated.
	AfterMisdirected bool `json:"after_misdirected,omitempty"`
	// Timeout bounds the HTTP exchange; zero means the route's
	// AttemptTimeout. The activity's StartToClose bounds it too.
	Timeout time.Duration `json:"timeout,omitempty"`
	// Caller is the action's caller (workflows.ActionInput.Caller), a
	// label on the attempt's token and cost metrics; empty when none.
	Caller string `json:"caller,omitempty"`
	// CapacityWait is the longest the attempt may wait for room under its
	// route's fleet-wide limits before it is sent, counted from when it
	// was scheduled: what the action's deadline leaves beyond the
	// attempt's Timeout. The activity's StartToClose includes it. Zero
	// means it may not wait (a route without limits needs none).
	CapacityWait time.Duration `json:"capacity_wait,omitempty"`
}

// JSONPayload is in's JSON as claimcheck.SelfEncoding writes it: the
// request by providers.Request.AppendJSON (its verbatim members copied,
// not compacted), the other members by json.Marshal.
func (in Input) JSONPayload() ([]byte, error) {
	type plain Input // no methods
	rest, err := json.Marshal(struct {
		plain
		// Hides plain's Request (the shallower field wins).
		Request *struct{} `json:"request,omitempty"`
	}{plain: plain(in)})
	if err != nil {
		return nil, err
	}
	return providers.WithRequestMember(rest, in.Request)
}

// Outcome is what one attempt produced: the wire evidence, its
// classification, and the response when there is one. It holds no
// content except Response, which is the model's answer.
type Outcome struct {
	Evidence       evidence.Evidence       `json:"evidence"`
	Classification evidence.Classification `json:"classification"`
	Response       *providers.Response     `json:"response,omitempty"`
	// ResponseRef replaces Response when the response was too large for
	// history and went to the worker's result store.
	ResponseRef string `json:"response_ref,omitempty"`
	// Usage is the token usage the provider reported for the attempt,
	// whatever its class (a response kept by reference included); nil
	// when it reported none.
	Usage *providers.Usage `json:"usage,omitempty"`
}

// Progress is the heartbeat detail of a running attempt: evidence for an
// operator if the worker dies, never proof that the request was not
// executed.
type Progress struct {
	AttemptID      string `json:"attempt_id"`
	Stage          string `json:"stage"` // StageWaitingForCapacity, "sending", "streaming"
	ConnRef        string `json:"conn_ref,omitempty"`
	ContentStarted bool   `json:"content_started,omitempty"`
	ResponseBytes  int64  `json:"response_bytes,omitempty"`
	// StreamURL is where the worker running the attempt serves its
	// stream (activities.Streams' handler: GET StreamURL/v1/streams/{id}),
	// when it advertises one and the attempt streams (docs/gateway.md).
	StreamURL string `json:"stream_url,omitempty"`
	// CapacityLimit is, while Stage is StageWaitingForCapacity, the
	// route's limit the attempt waits for room in (requests, tokens,
	// concurrency, pushback).
	CapacityLimit string `json:"capacity_limit,omitempty"`
}

// StageWaitingForCapacity is Progress.Stage while an attempt waits for
// room under its route's fleet-wide limits: nothing has been sent.
const StageWaitingForCapacity = "waiting_for_capacity"

// streamIdentityMark starts the stream URL in a worker's identity.
const streamIdentityMark = "@durallm-stream="

// StreamIdentity is the Temporal worker identity of a worker that serves
// its streams at streamURL: the SDK's usual pid@host@task-queue with the
// URL after it. Temporal records it when an attempt starts
// (PendingActivityInfo.LastWorkerIdentity), before any heartbeat, which is
// how a caller in another process finds an attempt's stream without
// waiting for one. An empty streamURL gives base.
func StreamIdentity(base, streamURL string) string {
	if streamURL == "" {
		return base
	}
	return base + streamIdentityMark + streamURL
}

// StreamURLOf is the stream URL in a worker identity StreamIdentity made,
// "" for any other identity.
func StreamURLOf(identity string) string {
	_, url, _ := strings.Cut(identity, streamIdentityMark)
	return url
}

// RouteInfo is what the workflow may know of a route: no URL, no key.
type RouteInfo struct {
	Name                  string                 `json:"name"`
	Kind                  string                 `json:"kind"`
	Model                 string                 `json:"model"`
	Capabilities          providers.Capabilities `json:"capabilities"`
	HonoursIdempotencyKey bool                   `json:"honours_idempotency_key,omitempty"`
	IdempotencyWindow     time.Duration          `json:"idempotency_window,omitempty"`
	AttemptTimeout        time.Duration          `json:"attempt_timeout,omitempty"`
	// ProviderRecordSettle is how long past an attempt's deadline the
	// built-in reconciler may look for the route's provider record (the
	// route's provider_record_settle); zero when the route keeps none.
	// The workflow gives the reconcile activity that much more time.
	ProviderRecordSettle time.Duration `json:"provider_record_settle,omitempty"`
	// Limited reports that the route has fleet-wide limits, so its
	// attempts may wait for room before they are sent (Input.CapacityWait).
	Limited bool `json:"limited,omitempty"`
	// Prices are the route's prices per million tokens, which price each
	// attempt's usage and a budget's worst case; nil when the route has
	// none.
	Prices *providers.Prices `json:"prices,omitempty"`
	// ImageTokens bounds the prompt tokens of one image on the route
	// (providers.Request.PromptTokenBound); zero means the default.
	ImageTokens int `json:"image_tokens,omitempty"`
}

// PlanInput names the routes an action wants.
type PlanInput struct {
	Routes []string `json:"routes"`
}

// Plan is the worker's description of the named routes, in the order
// asked, and whether a reconciler is configured. Unknown names are listed
// apart so the workflow can record why it skipped them.
type Plan struct {
	Routes           []RouteInfo `json:"routes"`
	Unknown          []string    `json:"unknown,omitempty"`
	Reconciler       bool        `json:"reconciler"`
	SearchAttributes bool        `json:"search_attributes"`
	// StateUpserts is how LLMAction keeps DurallmState current, and
	// DescribeRoutes always sets CurrentStateUpserts. It travels in the
	// plan, which history records, so that a history replays the way it
	// was recorded: histories from before the field have 0.
	StateUpserts int `json:"state_upserts,omitempty"`
	// DeadlineTimer is when LLMAction starts a timer for the overall
	// deadline around an attempt; DescribeRoutes always sets
	// CurrentDeadlineTimer. It travels in the plan for the same reason
	// as StateUpserts: histories from before the field have 0.
	DeadlineTimer int `json:"deadline_timer,omitempty"`
}

// The ways LLMAction keeps its search attributes current.
const (
	// StateUpsertsEveryChange upserts on every state change, queued
	// included (histories recorded before StateUpserts existed).
	StateUpsertsEveryChange = 0
	// StateUpsertsSkipQueued leaves out the upsert for queued: the first
	// dispatch's upsert (or the end's) always follows it in the same
	// workflow task, so no visibility record ever showed it, and each
	// upsert is a history event and a visibility task, about 5% of an
	// action's CPU on the embedded server (docs/performance.md).
	StateUpsertsSkipQueued = 1
	// CurrentStateUpserts is what new actions use.
	CurrentStateUpserts = StateUpsertsSkipQueued
)

// When LLMAction times the overall deadline around an attempt.
const (
	// DeadlineTimerEveryAttempt starts one for every attempt (histories
	// recorded before DeadlineTimer existed).
	DeadlineTimerEveryAttempt = 0
	// DeadlineTimerNearDeadline starts one only when the attempt's own
	// Temporal timeouts (ScheduleToStart, then StartToClose) could let it
	// run past the deadline. Otherwise Temporal ends the activity first
	// and the timer could never fire: it was only a history event and a
	// timer task per action that waited in the server until the deadline
	// (docs/performance.md).
	DeadlineTimerNearDeadline = 1
	// CurrentDeadlineTimer is what new actions use.
	CurrentDeadlineTimer = DeadlineTimerNearDeadline
)

// Verdict is a reconciliation decision (docs/contract.md section 5).
type Verdict string

// The verdicts.
const (
	// VerdictNone: the reconciler could not tell; wait for a person.
	VerdictNone Verdict = ""
	// VerdictCompleted: the request was executed; its result is supplied.
	VerdictCompleted Verdict = "completed"
	// VerdictNotExecuted: the provider never ran it; retry normally.
	VerdictNotExecuted Verdict = "not_executed"
	// VerdictAllowReplay: run another attempt despite the risk.
	VerdictAllowReplay Verdict = "allow_replay"
	// VerdictAbandon: give up; the action ends indeterminate.
	VerdictAbandon Verdict = "abandon"
)

// ReconcileInput describes the ambiguous attempt to the reconciler.
type ReconcileInput struct {
	ActionRef      string            `json:"action_ref"`
	IdempotencyKey string            `json:"idempotency_key"`
	Attempt        int               `json:"attempt"`
	AttemptID      string            `json:"attempt_id"`
	Route          string            `json:"route"`
	Evidence       evidence.Evidence `json:"evidence"`
	// Remaining is how long the attempt's activity could still run (to
	// its deadline) when the workflow asked; the built-in reconciler
	// times the provider record's settle window from it, on its own
	// clock. Zero when the deadline had passed, and in histories from
	// before the field.
	Remaining time.Duration `json:"remaining,omitempty"`
}

// ReconcileOutput is the reconciler's answer.
type ReconcileOutput struct {
	Verdict  Verdict             `json:"verdict"`
	Response *providers.Response `json:"response,omitempty"`
	// ResultRef replaces Response when it was too large for history and
	// went to the worker's result store.
	ResultRef string `json:"result_ref,omitempty"`
	Note      string `json:"note,omitempty"`
	// By names the source of the verdict: ByJournal, ByProvider or
	// ByReconciler; with no verdict, the last one asked.
	By string `json:"by,omitempty"`
	// JournalState is what the attempt journal held for the attempt
	// when the built-in reconciler looked (journal.State: "received",
	// "not_processed", "sent", "ended_unanswered"), "none" for no entry,
	// "unreadable" when it could not be read; empty with no journal.
	JournalState string `json:"journal_state,omitempty"`
	// ProviderRecord is what the built-in reconciler found in the route's
	// provider record (ProviderRecordFound, ...); empty when the route
	// keeps none or it did not look.
	ProviderRecord string `json:"provider_record,omitempty"`
}

// What the built-in reconciler found in a provider's record
// (ReconcileOutput.ProviderRecord).
const (
	// ProviderRecordFound: a stored completion with a usable answer.
	ProviderRecordFound = "found"
	// ProviderRecordNotFound: none within the settle window, which never
	// proves that the provider did not execute the request.
	ProviderRecordNotFound = "not_found"
	// ProviderRecordUnusable: a stored completion without a usable
	// answer (still in progress, or empty): executed, but no answer.
	ProviderRecordUnusable = "unusable"
	// ProviderRecordUnreadable: the record could not be listed.
	ProviderRecordUnreadable = "unreadable"
)

// The sources of a reconciler's verdict (ReconcileOutput.By).
const (
	// ByJournal: the attempt journal held the response a worker received.
	ByJournal = "journal"
	// ByProvider: the provider's own record of the request (a stored
	// completion) held its answer.
	ByProvider = "provider"
	// ByReconciler: the application's reconciler (activities.Reconciler).
	ByReconciler = "reconciler"
)
