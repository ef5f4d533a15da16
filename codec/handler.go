package codec

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"go.temporal.io/sdk/converter"
)

// DefaultMaxBodyBytes is the request body limit when
// HandlerOptions.MaxBodyBytes is zero or negative: 4 MiB, so a payload at
// Temporal's default 2 MiB blob size limit still fits after the JSON
// protocol's base64 adds a third.
const DefaultMaxBodyBytes = 4 << 20

// corsAllowHeaders are the request headers the Temporal UI sends to a codec
// server. Authorization-Extras carries the ID token when the UI's "pass
// access token" setting is on; without it the browser would fail the
// preflight.
const corsAllowHeaders = "Content-Type, X-Namespace, Authorization, Authorization-Extras"

// HandlerOptions configures Handler. The zero value serves /encode,
// /decode and /healthz to any caller that can reach it, with no CORS, no
// token and a 4 MiB body limit: fine on localhost for the CLI, not for
// anything a browser or a network can reach.
type HandlerOptions struct {
	// AllowedOrigins lists the browser origins (scheme://host[:port], as in
	// the Origin header, e.g. "http://localhost:8233") allowed to call the
	// server, typically the Temporal UI's address. Comparison is exact
	// except for case and a trailing "/"; "*" is not special, because any
	// web page the operator visits could then drive the codec. A request
	// that carries an Origin header not in the list is refused with 403.
	// Default (nil): no CORS headers, so browsers cannot use the server;
	// the CLI, which sends no Origin, is unaffected.
	AllowedOrigins []string

	// AuthToken, when not empty, must be presented by every /encode and
	// /decode request as "Authorization: Bearer <AuthToken>", or the
	// request gets 401. It is compared in constant time. Preflight OPTIONS
	// and /healthz need no token (browsers send none on a preflight).
	// Default "": no authentication.
	AuthToken string

	// AllowedNamespaces, when not empty, limits /encode and /decode to
	// requests whose X-Namespace header (sent by the Temporal UI and CLI)
	// is in the list; others, including requests without the header, get
	// 403. Default (nil): any namespace.
	AllowedNamespaces []string

	// MaxBodyBytes limits the request body; larger requests get 413. Zero
	// or negative means DefaultMaxBodyBytes.
	MaxBodyBytes int64

	// References, when set, resolves payloads stored by reference
	// (claimcheck.NewCodec over the workers' result store): /decode
	// decrypts, then resolves; /encode leaves references alone. Nil
	// means references are shown as they are.
	References converter.PayloadCodec
}

// Handler returns the codec server for the Temporal UI and CLI: the
// Temporal codec protocol (POST .../encode and POST .../decode with
// protobuf-JSON Payloads, matched on the last path element so the handler
// can be mounted under any prefix), GET .../healthz answering 200, and the
// CORS, token, namespace and body-size checks described in HandlerOptions.
//
// Responses to /encode and /decode are marked Cache-Control: no-store, as
// they hold plaintext. Errors name a key id at most, never payload data.
// A nil k means payloads are not encrypted: the handler then only
// resolves HandlerOptions.References.
func Handler(k *Keyring, opts HandlerOptions) http.Handler {
	var codecs []converter.PayloadCodec
	if k != nil {
		codecs = append(codecs, NewCodec(k))
	}
	if opts.References != nil {
		// Decoding runs first to last: decrypt, then resolve. Encoding
		// runs last to first: the references' Encode leaves payloads as
		// they are, then they are encrypted.
		codecs = append(codecs, opts.References)
	}
	h := &handler{
		codec:      converter.NewPayloadCodecHTTPHandler(codecs...),
		origins:    make(map[string]bool, len(opts.AllowedOrigins)),
		maxBody:    opts.MaxBodyBytes,
		namespaces: make(map[string]bool, len(opts.AllowedNamespaces)),
	}
	for _, o := range opts.AllowedOrigins {
		h.origins[normalizeOrigin(o)] = true
	}
	for _, ns := range opts.AllowedNamespaces {
		h.namespaces[ns] = true
	}
	if h.maxBody <= 0 {
		h.maxBody = DefaultMaxBodyBytes
	}
	if opts.AuthToken != "" {
		// Comparing digests keeps the comparison constant-time even in
		// the token's length.
		sum := sha256.Sum256([]byte(opts.AuthToken))
		h.tokenSum = &sum
	}
	return h
}

