package workflows

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/net/http/httpguts"

	"github.com/durallm/durallm/providers"
)

// UnmarshalJSON reads an ActionInput, taking each duration (deadline,
// attempt_timeout, queue_timeout, reconcile_timeout, backoff.initial,
// backoff.max) as a number of nanoseconds or as a Go duration string
// ("2m"), so an app in another language can write "deadline": "2m". It
// writes numbers, as before, so recorded histories read the same.
func (in *ActionInput) UnmarshalJSON(b []byte) error {
	type plain ActionInput // no methods: no recursion
	var w struct {
		*plain
		Deadline         DurationJSON `json:"deadline"`
		AttemptTimeout   DurationJSON `json:"attempt_timeout"`
		QueueTimeout     DurationJSON `json:"queue_timeout"`
		ReconcileTimeout DurationJSON `json:"reconcile_timeout"`
	}
	w.plain = (*plain)(in)
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	in.Deadline, in.AttemptTimeout = time.Duration(w.Deadline), time.Duration(w.AttemptTimeout)
	in.QueueTimeout, in.ReconcileTimeout = time.Duration(w.QueueTimeout), time.Duration(w.ReconcileTimeout)
	return nil
}

// JSONPayload is in's JSON as claimcheck.SelfEncoding writes it: the
// request by Request.AppendJSON (its verbatim members copied, not
// compacted), the other members by json.Marshal.
func (in ActionInput) JSONPayload() ([]byte, error) {
	type plain ActionInput // no methods
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

// ChecksItsJSON marks ActionInput as claimcheck.SelfChecking: its
// UnmarshalJSON decodes with json.Unmarshal, which checks the whole input,
// so a data converter may skip its own check of a large request.
func (*ActionInput) ChecksItsJSON() {}

// WithDefaults fills the zero values documented on ActionInput, using
// workflowID as the default idempotency key.
func (in ActionInput) WithDefaults(workflowID string) ActionInput {
	if in.MaxAttempts == 0 {
		in.MaxAttempts = defaultMaxAttempts
	}
	if in.Deadline == 0 {
		in.Deadline = defaultDeadline
	}
	if in.QueueTimeout == 0 {
		in.QueueTimeout = defaultQueueTimeout
	}
	if in.ReconcileTimeout == 0 {
		in.ReconcileTimeout = defaultReconcileTimeout
	}
	if in.ReplayPolicy == "" {
		in.ReplayPolicy = ReplayNever
	}
	if in.IdempotencyKey == "" {
		in.IdempotencyKey = workflowID
	}
	if in.RetriesPerRoute == 0 {
		in.RetriesPerRoute = defaultRetriesPerRoute
	}
	return in
}

// ErrInvalidInput matches (errors.Is) the error of an action whose input
// was rejected: by Validate, by the Go client before starting, or by the
// workflow itself. Nothing was dispatched.
var ErrInvalidInput = errors.New("durallm: invalid action input")

// InputError lists every problem with an ActionInput, each naming its
// field. It matches ErrInvalidInput.
type InputError struct {
	Problems []error
}

func (e *InputError) Error() string { return ErrInvalidInput.Error() + ": " + e.problems() }

func (e *InputError) problems() string { return errors.Join(e.Problems...).Error() }

// Is reports that an InputError is ErrInvalidInput.
func (e *InputError) Is(target error) bool { return target == ErrInvalidInput }

// Unwrap returns the problems.
func (e *InputError) Unwrap() []error { return e.Problems }

// maxIdempotencyKey bounds the key: it is sent on every attempt, and
// providers cap theirs (OpenAI's idempotency keys are at most 256 bytes).
const maxIdempotencyKey = 256

// Validate reports every problem with the input, each naming its field,
// as an *InputError (nil when there is none).
func (in ActionInput) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if err := in.Request.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("request: %w", err))
	}
	if len(in.Routes) == 0 {
		bad("routes", "at least one route name is required")
	}
	seen := map[string]bool{}
	for i, r := range in.Routes {
		switch {
		case r == "":
			bad(fmt.Sprintf("routes[%d]", i), "empty route name")
		case seen[r]:
			bad(fmt.Sprintf("routes[%d]", i), "route %q listed twice", r)
		}
		seen[r] = true
	}
	if in.MaxAttempts < 1 || in.MaxAttempts > maxMaxAttempts {
		bad("max_attempts", "%d is outside 1..%d", in.MaxAttempts, maxMaxAttempts)
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"deadline", in.Deadline}, {"attempt_timeout", in.AttemptTimeout}, {"queue_timeout", in.QueueTimeout}, {"reconcile_timeout", in.ReconcileTimeout}, {"backoff.initial", in.Backoff.Initial}, {"backoff.max", in.Backoff.Max}} {
		if d.v < 0 {
			bad(d.field, "negative duration %s", d.v)
		}
	}
	if in.AttemptTimeout > in.Deadline && in.Deadline > 0 {
		bad("attempt_timeout", "%s exceeds the deadline %s", in.AttemptTimeout, in.Deadline)
	}
	switch in.ReplayPolicy {
	case ReplayNever, ReplayIdempotent:
	default:
		bad("replay_policy", "unknown policy %q: want %q or %q", in.ReplayPolicy, ReplayNever, ReplayIdempotent)
	}
	if in.RetriesPerRoute < 0 {
		bad("retries_per_route", "negative: %d", in.RetriesPerRoute)
	}
	if in.Needs.ContextTokens < 0 {
		bad("needs.context_tokens", "negative: %d", in.Needs.ContextTokens)
	}
	in.validateSpending(bad)
	switch {
	case len(in.IdempotencyKey) > maxIdempotencyKey:
		bad("idempotency_key", "%d bytes, at most %d", len(in.IdempotencyKey), maxIdempotencyKey)
	case !httpguts.ValidHeaderFieldValue(in.IdempotencyKey):
		// It is sent as a header on every attempt: a key the client cannot
		// encode could never be sent. Its value is not quoted.
		bad("idempotency_key", "not a valid HTTP header value (control characters such as CR or LF)")
	}
	if len(errs) == 0 {
		return nil
	}
	return &InputError{Problems: errs}
}

