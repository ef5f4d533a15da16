// Package providers is durallm's provider layer: the request/response
// envelope, the worker-side route configuration, and the adapters that
// make one attempt against a provider's API: CallOpenAI for an
// OpenAI-compatible chat-completions API, CallAnthropic for Anthropic's
// Messages API, and CallRoute, which picks one by the route's Kind.
// CallOpenAI sends through the official client
// (github.com/openai/openai-go/v3) with its retries off, redirects off and
// the recovery engine as its transport; the adapters read every response
// body themselves, because the timers, the commit boundary and the bounded
// parsers need each byte (docs/providers.md says how).
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
//	res, err := providers.CallRoute(recovery.WithAttempt(ctx, a), engine,
//	    providers.Call{Route: route, Request: req, Sink: sink})
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
// a recovery.Signal: an empty answer, a missing model, a context that is
// too long, an overloaded provider, a content filter.
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
// caller passes recovery.SignalStreamIncomplete to Finish for a Partial
// response (the CallModel activity does), and the attempt classifies
// committed_partial.
//
// Memory is bounded: a non-streaming body and a stream's accumulated
// answer at MaxResponseBytes (32 MiB), one SSE line and one SSE event at
// MaxSSELineBytes (1 MiB), an HTTP error body at 1 MiB.
//
// # Route configuration
//
// LoadConfig reads a YAML file like this one:
//
//	reconciler: usage-ledger          # optional: which reconciler the worker uses
//	routes:
//	  - name: openai-primary          # required, unique; workflows use it
//	    kind: openai                  # required: "openai" or "anthropic"
//	    base_url: https://api.openai.com/v1   # required, http or https
//	    model: gpt-4o-mini            # required
//	    api_key_env: OPENAI_API_KEY   # the variable holding the key, or:
//	    # api_key_file: /run/secrets/openai   # a file holding it (relative
//	    #                                      # paths: to this file's directory)
//	    capabilities:
//	      tools: true
//	      structured_output: true
//	      streaming: true
//	      vision: true
//	      context_tokens: 128000      # 0 or absent: unknown/unbounded
//	      data_tags: [no-retention]
//	    attempt_timeout: 60s          # Go durations; these are the defaults
//	    first_byte_timeout: 20s
//	    idle_timeout: 30s
//	    honours_idempotency_key: false
//	    idempotency_window: 24h       # required (positive) when the above is true
//	    intermediary: false           # true when base_url is a proxy/gateway
//	    insecure_skip_verify: false   # never in production; the caller warns
//	  - name: anthropic-fallback
//	    kind: anthropic               # CallAnthropic: x-api-key, anthropic-version
//	    base_url: https://api.anthropic.com/v1
//	    model: claude-sonnet-4-5
//	    api_key_env: ANTHROPIC_API_KEY
//	    capabilities:                 # structured_output must stay false here
//	      tools: true
//	      streaming: true
//	      vision: true
//	      context_tokens: 200000
//	  - name: local
//	    kind: openai
//	    base_url: http://127.0.0.1:8000/v1    # loopback: a key source is optional
//	    model: llama3                 # (http:// is h2c: the engine speaks HTTP/2 only)
//
// Unknown keys are errors, so a misspelt timeout cannot pass silently.
// Four environment variables override a route, NAME being the route's
// name upper-cased with every character other than A-Z and 0-9 replaced
// by "_" (see EnvPrefix): DURALLM_ROUTE_<NAME>_BASE_URL,
// DURALLM_ROUTE_<NAME>_MODEL, DURALLM_ROUTE_<NAME>_API_KEY_ENV (which
// replaces the key source, clearing api_key_file) and
// DURALLM_ROUTE_<NAME>_INTERMEDIARY (true or false). For the route
// "openai-primary" the first is DURALLM_ROUTE_OPENAI_PRIMARY_BASE_URL.
//
// Config.Validate reports every problem at once, each naming the route and
// the field. docs/providers.md has the operator's view: every key with its
// default, fallback across vendors, error mapping and the streaming
// contract. Keys are read when a request is made (Route.APIKey), so a
// rotated key needs no restart, and no key ever enters a Config.
package providers
