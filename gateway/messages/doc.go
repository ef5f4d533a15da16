// Package messages is the gateway's Messages surface: the wire format of
// Anthropic's POST /v1/messages over the gateway's action core
// (answer.Surface). A request body is read into the envelope
// (providers.Request, OpenAI-shaped, which every route reads, an
// OpenAI-compatible one as an Anthropic one); an answer is rendered as a
// Messages response (an Anthropic route's own body passed on); a stream as
// Anthropic's server-sent events; a problem (answer.Problem, whose kind
// the core decides) as Anthropic's error object with its status and
// x-should-retry. It also answers, for a request that carries
// anthropic-version (answer.Claimant), GET /v1/models in Anthropic's
// shape, and refuses count_tokens and batches with a 501 that says why. It
// decides nothing about actions (docs/gateway.md).
//
// The request is read with small wire structs of this package rather than
// anthropic-sdk-go's MessageNewParams: unmarshalling into the SDK's params
// (v2.15.0) silently drops temperature, top_p and top_k (it has no such
// fields: its API version refuses them) and every member it does not know,
// so it could neither carry them nor refuse what the envelope cannot carry
// (TestWhyRequestsAreReadWithTheirOwnWireStructs). The answers are checked
// against the SDK's own types and stream decoder (sdk_test.go, and
// gateway/e2e against the real gateway): the official SDK is the judge of
// what this package writes.
//
// # Which answers the Messages clients send again
//
// Both anthropic-sdk-go v2.15.0 (internal/requestconfig: shouldRetry) and
// @anthropic-ai/sdk 1.15.0 (client.js: shouldRetry) retry twice by
// default, and obey the response header x-should-retry (true or false)
// before they look at the status; without it they retry 408, 409, 429 and
// every status from 500, and a connection error or timeout.
// anthropic-sdk-go also retries a 200 whose body it could not read, unless
// the 200 says x-should-retry: false. @ai-sdk/anthropic (under the AI SDK)
// retries 408, 409, 429 and 5xx by status alone, and @langchain/anthropic
// every status but 400 to 407, 409 and 413. None of them can send an
// idempotency key by itself, and none retries an error event inside a
// stream by default. So:
//
//   - every answer to a Messages request carries x-should-retry: false,
//     a 200 included, except the refusals where nothing started (429,
//     529, and 408 for a body that did not arrive: true);
//   - an answer whose action may have run (awaiting a verdict, maybe
//     started, indeterminate, canceled, still running) is a 403
//     conflict_error, which none of those clients resends, whatever it
//     reads; error.details.error_code says which (anthropic-sdk-go:
//     Error.ErrorCode).
//
// Each kind's answer:
//
//	kind                         status  error.type             details.error_code
//	invalid_request              400     invalid_request_error  -  (the message starts with the member: "messages.0.role: ...")
//	unauthorized                 401     authentication_error   -
//	forbidden                    403     permission_error       -
//	not_found, model_not_found   404     not_found_error        -
//	too_large                    413     request_too_large      -
//	request_timeout              408     invalid_request_error  request_timeout (x-should-retry: true)
//	key_reused                   422     invalid_request_error  idempotency_key_reused
//	caller_limit                 429     rate_limit_error       max_in_flight (x-should-retry: true, Retry-After)
//	unavailable_nothing_started  529     overloaded_error       temporal_unreachable (x-should-retry: true, Retry-After)
//	not_implemented              501     api_error              durallm_not_implemented
//	rejected                     the provider's 400, 404, 413 or 422 (else 400), its type if Anthropic's, its message and code
//	content_filtered             400     invalid_request_error  content_filter
//	upstream_auth                502     api_error              the provider's status
//	failed                       502     api_error              the reason (Retry-After when throttled)
//	spend_exhausted              402     billing_error          the reason (the action's own budget)
//	awaiting_verdict             403     conflict_error         durallm_awaiting_reconciliation
//	maybe_started                403     conflict_error         durallm_maybe_started
//	indeterminate                403     conflict_error         the reason
//	canceled                     403     conflict_error         the origin
//	in_progress                  403     conflict_error         durallm_in_progress
//	internal                     500     api_error              -
//	stream_incomplete            in-band only: event: error, api_error, durallm_stream_incomplete
//
// # A stream that does not end with an answer
//
// Once the stream's 200 went out, a failure is one in-band error event,
// {"type":"error","error":{...}}, after the stop of every block that is
// whole, in place of message_delta and message_stop: a stream cut after
// its content started (completed_partial) is api_error with error_code
// durallm_stream_incomplete and the reason in the message; any other
// outcome is its kind's error object above. The SDKs raise it as an error
// after the content they accumulated. A bare end of stream would read as
// a complete answer to anthropic-sdk-go, so a stream never ends without
// message_stop or an error event.
package messages
