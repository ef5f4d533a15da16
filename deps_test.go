package durallm_test

import (
	"os/exec"
	"strings"
	"testing"
)

// A Go app that only starts and steers actions links the client, the
// workflow's types and the envelope: no provider SDK, no route
// configuration parser, no metrics or tracing exporter, no activity
// implementation and no Temporal server. (The Temporal SDK itself brings
// gopkg.in/yaml.v3 along through its test environment; that is the SDK's,
// not ours.)
func TestTheClientLinksNoWorkerSideCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	forbidden := []string{
		"github.com/openai/openai-go",
		"github.com/anthropics/anthropic-sdk-go",
		"github.com/prometheus/",
		"go.opentelemetry.io/",
		"go.temporal.io/server/",
		"github.com/durallm/durallm/activities",
		"github.com/durallm/durallm/providers/exchange",
		"github.com/durallm/durallm/providers/routes",
		"github.com/durallm/durallm/telemetry",
		"github.com/durallm/durallm/worker",
	}
	var found []string
	for _, p := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if strings.HasPrefix(p, f) {
				found = append(found, p)
			}
		}
	}
	if len(found) > 0 {
		t.Fatalf("the client links %d worker-side packages, e.g. %s", len(found), strings.Join(found[:min(6, len(found))], ", "))
	}
}

// The layers of docs/contract.md section 1, as the import graph shows
// them: the deterministic workflow links no engine (the vocabulary it
// speaks is package evidence, standard library only), and nothing of
// durallm's brings x/net's HTTP/2 into it (the Temporal SDK's gRPC
// transport does, which is the SDK's); the engine and the provider layer
// link nothing of Temporal.
func TestTheLayers(t *testing.T) {
	const module = "github.com/durallm/durallm"
	deps := func(t *testing.T, pkgs ...string) map[string][]string {
		t.Helper()
		args := append([]string{"list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}"}, pkgs...)
		out, err := exec.Command("go", args...).Output()
		if err != nil {
			t.Fatalf("go list: %v", err)
		}
		imports := map[string][]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Fields(line)
			imports[f[0]] = f[1:]
		}
		return imports
	}
	t.Run("the workflow links no engine", func(t *testing.T) {
		for p, imports := range deps(t, "./workflows") {
			for _, engine := range []string{module + "/recovery", module + "/providers/exchange", module + "/activities"} {
				if p == engine {
					t.Errorf("workflows links %s", engine)
				}
			}
			if strings.HasPrefix(p, module) {
				for _, i := range imports {
					if strings.HasPrefix(i, "golang.org/x/net/http2") {
						t.Errorf("%s brings %s into the workflow", p, i)
					}
				}
			}
		}
	})
	t.Run("the vocabulary is the standard library only", func(t *testing.T) {
		for p := range deps(t, "./evidence") {
			if strings.Contains(strings.SplitN(p, "/", 2)[0], ".") && p != module+"/evidence" {
				t.Errorf("evidence links %s", p)
			}
		}
	})
	t.Run("the engine and the provider layer link nothing of Temporal", func(t *testing.T) {
		for p := range deps(t, "./recovery", "./providers/...") {
			if strings.HasPrefix(p, "go.temporal.io/") {
				t.Errorf("links %s", p)
			}
		}
	})
}
