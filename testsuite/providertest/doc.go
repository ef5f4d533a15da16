// Package providertest provides a fault-injecting HTTP/2 and HTTP/1.1 LLM
// provider for testing recovery end to end, over real frames on real
// sockets.
//
// A [Provider] is a small OpenAI-compatible chat-completions server written
// directly on top of [golang.org/x/net/http2.Framer] and
// [golang.org/x/net/http2/hpack] rather than on http2.Server. Going down to
// the frame layer is the point: the faults that matter for deciding whether
// a request was "never processed" or "maybe processed" live in GOAWAY
// last-stream ids, RST_STREAM codes and abrupt connection closes, and a
// general-purpose server does not let a test choose those exactly.
//
// The provider listens on loopback only, with four listeners:
//
//   - TLS on [Provider.URL], using a self-signed ECDSA P-256 certificate
//     generated at start (SANs 127.0.0.1, ::1 and localhost, ALPN "h2").
//     [Provider.ClientTLSConfig] and [Provider.CertPool] let a client trust it.
//   - h2c (cleartext HTTP/2 with prior knowledge) on [Provider.H2CURL].
//   - HTTP/1.1 in cleartext on [Provider.HTTP1URL], as llama.cpp, vLLM and
//     Ollama listen, and over TLS on [Provider.HTTP1TLSURL] (same
//     certificate, ALPN "http/1.1" only). Keep-alive, chunked streams and
//     the same behaviours, with HTTP/1.1's own faults:
//     [CloseAfterRead] (close after reading the request),
//     [Provider.CloseIdleConns] (close idle keep-alive connections, as a
//     server's keep-alive timeout does), [AnswerThenClose] (Connection:
//     close), [AnswerThenKeepOpen] (a stream that never ends after
//     [DONE], on both protocols), [StreamCut] and [BodyCut] (a chunked
//     body cut mid-chunk) and [Behavior.After] (a slow first byte). [Record.Proto] and
//     [Record.ConnRequest] say which protocol and which request of a
//     kept-alive connection it was. An HTTP/2 preface sent there is
//     answered 400 and the connection closed, as by an HTTP/1.1-only
//     server; it is not a request and is not recorded.
//
// Every path is accepted and recorded; responses have the shape of
// POST /v1/chat/completions (a GET of .../chat/completions lists the
// stored completions, below), with text ([Answer]) or a tool call
// ([AnswerToolCall], and [AnswerOrCallTool], a model that calls a declared
// tool once and then answers, which durallm dev's demo provider uses).
// An Anthropic route is played with [Status] and a recorded Messages body
// ([AnthropicEvents] renders a stream's events).
// [WithStrictIdleStreams] makes the HTTP/2 side
// as strict as Go's HTTP/2 server before Go 1.20 (and so Caddy 2.6 as
// Debian builds it): an RST_STREAM or WINDOW_UPDATE for a stream above its
// GOAWAY's last-stream id closes the connection.
//
// # Scripting
//
// Each request, once its body has been read completely, is given one
// [Behavior]. The provider asks, in order: the function set with
// [Provider.Script]; the FIFO queue filled by [Provider.Push]; and finally
// the default set with [Provider.SetDefault] (Answer("ok") unless changed).
//
//	p, err := providertest.NewProvider()
//	if err != nil { ... }
//	defer p.Close()
//	p.Push(providertest.GoAwayAbove(http2.ErrCodeNo)) // first request: refused by GOAWAY
//	p.Push(providertest.Answer("hello world"))        // second request: answered
//
// # Ground truth
//
// [Provider.Received] lists every request whose headers the provider read.
// [Provider.Processed] lists every request the provider executed, recorded
// at the moment it started to work on it, and only for behaviours that
// execute (see each constructor). Tests assert on Processed, for example
// with [Provider.ExecutedCount] or [Provider.AttemptExecutions], to prove
// "executed exactly once" or "never executed" independently of what the
// client believes.
//
// # Stored completions
//
// A request whose body says "store": true is kept as OpenAI keeps a
// stored chat completion, with its "metadata": the provider stores the
// completion an answering behaviour ([Answer], [AnswerToolCall],
// [AnswerOrCallTool]) generates when the execution starts, so it is kept
// even when the client leaves before the answer (a worker killed
// mid-generation). Faults, stalls and cut streams keep none, nor does a
// behaviour marked [Behavior.Unstored]. GET .../chat/completions with
// metadata[KEY]=VALUE lists them ([ListStored]), never taking a queued
// behaviour; [Provider.SetStoreLag] makes the store eventually
// consistent, [Provider.DropStored] forgets a record and
// [Provider.Stored] shows them all.
//
// # Rate limits
//
// A provider may enforce limits of its own, as hosted providers do, so a
// test has a provider that bites: [WithRequestsPerMinute],
// [WithTokensPerMinute] (a request counts its prompt tokens, a quarter of
// its body's bytes, plus its max_tokens or max_completion_tokens times
// its n) and [WithMaxConcurrentRequests] (a request holds its place until
// its behaviour ends). The per-minute limits are buckets holding a
// minute's worth and refilled continuously, as OpenAI's limiter works;
// each must be at least 1, and none is set by default. A request over a
// limit is answered 429 before it executes and before it takes anything
// from the script or the queue, with OpenAI's error body (type "requests"
// or "tokens", code "rate_limit_exceeded") and headers: Retry-After
// (whole seconds until it would fit), retry-after-ms, and for each
// per-minute limit x-ratelimit-limit-, x-ratelimit-remaining- and
// x-ratelimit-reset-requests or -tokens. [Provider.RateLimited] counts
// the 429s by limit, and [Record.Behavior] names them
// ("RateLimited(tokens)"); [Provider.RequestsInProgress] is what the
// concurrency limit counts.
//
// # Usage
//
// An answer reports usage in OpenAI's shape: by default an estimate (a
// quarter of the request body's bytes for the prompt, one token per word
// of the answer), or exactly what [Behavior.WithUsage] gives it, cached
// prompt tokens included.
//
// # Lifetime
//
// [Provider.Close] closes every listener and every connection at once,
// interrupts every stalled or delayed stream and waits for all of the
// provider's goroutines to exit, so it returns promptly and leaks nothing.
package providertest
