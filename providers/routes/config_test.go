package routes

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/durallm/durallm/providers"
)

func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func noEnv(string) string { return "" }

func TestLoadConfigExample(t *testing.T) {
	// The example in the package doc, verbatim apart from the comments.
	path := writeConfig(t, `
reconciler: usage-ledger
routes:
  - name: openai-primary
    kind: openai
    base_url: https://api.openai.com/v1
    model: gpt-4o-mini
    api_key_env: OPENAI_API_KEY
    capabilities:
      tools: true
      structured_output: true
      streaming: true
      vision: true
      context_tokens: 128000
      data_tags: [no-retention]
    attempt_timeout: 60s
    first_byte_timeout: 20s
    idle_timeout: 30s
    honours_idempotency_key: false
    idempotency_window: 24h
    insecure_skip_verify: false
  - name: anthropic-fallback
    kind: anthropic
    base_url: https://api.anthropic.com/v1
    model: claude-sonnet-4-5
    api_key_env: ANTHROPIC_API_KEY
    capabilities:
      tools: true
      streaming: true
      vision: true
      context_tokens: 200000
  - name: local
    kind: openai
    base_url: http://127.0.0.1:8000/v1
    model: llama3
    http_version: "1.1"
  - name: filed
    kind: openai
    base_url: https://gateway.example/v1
    model: m
    api_key_file: secrets/key
    attempt_timeout: 2m
    honours_idempotency_key: true
    idempotency_window: 1h
    intermediary: true
  - name: recorded
    kind: openai
    base_url: https://api.openai.com/v1
    model: gpt-4o-mini
    api_key_env: OPENAI_API_KEY
    provider_record: stored_completions
  - name: recorded-slow
    kind: openai
    base_url: https://api.openai.com/v1
    model: gpt-4o-mini
    api_key_env: OPENAI_API_KEY
    provider_record: stored_completions
    provider_record_settle: 2m
`)
	cfg, err := LoadConfig(path, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Reconciler: "usage-ledger", Routes: []Route{
		{
			Name: "openai-primary", Kind: "openai", BaseURL: "https://api.openai.com/v1", Model: "gpt-4o-mini",
			APIKeyEnv: "OPENAI_API_KEY",
			Capabilities: providers.Capabilities{Tools: true, StructuredOutput: true, Streaming: true, Vision: true,
				ContextTokens: 128000, DataTags: []string{"no-retention"}},
			AttemptTimeout: 60 * time.Second, FirstByteTimeout: 20 * time.Second, IdleTimeout: 30 * time.Second,
			IdempotencyWindow: 24 * time.Hour,
		},
		{
			Name: "anthropic-fallback", Kind: "anthropic", BaseURL: "https://api.anthropic.com/v1", Model: "claude-sonnet-4-5",
			APIKeyEnv:      "ANTHROPIC_API_KEY",
			Capabilities:   providers.Capabilities{Tools: true, Streaming: true, Vision: true, ContextTokens: 200000},
			AttemptTimeout: DefaultAttemptTimeout, FirstByteTimeout: DefaultFirstByteTimeout, IdleTimeout: DefaultIdleTimeout,
		},
		{
			Name: "local", Kind: "openai", BaseURL: "http://127.0.0.1:8000/v1", Model: "llama3", HTTPVersion: "1.1",
			AttemptTimeout: DefaultAttemptTimeout, FirstByteTimeout: DefaultFirstByteTimeout, IdleTimeout: DefaultIdleTimeout,
		},
		{
			Name: "filed", Kind: "openai", BaseURL: "https://gateway.example/v1", Model: "m",
			APIKeyFile:     filepath.Join(filepath.Dir(path), "secrets", "key"),
			AttemptTimeout: 2 * time.Minute, FirstByteTimeout: DefaultFirstByteTimeout, IdleTimeout: DefaultIdleTimeout,
			HonoursIdempotencyKey: true, IdempotencyWindow: time.Hour, Intermediary: true,
		},
		{
			Name: "recorded", Kind: "openai", BaseURL: "https://api.openai.com/v1", Model: "gpt-4o-mini", APIKeyEnv: "OPENAI_API_KEY",
			AttemptTimeout: DefaultAttemptTimeout, FirstByteTimeout: DefaultFirstByteTimeout, IdleTimeout: DefaultIdleTimeout,
			ProviderRecord: ProviderRecordStoredCompletions, ProviderRecordSettle: DefaultProviderRecordSettle,
		},
		{
			Name: "recorded-slow", Kind: "openai", BaseURL: "https://api.openai.com/v1", Model: "gpt-4o-mini", APIKeyEnv: "OPENAI_API_KEY",
			AttemptTimeout: DefaultAttemptTimeout, FirstByteTimeout: DefaultFirstByteTimeout, IdleTimeout: DefaultIdleTimeout,
			ProviderRecord: ProviderRecordStoredCompletions, ProviderRecordSettle: 2 * time.Minute,
		},
	}}
	// DataTags of routes without tags: nil either way.
	for i := range cfg.Routes {
		if len(cfg.Routes[i].Capabilities.DataTags) == 0 {
			cfg.Routes[i].Capabilities.DataTags = nil
		}
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("got  %+v\nwant %+v", cfg, want)
	}
	if r, ok := cfg.Route("local"); !ok || r.Model != "llama3" {
		t.Fatalf("Route(local) = %+v, %v", r, ok)
	}
	if m := cfg.RouteMap(); len(m) != 6 || m["filed"].Model != "m" {
		t.Fatalf("RouteMap = %+v", m)
	}
}

