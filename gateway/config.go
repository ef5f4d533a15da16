package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/workflows"
)

// Model is one model the gateway serves: a group of routes, with the
// needs and action settings every request to it gets.
type Model struct {
	// Name is what a request's "model" says. Required, unique.
	Name string
	// Routes are route names, the primary first (the workers' routes).
	// Required.
	Routes []string
	// Needs are capabilities every route of the action must have, beside
	// what the request itself uses.
	Needs providers.Capabilities
	// The action settings; zero means workflows.ActionInput's default.
	MaxAttempts      int
	Deadline         time.Duration
	AttemptTimeout   time.Duration
	QueueTimeout     time.Duration
	ReconcileTimeout time.Duration
	ReplayPolicy     workflows.ReplayPolicy
	RetriesPerRoute  int
	// OnDisconnect is what a caller's disconnect does: OnDisconnectCancel
	// (the default) or OnDisconnectContinue. The request header
	// X-Durallm-On-Disconnect overrides it.
	OnDisconnect string
	// DisconnectGrace is how long a keyed request's action outlives its
	// caller's disconnect, waiting for a retry with the same key to attach,
	// before it is canceled. Zero means DefaultDisconnectGrace.
	DisconnectGrace time.Duration
	// MaxWait caps how long a non-streamed request waits for its answer.
	// Zero means DefaultMaxWait.
	MaxWait time.Duration
}

// What a caller's disconnect does (Model.OnDisconnect, the
// X-Durallm-On-Disconnect header).
const (
	// OnDisconnectCancel cancels the action (client_disconnect): at once
	// without a key, after the disconnect grace with one.
	OnDisconnectCancel = "cancel"
	// OnDisconnectContinue never cancels: fetch the answer by key or
	// with GET /v1/actions/{id}.
	OnDisconnectContinue = "continue"
)

// Defaults of a model's settings.
const (
	// DefaultDisconnectGrace is longer than the OpenAI SDKs' retry
	// backoff (0.5 to 8 s), so their retry attaches before the cancel.
	DefaultDisconnectGrace = 10 * time.Second
	// DefaultMaxWait is below the SDKs' 10-minute timeouts, which they
	// retry.
	DefaultMaxWait = 5 * time.Minute
)

func (m Model) input(r providers.Request) workflows.ActionInput {
	return workflows.ActionInput{
		Request: r, Routes: append([]string(nil), m.Routes...), Needs: m.Needs,
		MaxAttempts: m.MaxAttempts, Deadline: m.Deadline, AttemptTimeout: m.AttemptTimeout,
		QueueTimeout: m.QueueTimeout, ReconcileTimeout: m.ReconcileTimeout,
		ReplayPolicy: m.ReplayPolicy, RetriesPerRoute: m.RetriesPerRoute,
	}
}

func (m Model) grace() time.Duration {
	if m.DisconnectGrace > 0 {
		return m.DisconnectGrace
	}
	return DefaultDisconnectGrace
}

func (m Model) maxWait() time.Duration {
	if m.MaxWait > 0 {
		return m.MaxWait
	}
	return DefaultMaxWait
}

// Config is the gateway's models, in the order GET /v1/models lists them.
type Config struct {
	Models []Model
}

// Lookup finds a model by name.
func (c Config) Lookup(name string) (Model, bool) {
	for _, m := range c.Models {
		if m.Name == name {
			return m, true
		}
	}
	return Model{}, false
}

// ModelsFromRoutes is the configuration without a --config: every route a
// model of its own name (a group of one).
func ModelsFromRoutes(names []string) Config {
	var c Config
	for _, n := range names {
		c.Models = append(c.Models, Model{Name: n, Routes: []string{n}})
	}
	return c
}

