package evidence

import (
	"time"
)

// Class is one row of the contract's classification table (docs/contract.md
// section 3). The string values are the contract's words and are stable:
// they appear in workflow history, search attributes, logs and metrics.
type Class string

// The classifications. Each attempt gets exactly one.
const (
	// Completed: a usable response reached the commit boundary.
	Completed Class = "completed"
	// Unsent: the request never left the client (dial or TLS failure, a
	// connection unusable before HEADERS, no worker took the attempt).
	Unsent Class = "unsent"
	// Refused: the server proved it did not process the request: GOAWAY
	// with a last-stream id below the request's stream, or RST_STREAM
	// REFUSED_STREAM.
	Refused Class = "refused"
	// Misdirected: HTTP 421. The connection is quarantined; one retry on a
	// fresh connection to the same authority is allowed.
	Misdirected Class = "misdirected"
	// MisdirectedRepeated: the action's second 421, on any later attempt
	// and any route. Terminal: the authority keeps refusing this request.
	MisdirectedRepeated Class = "misdirected_repeated"
	// Throttled: 429, 503, 529, an overloaded error from the provider, or
	// GOAWAY ENHANCE_YOUR_CALM for an unprocessed stream.
	Throttled Class = "throttled"
	// UpstreamError: 500, 502 (and other 5xx except 503 and 504) before any
	// content.
	UpstreamError Class = "upstream_error"
	// EmptyResponse: a 2xx whose body has no usable content. The provider
	// executed it; the result is unusable.
	EmptyResponse Class = "empty_response"
	// Rejected: any other 4xx. The request is wrong, not the provider.
	Rejected Class = "rejected"
	// IncompatibleRoute: the model is gone or the context is too long for
	// this route.
	IncompatibleRoute Class = "incompatible_route"
	// ContentFiltered: the provider's content filter blocked the request or
	// the output. Terminal and not a reason to fall back.
	ContentFiltered Class = "content_filtered"
	// CommittedPartial: content had already reached the caller when the
	// stream failed, stalled or was cut. Never restarted invisibly.
	CommittedPartial Class = "committed_partial"
	// Ambiguous: the provider may have executed the request. Nothing is
	// sent again without a reconciliation verdict or a replay policy.
	Ambiguous Class = "ambiguous"
	// Canceled: the attempt's scope ended (the caller canceled). Never a
	// provider failure.
	Canceled Class = "canceled"
)

// ReplaySafe reports the contract's "replay-safe" column for the class
// (docs/contract.md section 3.1): the provider did not execute the
// request, so sending it again cannot duplicate work.
func (c Class) ReplaySafe() bool {
	switch c {
	case Unsent, Refused, Misdirected, Throttled:
		return true
	}
	return false
}

// Classes lists every classification in the contract's order.
var Classes = []Class{
	Completed, Unsent, Refused, Misdirected, MisdirectedRepeated, Throttled,
	UpstreamError, EmptyResponse, Rejected, IncompatibleRoute,
	ContentFiltered, CommittedPartial, Ambiguous, Canceled,
}

// Classification is Classify's verdict on one attempt: the class, a short
// machine-readable reason, and the facts about the attempt that only its
// evidence shows and that what follows depends on (its connection must not
// be reused, its route is misconfigured, it moves provider health, the
// provider's pushback). What the workflow does next is decided in one
// place, from these (workflows/decide.go).
type Classification struct {
	// Class is the contract's classification.
	Class Class `json:"class"`
	// Reason names the evidence that decided it, e.g.
	// "goaway_above_boundary" or "connection_closed_without_goaway".
	// It never contains content, headers or GOAWAY debug data, and a
	// peer's HTTP/2 error code appears only as ErrCode.Label, because
	// ambiguous reasons become the durallm.reason metric attribute.
	Reason string `json:"reason"`
	// FreshConnection reports that the next attempt must not use the
	// connection this one used (GOAWAY, 421, REFUSED_STREAM).
	FreshConnection bool `json:"fresh_connection"`
	// RouteMisconfigured reports that the same route would fail the same
	// way: a GOAWAY code that says reconnecting identically fails
	// identically (PROTOCOL_ERROR, INADEQUATE_SECURITY,
	// HTTP_1_1_REQUIRED, ...), or a server that speaks another protocol
	// than the route's http_version. The route is unusable for this
	// action, though the unprocessed request may fall back.
	RouteMisconfigured bool `json:"route_misconfigured,omitempty"`
	// ProviderHealth reports whether this outcome should move the route's
	// health (throttled, upstream_error, empty_response, connection
	// failures). Cancellation, 421, 4xx and a NO_ERROR drain never do.
	ProviderHealth bool `json:"provider_health"`
	// RetryAfter is the provider's pushback hint, or, for an attempt a
	// fleet-wide limit had no room for, when that limit expects room;
	// zero when absent.
	RetryAfter time.Duration `json:"retry_after,omitempty"`
}