func TestLoadConfigEnvOverrides(t *testing.T) {
	path := writeConfig(t, `
routes:
  - name: openai-primary
    kind: openai
    base_url: https://api.openai.com/v1
    model: gpt-4o-mini
    api_key_file: /run/secrets/openai
  - name: other.route
    kind: openai
    base_url: https://b.example/v1
    model: b
    api_key_env: B_KEY
`)
	env := map[string]string{
		"DURALLM_ROUTE_OPENAI_PRIMARY_BASE_URL":    "https://eu.api.openai.com/v1",
		"DURALLM_ROUTE_OPENAI_PRIMARY_MODEL":       "gpt-4o",
		"DURALLM_ROUTE_OPENAI_PRIMARY_API_KEY_ENV": "EU_OPENAI_KEY",
		"DURALLM_ROUTE_OTHER_ROUTE_MODEL":          "b2",
		"DURALLM_ROUTE_OTHER_ROUTE_INTERMEDIARY":   "true",
	}
	cfg, err := LoadConfig(path, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	a, b := cfg.Routes[0], cfg.Routes[1]
	if a.BaseURL != "https://eu.api.openai.com/v1" || a.Model != "gpt-4o" || a.APIKeyEnv != "EU_OPENAI_KEY" || a.APIKeyFile != "" {
		t.Fatalf("overrides not applied (the key env must replace the key file): %+v", a)
	}
	if b.Model != "b2" || b.BaseURL != "https://b.example/v1" || !b.Intermediary || a.Intermediary {
		t.Fatalf("other route: %+v", b)
	}
	if got := EnvPrefix("other.route"); got != "DURALLM_ROUTE_OTHER_ROUTE_" {
		t.Fatalf("EnvPrefix = %q", got)
	}
	env["DURALLM_ROUTE_OTHER_ROUTE_INTERMEDIARY"] = "proxy"
	_, err = LoadConfig(path, func(k string) string { return env[k] })
	if err == nil || !strings.Contains(err.Error(), `route "other.route": intermediary: DURALLM_ROUTE_OTHER_ROUTE_INTERMEDIARY is not true or false`) {
		t.Fatalf("a bad INTERMEDIARY override: %v", err)
	}
}

// Validate reports every problem at once, each naming route and field.
func TestConfigValidateReportsEverything(t *testing.T) {
	const pastedKey = "sk-CANARY-pasted-key-0042"
	cfg := Config{Routes: []Route{
		{Name: "", Kind: "openai", BaseURL: "https://a.example/v1", Model: "m", APIKeyEnv: "K"},
		{Name: "dup", Kind: "openai", BaseURL: "https://a.example/v1", Model: "m", APIKeyEnv: "K"},
		{Name: "dup", Kind: "openai", BaseURL: "https://a.example/v1", Model: "m", APIKeyEnv: "K"},
		{Name: "a-b", Kind: "openai", BaseURL: "https://a.example/v1", Model: "m", APIKeyEnv: "K"},
		{Name: "a_b", Kind: "openai", BaseURL: "https://a.example/v1", Model: "m", APIKeyEnv: "K"},
		{Name: "kind", Kind: "gemini", BaseURL: "https://a.example/v1", Model: "m", APIKeyEnv: "K"},
		{Name: "claude", Kind: "anthropic", BaseURL: "https://api.anthropic.com/v1", Model: "m", APIKeyEnv: "K", Capabilities: providers.Capabilities{Tools: true, Streaming: true}},
		{Name: "claude-json", Kind: "anthropic", BaseURL: "https://api.anthropic.com/v1", Model: "m", APIKeyEnv: "K", Capabilities: providers.Capabilities{StructuredOutput: true}},
		{Name: "nokind", BaseURL: "https://a.example/v1", Model: "m", APIKeyEnv: "K"},
		{Name: "scheme", Kind: "openai", BaseURL: "ftp://a.example/v1", Model: "m", APIKeyEnv: "K"},
		{Name: "unparseable", Kind: "openai", BaseURL: "https://a.example:port/v1", Model: "m", APIKeyEnv: "K"},
		{Name: "creds", Kind: "openai", BaseURL: "https://user:" + pastedKey + "@a.example/v1", Model: "m", APIKeyEnv: "K"},
		{Name: "nourl", Kind: "openai", Model: "m", APIKeyEnv: "K"},
		{Name: "nomodel", Kind: "openai", BaseURL: "https://a.example/v1", APIKeyEnv: "K"},
		{Name: "both", Kind: "openai", BaseURL: "https://a.example/v1", Model: "m", APIKeyEnv: "K", APIKeyFile: "/k"},
		{Name: "neither", Kind: "openai", BaseURL: "https://a.example/v1", Model: "m"},
		{Name: "loopback-ok", Kind: "openai", BaseURL: "http://localhost:8080/v1", Model: "m"},
		{Name: "loopback-v6-ok", Kind: "openai", BaseURL: "http://[::1]:8080/v1", Model: "m"},
		{Name: "pasted", Kind: "openai", BaseURL: "https://a.example/v1", Model: "m", APIKeyEnv: pastedKey},
		{Name: "negative", Kind: "openai", BaseURL: "https://a.example/v1", Model: "m", APIKeyEnv: "K",
			AttemptTimeout: -1, FirstByteTimeout: -1, IdleTimeout: -1, IdempotencyWindow: -1,
			Capabilities: providers.Capabilities{ContextTokens: -1, DataTags: []string{"eu", " "}}},
		{Name: "window", Kind: "openai", BaseURL: "https://a.example/v1", Model: "m", APIKeyEnv: "K", HonoursIdempotencyKey: true},
		{Name: "record-ok", Kind: "openai", BaseURL: "https://a.example/v1", Model: "m", APIKeyEnv: "K", ProviderRecord: ProviderRecordStoredCompletions, ProviderRecordSettle: time.Minute},
		{Name: "record-claude", Kind: "anthropic", BaseURL: "https://api.anthropic.com/v1", Model: "m", APIKeyEnv: "K", ProviderRecord: ProviderRecordStoredCompletions},
		{Name: "record-unknown", Kind: "openai", BaseURL: "https://a.example/v1", Model: "m", APIKeyEnv: "K", ProviderRecord: "usage_ledger"},
		{Name: "settle-alone", Kind: "openai", BaseURL: "https://a.example/v1", Model: "m", APIKeyEnv: "K", ProviderRecordSettle: time.Minute},
		{Name: "settle-negative", Kind: "openai", BaseURL: "https://a.example/v1", Model: "m", APIKeyEnv: "K", ProviderRecord: ProviderRecordStoredCompletions, ProviderRecordSettle: -1},
		{Name: "priced-ok", Kind: "openai", BaseURL: "https://a.example/v1", Model: "m", APIKeyEnv: "K", Prices: &providers.Prices{Input: 0.15, CachedInput: 0.075, Output: 0.6}},
		{Name: "priced-no-usage", Kind: "openai", BaseURL: "http://127.0.0.1:8080/v1", Model: "m", NoUsage: true, Prices: &providers.Prices{Input: 1, Output: 1}},
		{Name: "priced-badly", Kind: "openai", BaseURL: "https://a.example/v1", Model: "m", APIKeyEnv: "K", Prices: &providers.Prices{Input: -1, Output: math.Inf(1), CachedInput: providers.MaxPrice * 2}, ImageTokens: -5},
	}}
	err := cfg.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	type key struct{ route, field string }
	got := map[key]bool{}
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var fe *FieldError
		if !errors.As(e, &fe) || !errors.Is(e, ErrInvalidConfig) {
			t.Fatalf("not a FieldError wrapping ErrInvalidConfig: %v", e)
		}
		got[key{fe.Route, fe.Field}] = true
	}
	want := []key{
		{"", "name"}, {"dup", "name"}, {"a_b", "name"}, {"kind", "kind"}, {"nokind", "kind"},
		{"claude-json", "capabilities.structured_output"},
		{"scheme", "base_url"}, {"unparseable", "base_url"}, {"creds", "base_url"}, {"nourl", "base_url"},
		{"nomodel", "model"}, {"both", "api_key_env"}, {"neither", "api_key_env"}, {"pasted", "api_key_env"},
		{"negative", "attempt_timeout"}, {"negative", "first_byte_timeout"}, {"negative", "idle_timeout"},
		{"negative", "idempotency_window"}, {"negative", "capabilities.context_tokens"},
		{"negative", "capabilities.data_tags[1]"}, {"window", "idempotency_window"},
		{"record-claude", "provider_record"}, {"record-unknown", "provider_record"}, {"settle-alone", "provider_record_settle"},
		{"settle-negative", "provider_record_settle"},
		{"priced-no-usage", "prices"}, {"priced-badly", "prices.input"}, {"priced-badly", "prices.output"},
		{"priced-badly", "prices.cached_input"}, {"priced-badly", "image_tokens"},
	}
	for _, k := range want {
		if !got[k] {
			t.Errorf("missing problem %v", k)
		}
		delete(got, k)
	}
	for k := range got {
		t.Errorf("unexpected problem %v", k)
	}
	msg := err.Error()
	if strings.Contains(msg, pastedKey) {
		t.Fatalf("a validation error repeats a secret: %s", msg)
	}
	if !strings.Contains(msg, `route "dup": name: duplicate of routes[1]`) || !strings.Contains(msg, "routes[0]: name: required") {
		t.Fatalf("messages do not name route and field:\n%s", msg)
	}
	if err := (Config{}).Validate(); err == nil || !strings.Contains(err.Error(), "routes: none configured") {
		t.Fatalf("empty config: %v", err)
	}
}

