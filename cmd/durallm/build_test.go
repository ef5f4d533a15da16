package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The production build (-tags nodev: the Dockerfile's) links no embedded
// Temporal server, no chaos harness and no fault-injecting demo provider.
func TestProductionBuildLinksNoDevTooling(t *testing.T) {
	out, err := exec.Command("go", "list", "-tags", "nodev", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var found []string
	for _, p := range strings.Fields(string(out)) {
		switch {
		case strings.HasPrefix(p, "go.temporal.io/server/"),
			p == "github.com/temporalio/ui-server/v2" || strings.HasPrefix(p, "github.com/temporalio/ui-server/v2/"),
			p == "github.com/durallm/durallm/internal/chaos",
			p == "github.com/durallm/durallm/internal/devserver",
			p == "github.com/durallm/durallm/testsuite/providertest",
			p == "github.com/durallm/durallm/testsuite/runbook",
			p == "github.com/durallm/durallm/testsuite/actiontest":
			found = append(found, p)
		}
	}
	if len(found) > 0 {
		t.Fatalf("the production build links %d dev packages, e.g. %s", len(found), strings.Join(found[:min(5, len(found))], ", "))
	}
}
