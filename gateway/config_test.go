package gateway

import (
	"github.com/durallm/durallm/gateway/answer"
	"github.com/durallm/durallm/gateway/chat"

	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadConfig(t *testing.T) {
	c, err := LoadConfig(writeFile(t, "models.yaml", `
models:
  - name: demo
    routes: [primary, fallback]
    needs: {tools: true, data_tags: [eu]}
    max_attempts: 3
    deadline: 2m
    attempt_timeout: 30s
    on_disconnect: continue
    disconnect_grace: 20s
    max_wait: 1m
  - name: cheap
    routes: [local]
`))
	if err != nil {
		t.Fatal(err)
	}
	m, ok := c.Lookup("demo")
	if !ok || len(c.Models) != 2 || m.Routes[1] != "fallback" || !m.Needs.Tools || m.Needs.DataTags[0] != "eu" || m.MaxAttempts != 3 ||
		m.Deadline != 2*time.Minute || m.AttemptTimeout != 30*time.Second || m.OnDisconnect != OnDisconnectContinue ||
		m.grace() != 20*time.Second || m.maxWait() != time.Minute {
		t.Fatalf("%+v", m)
	}
	cheap, _ := c.Lookup("cheap")
	if cheap.grace() != DefaultDisconnectGrace || cheap.maxWait() != DefaultMaxWait {
		t.Fatalf("defaults %+v", cheap)
	}
	in := m.input(parse(t, `{"model":"demo","messages":[{"role":"user","content":"x"}]}`).Request)
	if in.MaxAttempts != 3 || in.Routes[0] != "primary" || !in.Needs.Tools {
		t.Fatalf("input %+v", in)
	}
}

func parse(t *testing.T, body string) answer.Request {
	t.Helper()
	cr, e := chat.Surface{}.Parse([]byte(body))
	if e != nil {
		t.Fatal(e)
	}
	return cr
}

func TestLoadConfigRefusals(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"no models", `models: []`, "no models"},
		{"unknown field", "models:\n  - name: a\n    routes: [r]\n    max_attemps: 3\n", "max_attemps"},
		{"no name", "models:\n  - routes: [r]\n", "name: empty"},
		{"twice", "models:\n  - name: a\n    routes: [r]\n  - name: a\n    routes: [r]\n", "used twice"},
		{"no routes", "models:\n  - name: a\n", "routes: empty"},
		{"bad duration", "models:\n  - name: a\n    routes: [r]\n    deadline: soon\n", "deadline"},
		{"bad on_disconnect", "models:\n  - name: a\n    routes: [r]\n    on_disconnect: maybe\n", "on_disconnect"},
		{"bad budget", "models:\n  - name: a\n    routes: [r]\n    max_attempts: 99\n", "max_attempts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadConfig(writeFile(t, "m.yaml", tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

func TestModelsFromRoutes(t *testing.T) {
	c := ModelsFromRoutes([]string{"a", "b"})
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if m, ok := c.Lookup("b"); !ok || len(m.Routes) != 1 || m.Routes[0] != "b" {
		t.Fatalf("%+v", c)
	}
}