func TestLoadConfigReportsParseProblemsTogether(t *testing.T) {
	path := writeConfig(t, `
routes:
  - name: bad
    kind: openai
    base_url: https://a.example/v1
    model: m
    api_key_env: K
    attempt_timeout: 60
    idle_timeout: soon
    honours_idempotency_key: maybe
    intermediary: perhaps
    http_version: "3"
    provider_record: stored_completions
    provider_record_settle: a while
    capabilities:
      context_tokens: lots
    prices: {cached_input: cheap}
    image_tokens: many
    reports_usage: sometimes
  - name: ""
    kind: openai
  - name: local
    kind: openai
    base_url: http://127.0.0.1:8080/v1
    model: llama3
    reports_usage: false
    prices: {input: 0.1, output: 0.1}
`)
	_, err := LoadConfig(path, noEnv)
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		`route "bad": attempt_timeout: not a Go duration`,
		`route "bad": idle_timeout: not a Go duration`,
		`route "bad": honours_idempotency_key: not true or false`,
		`route "bad": intermediary: not true or false`,
		`route "bad": http_version: must be "auto", "2" or "1.1"`,
		`route "bad": capabilities.context_tokens: not an integer`,
		`route "bad": provider_record_settle: not a Go duration`,
		`routes[1]: name: required`,
		`routes[1]: base_url: required`,
		`routes[1]: model: required`,
		`route "bad": prices.input: required`,
		`route "bad": prices.output: required`,
		`route "bad": prices.cached_input: not a number`,
		`route "bad": image_tokens: not an integer`,
		`route "bad": reports_usage: not true or false`,
		`route "local": prices: the route reports no usage`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%v", want, err)
		}
	}
	for _, value := range []string{"soon", "maybe", "lots", "cheap", "many", "sometimes"} {
		if strings.Contains(err.Error(), value) {
			t.Errorf("error quotes the value %q", value)
		}
	}
}