// Validate reports every problem at once, naming the model and field.
func (c Config) Validate() error {
	var errs []error
	seen := map[string]bool{}
	for i, m := range c.Models {
		where := fmt.Sprintf("models[%d]", i)
		if m.Name != "" {
			where = fmt.Sprintf("model %q", m.Name)
		}
		bad := func(field, problem string) {
			errs = append(errs, fmt.Errorf("gateway config: %s: %s: %s", where, field, problem))
		}
		switch {
		case strings.TrimSpace(m.Name) == "":
			bad("name", "empty")
		case seen[m.Name]:
			bad("name", "used twice")
		}
		seen[m.Name] = true
		if len(m.Routes) == 0 {
			bad("routes", "empty: name the routes, the primary first")
		}
		switch m.OnDisconnect {
		case "", OnDisconnectCancel, OnDisconnectContinue:
		default:
			bad("on_disconnect", "want cancel or continue")
		}
		for field, d := range map[string]time.Duration{"disconnect_grace": m.DisconnectGrace, "max_wait": m.MaxWait} {
			if d < 0 {
				bad(field, "negative")
			}
		}
		in := m.input(providers.Request{Messages: []providers.Message{providers.TextMessage("user", "x")}})
		if err := in.WithDefaults("check").Validate(); err != nil {
			bad("settings", err.Error())
		}
	}
	if len(c.Models) == 0 {
		errs = append(errs, errors.New("gateway config: no models"))
	}
	return errors.Join(errs...)
}

type rawModel struct {
	Name             string   `yaml:"name"`
	Routes           []string `yaml:"routes"`
	Needs            rawNeeds `yaml:"needs"`
	MaxAttempts      int      `yaml:"max_attempts"`
	Deadline         string   `yaml:"deadline"`
	AttemptTimeout   string   `yaml:"attempt_timeout"`
	QueueTimeout     string   `yaml:"queue_timeout"`
	ReconcileTimeout string   `yaml:"reconcile_timeout"`
	ReplayPolicy     string   `yaml:"replay_policy"`
	RetriesPerRoute  int      `yaml:"retries_per_route"`
	OnDisconnect     string   `yaml:"on_disconnect"`
	DisconnectGrace  string   `yaml:"disconnect_grace"`
	MaxWait          string   `yaml:"max_wait"`
}

type rawNeeds struct {
	Tools            bool     `yaml:"tools"`
	StructuredOutput bool     `yaml:"structured_output"`
	Streaming        bool     `yaml:"streaming"`
	Vision           bool     `yaml:"vision"`
	ContextTokens    int      `yaml:"context_tokens"`
	DataTags         []string `yaml:"data_tags"`
}

// LoadConfig reads a models file:
//
//	models:
//	  - name: demo
//	    routes: [demo-primary, demo-fallback]
//	    needs: {tools: true}
//	    max_attempts: 4
//	    deadline: 5m
//	    on_disconnect: cancel
//	    disconnect_grace: 10s
//	    max_wait: 5m
//
// It returns every problem at once, naming the model and the field.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("gateway config: %w", err)
	}
	var raw struct {
		Models []rawModel `yaml:"models"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	// A misspelt setting silently ignored would be a model without it.
	dec.KnownFields(true)
	if err := dec.Decode(&raw); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("gateway config: parse %s: %w", filepath.Base(path), err)
	}
	var c Config
	var errs []error
	for i, rm := range raw.Models {
		m := Model{
			Name: strings.TrimSpace(rm.Name), Routes: rm.Routes, MaxAttempts: rm.MaxAttempts,
			ReplayPolicy: workflows.ReplayPolicy(rm.ReplayPolicy), RetriesPerRoute: rm.RetriesPerRoute,
			OnDisconnect: rm.OnDisconnect,
			Needs: providers.Capabilities{Tools: rm.Needs.Tools, StructuredOutput: rm.Needs.StructuredOutput, Streaming: rm.Needs.Streaming,
				Vision: rm.Needs.Vision, ContextTokens: rm.Needs.ContextTokens, DataTags: rm.Needs.DataTags},
		}
		for _, d := range []struct {
			field string
			s     string
			to    *time.Duration
		}{
			{"deadline", rm.Deadline, &m.Deadline}, {"attempt_timeout", rm.AttemptTimeout, &m.AttemptTimeout},
			{"queue_timeout", rm.QueueTimeout, &m.QueueTimeout}, {"reconcile_timeout", rm.ReconcileTimeout, &m.ReconcileTimeout},
			{"disconnect_grace", rm.DisconnectGrace, &m.DisconnectGrace}, {"max_wait", rm.MaxWait, &m.MaxWait},
		} {
			if strings.TrimSpace(d.s) == "" {
				continue
			}
			v, err := time.ParseDuration(strings.TrimSpace(d.s))
			if err != nil {
				errs = append(errs, fmt.Errorf("gateway config: models[%d]: %s: not a duration such as 30s or 5m", i, d.field))
				continue
			}
			*d.to = v
		}
		c.Models = append(c.Models, m)
	}
	errs = append(errs, c.Validate())
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	return c, nil
}
