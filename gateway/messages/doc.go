// Package messages is the wire format of the gateway's Messages front
// door, Anthropic's POST /v1/messages, as a codec that knows nothing of
// the gateway's core: ParseRequest reads a request into the envelope
// (providers.Request, OpenAI-shaped, which every route reads); RenderMessage
// renders an answer (providers.Response) as a Messages response; an
// Encoder renders an action's numbered stream events
// (activities.StreamEvent) as Anthropic's server-sent events; ErrorFor
// renders a surface-neutral Kind of failure as Anthropic's error object and
// status; ModelsJSON is GET /v1/models in Anthropic's shape and
// CountTokensError the answer to count_tokens.
//
// The request is read with small wire structs of this package rather than
// anthropic-sdk-go's MessageNewParams: unmarshalling into the SDK's params
// (v2.15.0) silently drops temperature, top_p and top_k (it has no such
// fields: its API version refuses them) and every member it does not know,
// so it could neither carry them nor refuse what the envelope cannot carry
// (TestWhyRequestsAreReadWithTheirOwnWireStructs).
// The answers are checked against the SDK's own types and stream decoder
// (sdk_test.go): the official SDK is the judge of what this package writes.
//
// # Which answers the Anthropic SDKs send again
//
// Both anthropic-sdk-go v2.15.0 (internal/requestconfig: shouldRetry) and
// @anthropic-ai/sdk 1.15.0 (client.js: shouldRetry) retry twice by
// default, and obey the response header x-should-retry (true or false)
// before they look at the status; without it they retry 408, 409, 429 and
// every status from 500 (501 and 529 included), and a connection error or
// timeout. anthropic-sdk-go also retries a response whose body it could
// not read, whatever its status, unless x-should-retry is false. Neither
// can send an idempotency key by itself, and neither retries an error
// event inside a stream. Every non-2xx answer here carries x-should-retry,
// false unless the table says otherwise, so no answer for an action that
// may have run is retried by the SDKs:
//
//	kind                 status  error.type             details.error_code               x-should-retry
//	invalid_request      400     invalid_request_error  -                                false
//	unauthenticated      401     authentication_error   -                                false
//	forbidden            403     permission_error       -                                false
//	not_found            404     not_found_error        -                                false
//	too_large            413     request_too_large      -                                false
//	idempotency_key_reused 422   invalid_request_error  idempotency_key_reused           false
//	caller_limit         429     rate_limit_error       max_in_flight                    true, Retry-After
//	unavailable          529     overloaded_error       temporal_unreachable             true, Retry-After
//	not_implemented      501     api_error              durallm_not_implemented          false
//	rejected             400, 404, 413, 422 (the provider's)  the provider's, or by status  the provider's reason  false
//	content_filtered     400     invalid_request_error  content_filter                   false
//	upstream_auth        502     api_error              durallm_upstream_auth            false
//	failed               502     api_error              durallm_failed                   false (Retry-After when throttled)
//	awaiting_verdict     409     conflict_error         durallm_awaiting_reconciliation  false
//	maybe_started        409     conflict_error         durallm_maybe_started            false
//	indeterminate        409     conflict_error         durallm_indeterminate            false
//	canceled             409     conflict_error         durallm_canceled                 false
//	internal             500     api_error              -                                false
//	incomplete           in-band only: event: error, api_error, durallm_stream_incomplete
//
// Without the header the SDKs would retry 409, 500, 501, 502 and 529: for a
// request without an Idempotency-Key (the SDKs' default) each retry would
// be a new action, so the header is what keeps awaiting_verdict,
// maybe_started, indeterminate, canceled, failed and internal from running
// the request again. error.details.error_code is Anthropic's place for a
// machine-readable cause (anthropic-sdk-go: Error.ErrorCode; an SDK that
// does not know a code reads the bare type).
//
// # A stream that does not end with an answer
//
// Once the stream's 200 went out, a failure is one in-band error event,
// {"type":"error","error":{...}}, after the last delta and in place of
// message_delta and message_stop: a stream cut after its content started
// (completed_partial) is api_error with error_code
// durallm_stream_incomplete and the reason in the message; any other
// outcome is its kind's error object above. The SDKs raise it as an
// error after the content they accumulated. A bare end of stream would
// read as a complete answer to anthropic-sdk-go, so a stream never ends
// without message_stop or an error event.
package messages
