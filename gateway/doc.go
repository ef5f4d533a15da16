// Package gateway is durallm's OpenAI-compatible front door: an HTTP
// server that answers POST /v1/chat/completions (streamed or not) and
// GET /v1/models for any OpenAI SDK or tool that only knows a base URL,
// and runs each request as one durable LLMAction through the Go client
// (durallm.Client). It adds what an OpenAI-shaped API lacks for a durable
// call: an Idempotency-Key that finds the same action again (attach while
// it runs, the stored outcome once it ended), a distinct answer for every
// terminal state (docs/contract.md section 6.5), and action endpoints
// (GET /v1/actions/{id}, with a resumable stream; cancel; reconcile; list).
//
// New builds a Gateway from Options; Gateway is an http.Handler. The
// command is 'durallm gateway' (docs/gateway.md).
package gateway