func TestLoadConfigRejectsUnknownKeysAndBadFiles(t *testing.T) {
	path := writeConfig(t, `
routes:
  - name: typo
    kind: openai
    base_url: https://a.example/v1
    model: m
    api_key_env: K
    idle_timout: 5s
`)
	if _, err := LoadConfig(path, noEnv); err == nil || !strings.Contains(err.Error(), "idle_timout") {
		t.Fatalf("a misspelt key passed: %v", err)
	}
	if _, err := LoadConfig(filepath.Join(t.TempDir(), "missing.yaml"), noEnv); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	if _, err := LoadConfig(writeConfig(t, ""), noEnv); err == nil || !strings.Contains(err.Error(), "none configured") {
		t.Fatalf("empty file: %v", err)
	}
	if _, err := LoadConfig(writeConfig(t, "routes: [\n"), noEnv); err == nil {
		t.Fatal("broken YAML passed")
	}
}

func TestRouteAPIKey(t *testing.T) {
	const key = "sk-CANARY-route-key-7781"
	t.Setenv("DURALLM_TEST_KEY", "  "+key+"\n")
	r := Route{Name: "r", APIKeyEnv: "DURALLM_TEST_KEY"}
	if got, err := r.APIKey(); err != nil || got != key {
		t.Fatalf("env key = %q, %v", got, err)
	}

	file := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(file, []byte("\n"+key+"\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = Route{Name: "r", APIKeyFile: file}
	if got, err := r.APIKey(); err != nil || got != key {
		t.Fatalf("file key = %q, %v", got, err)
	}

	if got, err := (Route{Name: "local"}).APIKey(); err != nil || got != "" {
		t.Fatalf("no key source = %q, %v", got, err)
	}

	t.Setenv("DURALLM_TEST_EMPTY", " ")
	failures := []Route{
		{Name: "unset", APIKeyEnv: "DURALLM_TEST_UNSET_VARIABLE"},
		{Name: "empty", APIKeyEnv: "DURALLM_TEST_EMPTY"},
		{Name: "pasted", APIKeyEnv: key},
		{Name: "nofile", APIKeyFile: filepath.Join(t.TempDir(), "absent")},
		{Name: "both", APIKeyEnv: "DURALLM_TEST_KEY", APIKeyFile: file},
	}
	emptyFile := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(emptyFile, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	failures = append(failures, Route{Name: "emptyfile", APIKeyFile: emptyFile})
	for _, r := range failures {
		_, err := r.APIKey()
		if err == nil {
			t.Fatalf("%s: no error", r.Name)
		}
		if strings.Contains(err.Error(), key) {
			t.Fatalf("%s: error contains the key: %v", r.Name, err)
		}
	}
	if _, err := (Route{Name: "u", APIKeyEnv: "DURALLM_TEST_UNSET_VARIABLE"}).APIKey(); !errors.Is(err, ErrMissingAPIKey) {
		t.Fatalf("unset variable: %v", err)
	}
}

func TestCapabilitiesSatisfies(t *testing.T) {
	full := providers.Capabilities{Tools: true, StructuredOutput: true, Streaming: true, Vision: true, ContextTokens: 128000, DataTags: []string{"eu", "no-retention"}}
	cases := []struct {
		name        string
		have, need  providers.Capabilities
		wantMissing []string
	}{
		{"nothing needed", providers.Capabilities{}, providers.Capabilities{}, nil},
		{"all offered", full, providers.Capabilities{Tools: true, Vision: true, ContextTokens: 100000, DataTags: []string{"eu"}}, nil},
		{"exact context", full, providers.Capabilities{ContextTokens: 128000}, nil},
		{"unknown context is unbounded", providers.Capabilities{}, providers.Capabilities{ContextTokens: 1 << 30}, nil},
		{"everything missing, in order", providers.Capabilities{ContextTokens: 8000, DataTags: []string{"eu"}},
			providers.Capabilities{Tools: true, StructuredOutput: true, Streaming: true, Vision: true, ContextTokens: 16000, DataTags: []string{"no-retention", "eu", "us"}},
			[]string{"tools", "structured_output", "streaming", "vision", "context_tokens", "data_tag:no-retention", "data_tag:us"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ok, missing := tc.have.Satisfies(tc.need)
			if ok != (len(tc.wantMissing) == 0) || !reflect.DeepEqual(missing, tc.wantMissing) {
				t.Fatalf("Satisfies = %v, %q; want %q", ok, missing, tc.wantMissing)
			}
		})
	}
}

func TestEndpointJoin(t *testing.T) {
	cases := map[string]string{
		"https://api.openai.com/v1":              "https://api.openai.com/v1/chat/completions",
		"https://api.openai.com/v1/":             "https://api.openai.com/v1/chat/completions",
		"http://127.0.0.1:8000":                  "http://127.0.0.1:8000/chat/completions",
		"https://gw.example/openai/v1?api-ver=2": "https://gw.example/openai/v1/chat/completions?api-ver=2",
	}
	for base, want := range cases {
		got, err := endpointURL(base, "chat", "completions")
		if err != nil || got != want {
			t.Errorf("endpoint(%q) = %q, %v; want %q", base, got, err, want)
		}
	}
	for _, bad := range []string{"", "ftp://x/v1", "https://", "https://u:p@x/v1", "://"} {
		if _, err := endpointURL(bad, "chat", "completions"); err == nil {
			t.Errorf("endpoint(%q) accepted", bad)
		}
	}
}

// The routes file in docs/providers.md is valid as written, so the
// operator's copy-and-paste works.
func TestDocsProvidersExampleLoads(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "providers.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```yaml\n")
	yaml, _, closed := strings.Cut(rest, "```")
	if !ok || !closed {
		t.Fatal("no yaml block in docs/providers.md")
	}
	cfg, err := LoadConfig(writeConfig(t, yaml), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for _, r := range cfg.Routes {
		kinds[r.Name] = r.Kind
	}
	if kinds["openai-primary"] != KindOpenAI || kinds["anthropic-fallback"] != KindAnthropic || kinds["local"] != KindOpenAI {
		t.Fatalf("routes %v", kinds)
	}
}

func TestLoadConfigReadsPricesAndUsage(t *testing.T) {
	path := writeConfig(t, `
routes:
  - name: openai
    kind: openai
    base_url: https://api.openai.com/v1
    model: gpt-4o-mini
    api_key_env: OPENAI_API_KEY
    prices: {input: 0.15, cached_input: 0.075, output: 0.60}
  - name: claude
    kind: anthropic
    base_url: https://api.anthropic.com/v1
    model: claude-sonnet-4-5
    api_key_env: ANTHROPIC_API_KEY
    prices: {input: 3, cached_input: 0.3, cache_write_input: 3.75, output: 15}
    image_tokens: 1600
  - name: local
    kind: openai
    base_url: http://127.0.0.1:8080/v1
    model: llama3
    reports_usage: false
`)
	cfg, err := LoadConfig(path, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	m := cfg.RouteMap()
	if p := m["openai"].Prices; p == nil || *p != (providers.Prices{Input: 0.15, CachedInput: 0.075, CacheWriteInput: 0.15, Output: 0.6}) {
		t.Fatalf("openai prices %+v (a cache-write price left out is the input price)", p)
	}
	if p := m["claude"].Prices; p == nil || *p != (providers.Prices{Input: 3, CachedInput: 0.3, CacheWriteInput: 3.75, Output: 15}) || m["claude"].ImageTokens != 1600 {
		t.Fatalf("claude prices %+v, image tokens %d", p, m["claude"].ImageTokens)
	}
	if l := m["local"]; l.Prices != nil || !l.NoUsage || m["openai"].NoUsage {
		t.Fatalf("local %+v", l)
	}
}
