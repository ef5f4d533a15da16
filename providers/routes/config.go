package routes

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/recovery"
)

// Config is the worker-side route configuration. Keys never appear in it,
// only where to read them.
type Config struct {
	// Routes are the configured routes. At least one is required.
	Routes []Route
	// Reconciler names the reconciler the worker should use for ambiguous
	// outcomes; empty means none. The worker interprets the name.
	Reconciler string
}

// Route returns the route called name.
func (c Config) Route(name string) (Route, bool) {
	for _, r := range c.Routes {
		if r.Name == name {
			return r, true
		}
	}
	return Route{}, false
}

// RouteMap returns the routes by name. With duplicate names (which
// Validate rejects) the last one wins.
func (c Config) RouteMap() map[string]Route {
	m := make(map[string]Route, len(c.Routes))
	for _, r := range c.Routes {
		m[r.Name] = r
	}
	return m
}

// Names returns the route names in the file's order.
func (c Config) Names() []string {
	names := make([]string, len(c.Routes))
	for i, r := range c.Routes {
		names[i] = r.Name
	}
	return names
}

// ErrInvalidConfig is wrapped by every FieldError.
var ErrInvalidConfig = errors.New("routes: invalid config")

// check reports, through bad, every problem of r that the other routes
// have no part in.
func (r Route) check(bad func(field, problem string)) {
	switch r.Kind {
	case KindOpenAI:
	case KindAnthropic:
		if r.Capabilities.StructuredOutput {
			// CallAnthropic refuses response_format; declaring the
			// capability would let the workflow pick this route for
			// actions it can only fail.
			bad("capabilities.structured_output", "the anthropic adapter has no structured output (it refuses response_format); leave it false")
		}
	case "":
		bad("kind", `required ("openai" or "anthropic")`)
	default:
		bad("kind", fmt.Sprintf(`unknown kind %q (want "openai" or "anthropic")`, r.Kind))
	}
	loopback := false
	if r.BaseURL == "" {
		bad("base_url", "required")
	} else if u, err := url.Parse(r.BaseURL); err != nil {
		bad("base_url", "unparseable: "+urlReason(err).Error())
	} else {
		switch {
		case u.Scheme != "http" && u.Scheme != "https":
			bad("base_url", "scheme must be http or https")
		case u.Host == "":
			bad("base_url", "no host")
		case u.User != nil:
			bad("base_url", "must not carry credentials; use api_key_env or api_key_file")
		default:
			loopback = isLoopbackURL(u)
		}
	}
	if r.Model == "" {
		bad("model", "required")
	}
	if _, err := recovery.ParseHTTPVersion(r.HTTPVersion); err != nil {
		bad("http_version", `must be "auto", "2" or "1.1"`)
	}
	switch {
	case r.APIKeyEnv != "" && r.APIKeyFile != "":
		bad("api_key_env", "api_key_env and api_key_file are both set; choose one")
	case r.APIKeyEnv == "" && r.APIKeyFile == "" && !loopback:
		bad("api_key_env", "api_key_env or api_key_file is required (only a loopback base_url may go without a key)")
	}
	if r.APIKeyEnv != "" && !validEnvName(r.APIKeyEnv) {
		// Possibly a key pasted into the wrong field: never repeat it.
		bad("api_key_env", "not an environment variable name")
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{
		{"attempt_timeout", r.AttemptTimeout},
		{"first_byte_timeout", r.FirstByteTimeout},
		{"idle_timeout", r.IdleTimeout},
		{"idempotency_window", r.IdempotencyWindow},
		{"provider_record_settle", r.ProviderRecordSettle},
	} {
		if d.v < 0 {
			bad(d.field, "negative")
		}
	}
	if r.HonoursIdempotencyKey && r.IdempotencyWindow <= 0 {
		bad("idempotency_window", "must be positive when honours_idempotency_key is set")
	}
	switch r.ProviderRecord {
	case "":
		if r.ProviderRecordSettle != 0 {
			bad("provider_record_settle", "set without a provider_record")
		}
	case ProviderRecordStoredCompletions:
		if r.Kind != KindOpenAI {
			bad("provider_record", "stored_completions is an OpenAI API; this route's kind has none")
		}
	default:
		bad("provider_record", fmt.Sprintf(`unknown record %q (want "stored_completions")`, r.ProviderRecord))
	}
	if r.Capabilities.ContextTokens < 0 {
		bad("capabilities.context_tokens", "negative")
	}
	if r.Prices != nil {
		if r.NoUsage {
			bad("prices", "the route reports no usage (reports_usage: false), so no cost can be counted from its prices; remove one or the other")
		}
		if err := r.Prices.Validate(); err != nil {
			for _, e := range unjoin(err) {
				if pe := (*providers.PriceError)(nil); errors.As(e, &pe) {
					bad("prices."+pe.Field, pe.Problem)
				}
			}
		}
	}
	if r.ImageTokens < 0 || r.ImageTokens > maxImageTokens {
		bad("image_tokens", fmt.Sprintf("outside 0..%d", maxImageTokens))
	}
	for j, t := range r.Capabilities.DataTags {
		if strings.TrimSpace(t) == "" {
			bad(fmt.Sprintf("capabilities.data_tags[%d]", j), "empty")
		}
	}
}

// maxImageTokens bounds image_tokens: a larger bound is a typo, not a
// model (the largest documented counts are tens of thousands).
const maxImageTokens = 1_000_000

// unjoin returns the errors errors.Join joined, or err alone.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// FieldError is one configuration problem. Config.Validate and LoadConfig
// return all of them joined with errors.Join; errors.As finds the first.
// Problems never quote a value that could be a secret.
type FieldError struct {
	// Route is the route's name, empty when it has none.
	Route string
	// Index is the route's position in Routes, -1 for a top-level field.
	Index int
	// Field is the YAML name of the field, such as "base_url" or
	// "capabilities.context_tokens".
	Field string
	// Problem says what is wrong.
	Problem string
}

// Error names the route (or its position) and the field.
func (e *FieldError) Error() string {
	switch {
	case e.Route != "":
		return fmt.Sprintf("routes: route %q: %s: %s", e.Route, e.Field, e.Problem)
	case e.Index >= 0:
		return fmt.Sprintf("routes: routes[%d]: %s: %s", e.Index, e.Field, e.Problem)
	default:
		return fmt.Sprintf("routes: config: %s: %s", e.Field, e.Problem)
	}
}

// Unwrap returns ErrInvalidConfig.
func (e *FieldError) Unwrap() error { return ErrInvalidConfig }

// EnvPrefix returns the prefix of the environment overrides for the route
// called name: "DURALLM_ROUTE_" + name upper-cased with every character
// other than A-Z and 0-9 replaced by "_" + "_".
func EnvPrefix(name string) string {
	var b strings.Builder
	b.WriteString("DURALLM_ROUTE_")
	for _, c := range strings.ToUpper(name) {
		if (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') {
			b.WriteRune(c)
		} else {
			b.WriteByte('_')
		}
	}
	b.WriteByte('_')
	return b.String()
}

// Validate reports every problem of c at once, joined with errors.Join;
// each is a *FieldError naming the route and the field: no routes, empty or
// duplicate names (or names that share an environment override prefix), an
// unknown kind, structured_output declared on an anthropic route (whose
// adapter refuses response_format), a base URL that does not parse or is
// not http(s), a missing model, both or neither key source (neither is
// allowed only for a loopback base URL), an api_key_env that is not a
// variable name, an http_version other than auto, 2 or 1.1, negative
// timeouts, negative context tokens, empty data tags,
// honours_idempotency_key without a positive idempotency_window, a
// provider_record other than stored_completions or on a route that is not
// openai, provider_record_settle without a provider_record, prices that
// are negative, not finite or above providers.MaxPrice, prices on a
// route that reports no usage, and image_tokens outside 0..1000000.
func (c Config) Validate() error {
	var errs []error
	if len(c.Routes) == 0 {
		errs = append(errs, &FieldError{Index: -1, Field: "routes", Problem: "none configured"})
	}
	names := make(map[string]int, len(c.Routes))
	prefixes := make(map[string]int, len(c.Routes))
	for i, r := range c.Routes {
		bad := func(field, problem string) {
			errs = append(errs, &FieldError{Route: r.Name, Index: i, Field: field, Problem: problem})
		}
		if r.Name == "" {
			bad("name", "required")
		} else if j, dup := names[r.Name]; dup {
			bad("name", fmt.Sprintf("duplicate of routes[%d]", j))
		} else {
			names[r.Name] = i
			p := EnvPrefix(r.Name)
			if j, clash := prefixes[p]; clash {
				bad("name", fmt.Sprintf("shares the environment override prefix %s with route %q", p, c.Routes[j].Name))
			} else {
				prefixes[p] = i
			}
		}
		r.check(bad)
	}
	return errors.Join(errs...)
}

// The YAML shapes. Scalars are read as strings and converted here, so a
// bad value yields a FieldError naming route and field instead of a YAML
// type error that quotes the value.
type rawConfig struct {
	Routes     []rawRoute `yaml:"routes"`
	Reconciler string     `yaml:"reconciler"`
}

type rawRoute struct {
	Name                  string     `yaml:"name"`
	Kind                  string     `yaml:"kind"`
	BaseURL               string     `yaml:"base_url"`
	Model                 string     `yaml:"model"`
	APIKeyEnv             string     `yaml:"api_key_env"`
	APIKeyFile            string     `yaml:"api_key_file"`
	Capabilities          rawCaps    `yaml:"capabilities"`
	AttemptTimeout        string     `yaml:"attempt_timeout"`
	FirstByteTimeout      string     `yaml:"first_byte_timeout"`
	IdleTimeout           string     `yaml:"idle_timeout"`
	HonoursIdempotencyKey string     `yaml:"honours_idempotency_key"`
	IdempotencyWindow     string     `yaml:"idempotency_window"`
	InsecureSkipVerify    string     `yaml:"insecure_skip_verify"`
	Intermediary          string     `yaml:"intermediary"`
	HTTPVersion           string     `yaml:"http_version"`
	ProviderRecord        string     `yaml:"provider_record"`
	ProviderRecordSettle  string     `yaml:"provider_record_settle"`
	Prices                *rawPrices `yaml:"prices"`
	ReportsUsage          string     `yaml:"reports_usage"`
	ImageTokens           string     `yaml:"image_tokens"`
}

// rawPrices are a route's prices as written, per million tokens.
type rawPrices struct {
	Input           string `yaml:"input"`
	CachedInput     string `yaml:"cached_input"`
	CacheWriteInput string `yaml:"cache_write_input"`
	Output          string `yaml:"output"`
}

type rawCaps struct {
	Tools            string   `yaml:"tools"`
	StructuredOutput string   `yaml:"structured_output"`
	Streaming        string   `yaml:"streaming"`
	Vision           string   `yaml:"vision"`
	ContextTokens    string   `yaml:"context_tokens"`
	DataTags         []string `yaml:"data_tags"`
}

// LoadConfig reads the YAML route configuration at path (format in the
// package doc), applies the environment overrides read through env (nil
// means os.Getenv), resolves a relative api_key_file against the
// directory of path, fills in default timeouts, and validates the result.
// On any problem it returns every problem at once (errors.Join of
// *FieldError, or the read/YAML error) and a zero Config.
//
// The overrides, for a route called NAME (see EnvPrefix):
// DURALLM_ROUTE_<NAME>_BASE_URL, DURALLM_ROUTE_<NAME>_MODEL,
// DURALLM_ROUTE_<NAME>_API_KEY_ENV, DURALLM_ROUTE_<NAME>_INTERMEDIARY and
// DURALLM_ROUTE_<NAME>_HTTP_VERSION.
// API_KEY_ENV replaces the key source, so it also clears api_key_file.
func LoadConfig(path string, env func(string) string) (Config, error) {
	if env == nil {
		env = os.Getenv
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("routes: read config: %w", err)
	}
	var raw rawConfig
	dec := yaml.NewDecoder(bytes.NewReader(data))
	// A misspelt key silently ignored would be a route that quietly lacks
	// a timeout or a capability.
	dec.KnownFields(true)
	if err := dec.Decode(&raw); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("routes: parse config %s: %w", filepath.Base(path), err)
	}
	cfg := Config{Reconciler: raw.Reconciler}
	var errs []error
	dir := filepath.Dir(path)
	for i, rr := range raw.Routes {
		r, perrs := rr.route(i)
		errs = append(errs, perrs...)
		if r.Name != "" {
			p := EnvPrefix(r.Name)
			if v := env(p + "BASE_URL"); v != "" {
				r.BaseURL = v
			}
			if v := env(p + "MODEL"); v != "" {
				r.Model = v
			}
			if v := env(p + "API_KEY_ENV"); v != "" {
				r.APIKeyEnv, r.APIKeyFile = v, ""
			}
			// A BASE_URL pointed at another server may need another
			// protocol.
			if v := env(p + "HTTP_VERSION"); v != "" {
				r.HTTPVersion = strings.TrimSpace(v)
			}
			// Whoever points BASE_URL at a gateway must be able to say so.
			if v := env(p + "INTERMEDIARY"); v != "" {
				b, err := strconv.ParseBool(strings.TrimSpace(v))
				if err != nil {
					errs = append(errs, &FieldError{Route: r.Name, Index: i, Field: "intermediary", Problem: p + "INTERMEDIARY is not true or false"})
				}
				r.Intermediary = b
			}
		}
		if r.APIKeyFile != "" && !filepath.IsAbs(r.APIKeyFile) {
			r.APIKeyFile = filepath.Join(dir, r.APIKeyFile)
		}
		cfg.Routes = append(cfg.Routes, r.WithDefaults())
	}
	errs = append(errs, cfg.Validate())
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// route converts one YAML route, reporting each value it cannot parse.
func (rr rawRoute) route(i int) (Route, []error) {
	r := Route{
		Name: strings.TrimSpace(rr.Name), Kind: strings.TrimSpace(rr.Kind),
		BaseURL: strings.TrimSpace(rr.BaseURL), Model: strings.TrimSpace(rr.Model),
		APIKeyEnv: strings.TrimSpace(rr.APIKeyEnv), APIKeyFile: strings.TrimSpace(rr.APIKeyFile),
		HTTPVersion: strings.TrimSpace(rr.HTTPVersion), ProviderRecord: strings.TrimSpace(rr.ProviderRecord),
	}
	var errs []error
	bad := func(field, problem string) {
		errs = append(errs, &FieldError{Route: r.Name, Index: i, Field: field, Problem: problem})
	}
	dur := func(field, s string) time.Duration {
		if s = strings.TrimSpace(s); s == "" {
			return 0
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			bad(field, `not a Go duration such as "30s" or "1m30s"`)
		}
		return d
	}
	boolean := func(field, s string) bool {
		if s = strings.TrimSpace(s); s == "" {
			return false
		}
		v, err := strconv.ParseBool(s)
		if err != nil {
			bad(field, "not true or false")
		}
		return v
	}
	r.AttemptTimeout = dur("attempt_timeout", rr.AttemptTimeout)
	r.FirstByteTimeout = dur("first_byte_timeout", rr.FirstByteTimeout)
	r.IdleTimeout = dur("idle_timeout", rr.IdleTimeout)
	r.IdempotencyWindow = dur("idempotency_window", rr.IdempotencyWindow)
	r.ProviderRecordSettle = dur("provider_record_settle", rr.ProviderRecordSettle)
	r.HonoursIdempotencyKey = boolean("honours_idempotency_key", rr.HonoursIdempotencyKey)
	r.InsecureSkipVerify = boolean("insecure_skip_verify", rr.InsecureSkipVerify)
	r.Intermediary = boolean("intermediary", rr.Intermediary)
	c := rr.Capabilities
	r.Capabilities.Tools = boolean("capabilities.tools", c.Tools)
	r.Capabilities.StructuredOutput = boolean("capabilities.structured_output", c.StructuredOutput)
	r.Capabilities.Streaming = boolean("capabilities.streaming", c.Streaming)
	r.Capabilities.Vision = boolean("capabilities.vision", c.Vision)
	if s := strings.TrimSpace(c.ContextTokens); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			bad("capabilities.context_tokens", "not an integer")
		}
		r.Capabilities.ContextTokens = n
	}
	r.Capabilities.DataTags = append([]string(nil), c.DataTags...)
	if s := strings.TrimSpace(rr.ReportsUsage); s != "" {
		r.NoUsage = !boolean("reports_usage", s)
	}
	if s := strings.TrimSpace(rr.ImageTokens); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			bad("image_tokens", "not an integer")
		}
		r.ImageTokens = n
	}
	if rr.Prices != nil {
		r.Prices = rr.Prices.prices(bad)
	}
	return r, errs
}

// prices converts the written prices: input and output are required, and
// a cached_input or cache_write_input left out is the input price (a
// provider that discounts cached tokens says so in its price list).
func (rp rawPrices) prices(bad func(field, problem string)) *providers.Prices {
	num := func(field, s string) (float64, bool) {
		if s = strings.TrimSpace(s); s == "" {
			return 0, false
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			bad("prices."+field, "not a number")
		}
		return f, true
	}
	var p providers.Prices
	var ok bool
	if p.Input, ok = num("input", rp.Input); !ok {
		bad("prices.input", "required with prices (per million tokens)")
	}
	if p.Output, ok = num("output", rp.Output); !ok {
		bad("prices.output", "required with prices (per million tokens)")
	}
	if p.CachedInput, ok = num("cached_input", rp.CachedInput); !ok {
		p.CachedInput = p.Input
	}
	if p.CacheWriteInput, ok = num("cache_write_input", rp.CacheWriteInput); !ok {
		p.CacheWriteInput = p.Input
	}
	return &p
}
