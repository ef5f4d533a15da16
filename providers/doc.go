// Package providers is durallm's provider layer: the request/response
// envelope, the worker-side route configuration, and the adapter that
// makes one attempt against an OpenAI-compatible chat-completions API.
//
// The CallModel activity uses it for exactly one HTTP exchange per
// attempt. It imports nothing from Temporal, never retries (the workflow
// owns the only budget, CONTRACT.md section 1) and never logs: prompts,
// output, headers and keys stay out of every error it returns
// (CONTRACT.md section 7).
//
// # One attempt
//
//	a := recovery.NewAttempt(recovery.Spec{..., ManualCommit: true})
//	res, err := providers.CallOpenAI(recovery.WithAttempt(ctx, a), engine,
//	    providers.Call{Route: route, Request: req, Sink: sink})
//	ev, class := a.Finish(res.Signal) // always, whether or not err != nil
//
// The adapter reads the response generously (unknown members survive in
// Response.Raw, null arrays, numbers as strings and missing optional
// members are fine) and reports what the body said that the wire cannot as
// a recovery.Signal: an empty answer, a missing model, a context that is
// too long, an overloaded provider, a content filter.
//
// For a stream, the first content (text, refusal or a tool-call delta)
// commits the attempt before it reaches the Sink; keep-alive comments and
// role-only chunks do not. A first-byte timer runs from the send to the
// first body byte, then an idle timer that every byte restarts; when one
// fires it cancels the request with ErrFirstByteTimeout or ErrIdleTimeout
// as the cause (both wrap recovery.ErrTimedOut), which the engine records
// as a timeout. A stream that fails after the commit returns
// Response.Partial with the text so far and calls Sink.Incomplete; before
// the commit it returns an error and the evidence decides.
//
// Response.Partial is the authority on a stream's completeness. One case
// is invisible on the wire: a body that ends cleanly after content but
// without [DONE] or a finish_reason (IncompleteTruncated). The engine saw
// a clean end of stream, so the caller passes recovery.SignalStreamIncomplete
// to Finish for a Partial response (the CallModel activity does), and the
// attempt classifies committed_partial.
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
//	    kind: openai                  # required; "openai" is the only kind so far
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
//	    insecure_skip_verify: false   # never in production; the caller warns
//	  - name: local
//	    kind: openai
//	    base_url: http://127.0.0.1:8000/v1    # loopback: a key source is optional
//	    model: llama3
//
// Unknown keys are errors, so a misspelt timeout cannot pass silently.
// Three environment variables override a route, NAME being the route's
// name upper-cased with every character other than A-Z and 0-9 replaced
// by "_" (see EnvPrefix): DURALLM_ROUTE_<NAME>_BASE_URL,
// DURALLM_ROUTE_<NAME>_MODEL and DURALLM_ROUTE_<NAME>_API_KEY_ENV (which
// replaces the key source, clearing api_key_file). For the route
// "openai-primary" the first is DURALLM_ROUTE_OPENAI_PRIMARY_BASE_URL.
//
// Config.Validate reports every problem at once, each naming the route and
// the field. Keys are read when a request is made (Route.APIKey), so a
// rotated key needs no restart, and no key ever enters a Config.
package providers
