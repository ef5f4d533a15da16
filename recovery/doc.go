// Package recovery is durallm's recovery engine: an http.RoundTripper that
// owns its connection pools, watches every HTTP/2 frame on its
// connections (and speaks HTTP/1.1 with a client of its own that counts
// every byte, see http1.go), and records for each attempt the evidence
// that decides whether a failed request is safe to send again. Which
// protocol a request speaks is its route's HTTPVersion (WithHTTPVersion).
//
// The engine never retries. It answers one question per attempt — what
// happened on the wire — as an evidence.Evidence value, and
// evidence.Classify turns that into one of the contract's classifications
// (docs/contract.md section 3). The layer above (the LLMAction workflow)
// owns the only retry budget.
//
// The package imports nothing from Temporal.
//
// # How a request is mapped to its stream
//
// Go's HTTP/2 client does not tell a caller which stream id its request
// used. The engine stamps every request with a per-attempt header
// (HeaderAttemptID), wraps each connection's plaintext side (between TLS and
// the HTTP/2 framer) and parses frame headers passively in both directions.
// Outgoing header blocks are hpack-decoded with a decoder of its own that
// tracks the client's dynamic table by entry size, keeping only the attempt
// header's value, so the attempt header binds the attempt to its stream id
// and no other header value is ever materialized. Incoming frames (HEADERS, DATA, RST_STREAM, GOAWAY) are
// attributed to that stream. The observer sees each incoming frame before
// the HTTP/2 client does, so by the time a caller learns of a failure, its
// evidence is already recorded.
//
// # Why the engine calls ClientConn.RoundTrip itself
//
// golang.org/x/net/http2.Transport re-sends a request above a GOAWAY
// boundary when Request.GetBody is set, without telling the caller. The
// engine keeps its own pool and sends each request with exactly one
// ClientConn.RoundTrip, which never retries, so a hidden replay cannot
// happen. The observer still counts every stream that carried an attempt's
// header (Evidence.TransportReplays), so a replay by any lower layer would
// show up in the evidence and be charged to the attempt budget.
package recovery
