package routes

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/durallm/durallm/attempt"
	"github.com/durallm/durallm/providers"
)

// Route kinds: the API dialect a route speaks. CallRoute picks the adapter
// by it.
const (
	// KindOpenAI is an OpenAI-compatible chat-completions API, called with
	// CallOpenAI: POST {base_url}/chat/completions, the key as
	// "Authorization: Bearer".
	KindOpenAI = "openai"
	// KindAnthropic is Anthropic's Messages API, called with
	// CallAnthropic: POST {base_url}/messages, the key as "x-api-key",
	// with "anthropic-version: 2023-06-01".
	KindAnthropic = "anthropic"
)

// The provider records a route may keep (Route.ProviderRecord).
const (
	// ProviderRecordStoredCompletions is OpenAI's (and Azure OpenAI's)
	// stored chat completions: every request carries "store": true and
	// metadata naming the attempt and the action, and the built-in
	// reconciler lists them by the attempt's id (GET
	// {base_url}/chat/completions?metadata[durallm_attempt_id]=...).
	ProviderRecordStoredCompletions = "stored_completions"
)

// DefaultProviderRecordSettle is how long past an attempt's deadline the
// built-in reconciler keeps looking for a provider record it has not
// found (Route.ProviderRecordSettle). OpenAI documents no bound on how
// soon a stored completion can be listed; by the attempt's deadline the
// generation itself is over as far as durallm let it run, so the window
// only has to cover the store's own lag: 30s is room for a store that
// indexes in seconds, while an attempt with no record at all reaches the
// next reconciler, or a person, half a minute after its deadline. A
// record that is found ends the wait at once.
const DefaultProviderRecordSettle = 30 * time.Second

// Timeout defaults, applied to a zero Route field by LoadConfig and by
// the adapters.
const (
	DefaultAttemptTimeout   = attempt.DefaultAttemptTimeout
	DefaultFirstByteTimeout = 20 * time.Second
	DefaultIdleTimeout      = 30 * time.Second
)

// Route is one configured way to reach a model: an endpoint, a model name,
// where its key lives, what it can do and how long to wait for it. Routes
// live in worker configuration; workflows name them and never see a URL or
// a key.
type Route struct {
	// Name identifies the route in workflow input, history and logs.
	// Required, unique.
	Name string
	// Kind is the API dialect: KindOpenAI or KindAnthropic. Required.
	Kind string
	// BaseURL is the API root, such as "https://api.openai.com/v1" or
	// "https://api.anthropic.com/v1"; the adapter appends
	// "/chat/completions" or "/messages". http or https. Required.
	BaseURL string
	// Model is sent as the request's "model". Required.
	Model string
	// APIKeyEnv names the environment variable holding the key.
	APIKeyEnv string
	// APIKeyFile is a file holding the key (surrounding whitespace is
	// trimmed). Exactly one of APIKeyEnv and APIKeyFile is required, unless
	// BaseURL's host is loopback, where neither is required (no key header
	// is then sent).
	APIKeyFile string
	// Capabilities are what the route offers.
	Capabilities providers.Capabilities
	// AttemptTimeout bounds one attempt, from send to the end of the body,
	// for an action that sets no attempt_timeout of its own (an action's
	// replaces it). Zero means DefaultAttemptTimeout (60s).
	AttemptTimeout time.Duration
	// FirstByteTimeout bounds a stream's wait from the send until the
	// first body byte. Zero means DefaultFirstByteTimeout (20s). Not
	// applied to non-streaming requests, whose first byte arrives only
	// after the whole answer is generated.
	FirstByteTimeout time.Duration
	// IdleTimeout bounds a stream's silence after its first byte: every
	// byte, keep-alive comments included, restarts it. Zero means
	// DefaultIdleTimeout (30s). Not applied to non-streaming requests.
	IdleTimeout time.Duration
	// HonoursIdempotencyKey declares that the provider deduplicates
	// requests carrying the same Idempotency-Key within IdempotencyWindow,
	// which lets the workflow replay an ambiguous attempt on this route,
	// and keeps an intermediary's 502 retryable
	// (recovery.Spec.HonoursIdempotencyKey). Default false.
	HonoursIdempotencyKey bool
	// IdempotencyWindow is how long the provider remembers a key. Must be
	// positive when HonoursIdempotencyKey is set.
	IdempotencyWindow time.Duration
	// Intermediary declares that BaseURL is a proxy or gateway in front
	// of the provider (haproxy, Caddy, an LLM gateway), not the provider
	// itself. Such a proxy may answer RST_STREAM(REFUSED_STREAM), or a 502
	// of its own, after it forwarded the request and the origin failed, so
	// on this route that code is ambiguous instead of refused, and such a
	// 502 (not in the provider's error shape) is ambiguous instead of
	// upstream_error unless HonoursIdempotencyKey (recovery.Spec.Intermediary).
	// Default false.
	Intermediary bool
	// HTTPVersion is the HTTP version the route speaks: "auto" (also
	// empty, the default), "2" or "1.1" (recovery.HTTPVersion). auto over
	// https takes what ALPN negotiates (h2 or http/1.1); auto over http://
	// speaks HTTP/1.1, as local model servers do, unless the worker runs
	// with --allow-h2c, which makes it cleartext HTTP/2. "2" over http://
	// is cleartext HTTP/2 (h2c with prior knowledge) whatever the worker
	// allows.
	HTTPVersion string
	// InsecureSkipVerify turns TLS certificate verification off for this
	// route. Explicit and off by default; the caller logs a warning when
	// it builds the transport.
	InsecureSkipVerify bool
	// ProviderRecord names the record the provider keeps of every request
	// on this route, which the built-in reconciler looks up for an
	// ambiguous attempt the journal cannot settle: "" (none, the default)
	// or ProviderRecordStoredCompletions, on a KindOpenAI route only. The
	// provider then keeps every conversation sent on the route
	// (docs/providers.md says for how long, and who cannot use it).
	ProviderRecord string
	// ProviderRecordSettle is how long past the attempt's deadline the
	// reconciler keeps looking for a record it has not found, with
	// backoff: not found is never proof that the provider did not execute
	// the request, and its store may lag. Zero means
	// DefaultProviderRecordSettle (30s) on a route with a ProviderRecord.
	ProviderRecordSettle time.Duration
	// Prices are the route's model's prices per million tokens, which
	// give each attempt's usage its cost (docs/providers.md, "Prices and
	// usage"). Nil means none: the route's usage is counted in tokens
	// only, and an action with a cost budget skips the route. Not allowed
	// with NoUsage.
	Prices *providers.Prices
	// NoUsage declares that the provider sends no token usage (the YAML's
	// reports_usage: false), as some OpenAI-compatible servers do on a
	// stream: an attempt on the route is charged its worst case, and the
	// route may have no prices. Default false: the provider reports
	// usage, as OpenAI's and Anthropic's APIs do.
	NoUsage bool
	// ImageTokens is an upper bound on the prompt tokens the route's
	// model counts for one image, which a budget's worst case counts for
	// each image part. Zero means providers.DefaultImageTokens (8192).
	ImageTokens int
}

