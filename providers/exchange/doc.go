// Package exchange makes one attempt against a provider's API, in the
// provider-neutral envelope of package providers: CallOpenAI for an
// OpenAI-compatible chat-completions API, CallAnthropic for Anthropic's
// Messages API, and CallRoute, which picks one by the route's Kind
// (package routes). Both are dialects of one exchange (exchange.go), which
// owns how an attempt ends; see call there.
//
// CallOpenAI and CallAnthropic send through the official clients
// (github.com/openai/openai-go/v3, github.com/anthropics/anthropic-sdk-go/v2)
// with their retries off, redirects off and the recovery engine as their
// transport; the adapters read every response body themselves, because the
// timers, the commit boundary and the bounded parsers need each byte
// (docs/providers.md says how).
//
// The CallModel activity uses it for exactly one HTTP exchange per
// attempt. It imports nothing from Temporal, never retries (the workflow
// owns the only budget, docs/contract.md section 1.1) and never logs: prompts,
// output, headers and keys stay out of every error it returns
// (docs/contract.md section 7).
//
// # One attempt
//
//	a := recovery.NewAttempt(recovery.Spec{..., ManualCommit: true})
//	res, err := exchange.CallRoute(recovery.WithAttempt(ctx, a), engine,
//	    exchange.Call{Route: route, Request: req, Sink: sink})
//	ev, class := a.Finish(res.Signal) // always, whether or not err != nil
//
// The envelope is OpenAI-shaped whatever the route: CallAnthropic
// translates the Request into a Messages request and the answer back
// into the same Response (text, OpenAI-shaped tool calls, finish reason,
// usage), so a fallback from one vendor to another changes nothing for
// the caller. What one dialect cannot express fails with ErrUnsupported,
// naming the field, before anything is sent (see CallAnthropic).
//
// The adapters read the response generously (unknown members survive in
// Response.Raw, null arrays, numbers as strings and missing optional
// members are fine) and report what the body said that the wire cannot as
// a evidence.Signal: an empty answer, a missing model, a context that is
// too long, an overloaded provider, a content filter. When the body of an
// HTTP error status is the provider's own error object, they tell the
// attempt (recovery.Attempt.ProviderError): on a route through a proxy, a
// 502 without it is the proxy's own, and ambiguous.
//
// Both dialects share one exchange: the same bounded SSE decoder, timers,
// commit boundary and partial-stream handling; only the request encoding
// and the reading of bodies and events differ. For a stream, the first
// content (text, refusal or a tool call: an OpenAI tool-call delta, an
// Anthropic tool_use block) commits the attempt before it reaches the
// Sink; keep-alive comments, pings, role-only chunks and message_start do
// not. A first-byte timer runs from the send to the first body byte, then
// an idle timer that every byte restarts; when one fires it cancels the
// request with ErrFirstByteTimeout or ErrIdleTimeout as the cause (both
// wrap recovery.ErrTimedOut), which the engine records as a timeout. A
// stream that fails after the commit returns Response.Partial with the
// text so far and calls Sink.Incomplete; before the commit it returns an
// error and the evidence decides.
//
// Response.Partial is the authority on a stream's completeness. One case
// is invisible on the wire: a body that ends cleanly after content but
// without its end marker ([DONE] or message_stop) or a finish reason, or
// inside an event (IncompleteTruncated). The engine saw a clean end of stream, so the
// caller passes evidence.SignalStreamIncomplete to Finish for a Partial
// response (the CallModel activity does), and the attempt classifies
// committed_partial.
//
// Memory is bounded: a non-streaming body and a stream's accumulated
// answer at MaxResponseBytes (32 MiB), one SSE line and one SSE event at
// MaxSSELineBytes (1 MiB), an HTTP error body at 1 MiB.
package exchange