// Problems lists what is wrong with b as a limit, each naming its field
// under field ("budget.tokens"): a negative, non-finite or absurd value,
// or neither tokens nor cost set. Nil for a valid limit.
func (b Budget) Problems(field string) []error {
	var errs []error
	b.check(field, func(f, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", f, fmt.Sprintf(format, args...)))
	})
	return errs
}

// check reports b's problems to bad, as Problems says.
func (b Budget) check(field string, bad func(field, format string, args ...any)) {
	switch {
	case b.Tokens < 0:
		bad(field+".tokens", "negative")
	case b.Tokens > MaxBudgetTokens:
		bad(field+".tokens", "above %d", int64(MaxBudgetTokens))
	}
	switch {
	case math.IsNaN(b.Cost) || math.IsInf(b.Cost, 0):
		bad(field+".cost", "not a finite number")
	case b.Cost < 0:
		bad(field+".cost", "negative")
	case b.Cost > MaxBudgetCost:
		bad(field+".cost", "above %d", MaxBudgetCost)
	}
	if b.Tokens == 0 && b.Cost == 0 {
		bad(field, "neither tokens nor cost is set: a zero limit would send nothing (leave the budget out for none)")
	}
}

// maxCaller bounds the caller's name, a metric label.
const maxCaller = 128

// validateSpending checks the budget (a limit set, none negative, not a
// number or absurd; a request whose prompt can be bounded) and the
// caller.
func (in ActionInput) validateSpending(bad func(field, format string, args ...any)) {
	if b := in.Budget; b != nil {
		b.check("budget", bad)
		if _, ok := in.Request.PromptTokenBound(0); !ok {
			bad("budget", "the request has a file content part, whose tokens nothing bounds, so no attempt's worst case can be reserved")
		}
	}
	switch {
	case len(in.Caller) > maxCaller:
		bad("caller", "%d bytes, at most %d", len(in.Caller), maxCaller)
	case !utf8.ValidString(in.Caller) || strings.ContainsFunc(in.Caller, unicode.IsControl):
		bad("caller", "not UTF-8 text without control characters")
	}
}
