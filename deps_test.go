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
