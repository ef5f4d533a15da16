// Package gateway is durallm's front door for SDKs and tools that only
// know a base URL: an HTTP server that runs each request as one durable
// LLMAction through the Go client (durallm.Client). It adds what an
// OpenAI-shaped API lacks for a durable call: an Idempotency-Key that
// finds the same action again (attach while it runs, the stored outcome
// once it ended), a distinct answer for every terminal state
// (docs/contract.md section 6.5), resumable streams, and action endpoints
// (GET /v1/actions/{id}, with a resumable stream; cancel; reconcile;
// list).
//
// Many wire formats, one core. This package is the core: callers and
// tokens, limits, idempotency, the action (start, attach, replay, a
// caller's disconnect), the one decision of which answer an outcome gets
// (outcome.go), the wait for the result, and streams (following the
// worker's hub, here or elsewhere, replay, resumption, keep-alives, the
// status held until the first content). Each API is a surface
// (answer.Surface) that knows only its wire format: package gateway/chat
// serves OpenAI chat completions, always; Options.Surfaces adds others.
// Package gateway/answer holds what the core says to a surface (a Problem,
// an Answer, the Deltas of a stream) and the seam's interfaces.
//
// New builds a Gateway from Options; Gateway is an http.Handler. The
// command is 'durallm gateway' (docs/gateway.md).
package gateway