// WithDefaults returns r with each zero timeout (and the settle window of
// a provider record) replaced by its default.
func (r Route) WithDefaults() Route {
	if r.AttemptTimeout == 0 {
		r.AttemptTimeout = DefaultAttemptTimeout
	}
	if r.FirstByteTimeout == 0 {
		r.FirstByteTimeout = DefaultFirstByteTimeout
	}
	if r.IdleTimeout == 0 {
		r.IdleTimeout = DefaultIdleTimeout
	}
	if r.ProviderRecord != "" && r.ProviderRecordSettle == 0 {
		r.ProviderRecordSettle = DefaultProviderRecordSettle
	}
	return r
}

// ErrMissingAPIKey is wrapped by Route.APIKey when a key source is
// configured but yields no key.
var ErrMissingAPIKey = errors.New("routes: API key missing")

// HasKeySource reports whether the route names a place to read a key from.
func (r Route) HasKeySource() bool { return r.APIKeyEnv != "" || r.APIKeyFile != "" }

// APIKey reads the route's key now, from APIKeyEnv or APIKeyFile (trimmed),
// so a rotated key is picked up without a restart. A route with no key
// source returns "", nil. Errors name the variable or the file, never the
// key or any part of the file's content.
func (r Route) APIKey() (string, error) {
	switch {
	case r.APIKeyEnv != "" && r.APIKeyFile != "":
		return "", fmt.Errorf("routes: route %q: both api_key_env and api_key_file are set", r.Name)
	case r.APIKeyEnv != "":
		if !validEnvName(r.APIKeyEnv) {
			// The value may be a key pasted into the wrong field: never
			// repeat it.
			return "", fmt.Errorf("routes: route %q: api_key_env is not an environment variable name", r.Name)
		}
		k := strings.TrimSpace(os.Getenv(r.APIKeyEnv))
		if k == "" {
			return "", fmt.Errorf("%w: route %q: environment variable %s is unset or empty", ErrMissingAPIKey, r.Name, r.APIKeyEnv)
		}
		return k, nil
	case r.APIKeyFile != "":
		b, err := os.ReadFile(r.APIKeyFile)
		if err != nil {
			// *fs.PathError names the path and the OS reason, not content.
			return "", fmt.Errorf("routes: route %q: read api_key_file: %w", r.Name, err)
		}
		k := strings.TrimSpace(string(b))
		if k == "" {
			return "", fmt.Errorf("%w: route %q: api_key_file is empty", ErrMissingAPIKey, r.Name)
		}
		return k, nil
	default:
		return "", nil
	}
}

// validEnvName reports whether s is a portable environment variable name.
func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// isLoopbackURL reports whether u's host is loopback: "localhost" or a
// loopback IP. Only such a route may go without a key.
func isLoopbackURL(u *url.URL) bool {
	h := u.Hostname()
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// Endpoint returns the URL of path under the route's base URL, keeping
// the base's query (some gateways carry an api-version there). The error
// never repeats the URL, which may carry credentials.
func (r Route) Endpoint(path ...string) (string, error) { return endpointURL(r.BaseURL, path...) }

func endpointURL(base string, path ...string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("routes: base_url: %w", urlReason(err))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", errors.New("routes: base_url: scheme must be http or https")
	}
	if u.Host == "" {
		return "", errors.New("routes: base_url: no host")
	}
	if u.User != nil {
		return "", errors.New("routes: base_url: must not carry credentials")
	}
	return u.JoinPath(path...).String(), nil
}

// urlReason strips the URL from a url.Parse error: a base URL may carry
// credentials in its userinfo, and errors must never repeat them.
func urlReason(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