type handler struct {
	codec      http.Handler
	origins    map[string]bool
	tokenSum   *[sha256.Size]byte
	namespaces map[string]bool
	maxBody    int64
}

func normalizeOrigin(o string) string {
	return strings.ToLower(strings.TrimSuffix(strings.TrimSpace(o), "/"))
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	// Responses differ by Origin; shared caches must not mix them up.
	hdr.Add("Vary", "Origin")
	if origin := r.Header.Get("Origin"); origin != "" {
		if !h.origins[normalizeOrigin(origin)] {
			http.Error(w, "origin not allowed", http.StatusForbidden)
			return
		}
		hdr.Set("Access-Control-Allow-Origin", origin)
		// The UI's "include cross-origin credentials" setting sends
		// cookies; the browser drops the response without this.
		hdr.Set("Access-Control-Allow-Credentials", "true")
	}
	if r.Method == http.MethodOptions {
		hdr.Set("Access-Control-Allow-Methods", "POST, GET, OPTIONS")
		hdr.Set("Access-Control-Allow-Headers", corsAllowHeaders)
		hdr.Set("Access-Control-Max-Age", "600")
		hdr.Set("Allow", "POST, GET, HEAD, OPTIONS")
		w.WriteHeader(http.StatusNoContent)
		return
	}

	path := r.URL.Path
	if strings.HasSuffix(path, "/healthz") {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			hdr.Set("Allow", "GET, HEAD, OPTIONS")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		hdr.Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
		return
	}
	if !strings.HasSuffix(path, "/encode") && !strings.HasSuffix(path, "/decode") {
		http.NotFound(w, r)
		return
	}
	if !h.authorized(r) {
		hdr.Set("WWW-Authenticate", `Bearer realm="durallm-codec"`)
		http.Error(w, "missing or invalid bearer token", http.StatusUnauthorized)
		return
	}
	if r.Method != http.MethodPost {
		hdr.Set("Allow", "POST, OPTIONS")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if len(h.namespaces) > 0 && !h.namespaces[r.Header.Get("X-Namespace")] {
		http.Error(w, "namespace not allowed", http.StatusForbidden)
		return
	}

	body, status, err := h.readBody(w, r)
	if err != nil {
		http.Error(w, err.Error(), status)
		return
	}
	// The request is not ours to modify; hand a shallow copy with the
	// buffered body to the SDK handler.
	r2 := r.WithContext(r.Context())
	r2.Body = io.NopCloser(bytes.NewReader(body))
	r2.ContentLength = int64(len(body))
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("X-Content-Type-Options", "nosniff")
	h.codec.ServeHTTP(w, r2)
}

// authorized reports whether r carries the configured bearer token, or
// true when none is configured.
func (h *handler) authorized(r *http.Request) bool {
	if h.tokenSum == nil {
		return true
	}
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
	return subtle.ConstantTimeCompare(sum[:], h.tokenSum[:]) == 1
}

// readBody reads at most maxBody bytes. The SDK handler reads without a
// limit and answers 400 to every read error, so the limit and its 413 are
// applied here first.
func (h *handler) readBody(w http.ResponseWriter, r *http.Request) ([]byte, int, error) {
	tooLarge := fmt.Errorf("request body larger than %d bytes", h.maxBody)
	if r.ContentLength > h.maxBody {
		return nil, http.StatusRequestEntityTooLarge, tooLarge
	}
	if r.Body == nil {
		return nil, http.StatusBadRequest, errors.New("empty request body")
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, http.StatusRequestEntityTooLarge, tooLarge
		}
		return nil, http.StatusBadRequest, fmt.Errorf("read request body: %w", err)
	}
	return body, 0, nil
}
