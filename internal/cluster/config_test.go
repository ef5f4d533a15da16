package cluster

import (
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"gopkg.in/yaml.v3"

	"github.com/durallm/durallm/workflows"
)

// composeFile is the part of docker-compose.yml the test reads.
type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		EnvFile     []string          `yaml:"env_file"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []string          `yaml:"volumes"`
		Command     []string          `yaml:"command"`
		Entrypoint  []string          `yaml:"entrypoint"`
		StopGrace   string            `yaml:"stop_grace_period"`
		Deploy      struct {
			Replicas int `yaml:"replicas"`
		} `yaml:"deploy"`
	} `yaml:"services"`
	Volumes map[string]any `yaml:"volumes"`
}

func readCompose(t *testing.T) (root string, c composeFile) {
	t.Helper()
	root, err := findRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return root, c
}

// TestComposeAndHarnessShareConfig checks that docker-compose.yml runs
// what the loopback cluster harness runs, so that the compose file is
// right because the harness runs: the same server settings file (and no
// other setting than where things are), the same dynamic config file, the
// same schema job with the same plugin, the same server release, the same
// search attributes, the same routes file and worker flags, and a journal
// the workers share.
func TestComposeAndHarnessShareConfig(t *testing.T) {
	root, c := readCompose(t)
	env, err := ReadEnvFile(filepath.Join(root, ServerEnvFile))
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := strconv.Atoi(env["NUM_HISTORY_SHARDS"]); n < 2 {
		t.Errorf("%s: NUM_HISTORY_SHARDS=%q; more than one, so shards move between nodes", ServerEnvFile, env["NUM_HISTORY_SHARDS"])
	}

	srv, ok := c.Services["temporal"]
	if !ok {
		t.Fatal("docker-compose.yml has no temporal service")
	}
	if !slices.Contains(srv.EnvFile, "./"+ServerEnvFile) {
		t.Errorf("the temporal service's env_file is %v; it must read ./%s", srv.EnvFile, ServerEnvFile)
	}
	for k := range srv.Environment {
		if !slices.Contains(TopologyKeys, k) {
			t.Errorf("the temporal service sets %s itself; only where things are (%v) may differ from %s", k, TopologyKeys, ServerEnvFile)
		}
		if _, dup := env[k]; dup {
			t.Errorf("the temporal service overrides %s from %s", k, ServerEnvFile)
		}
	}
	dc := srv.Environment["DYNAMIC_CONFIG_FILE_PATH"]
	if path.Base(dc) != filepath.Base(DynamicConfigFile) || !slices.Contains(srv.Volumes, "./"+filepath.Dir(DynamicConfigFile)+":"+path.Dir(dc)+":ro") {
		t.Errorf("the temporal service must read ./%s (DYNAMIC_CONFIG_FILE_PATH %q, volumes %v)", DynamicConfigFile, dc, srv.Volumes)
	}
	_, modVersion, err := serverModuleInfo(t.Context(), root)
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimPrefix(modVersion, "v")
	for name, image := range map[string]string{"temporal": "temporalio/server:" + version, "temporal-schema": "temporalio/admin-tools:" + version} {
		if got := c.Services[name].Image; got != image {
			t.Errorf("service %s runs %q; the harness builds server %s from go.mod, so %q", name, got, modVersion, image)
		}
	}

	schema := c.Services["temporal-schema"]
	if got := schema.Environment["SQL_PLUGIN"]; got != env["DB"] {
		t.Errorf("temporal-schema's SQL_PLUGIN is %q, the server's DB %q", got, env["DB"])
	}
	if !slices.Contains(schema.Entrypoint, "/scripts/"+filepath.Base(SchemaScript)) || !slices.Contains(schema.Volumes, "./"+filepath.Dir(SchemaScript)+":/scripts:ro") {
		t.Errorf("temporal-schema must run ./%s (entrypoint %v, volumes %v)", SchemaScript, schema.Entrypoint, schema.Volumes)
	}

	// The search attributes the compose job registers are the ones the
	// harness (and 'durallm dev') registers: workflows.SearchAttributes.
	script, err := os.ReadFile(filepath.Join(root, SearchAttrScript))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for name, typ := range workflows.SearchAttributes {
		if typ != enumspb.INDEXED_VALUE_TYPE_KEYWORD {
			t.Errorf("%s is %v; %s registers Keyword only", name, typ, SearchAttrScript)
		}
		want = append(want, name)
	}
	sort.Strings(want)
	loops := regexp.MustCompile(`(?m)^for name in ([A-Za-z ]+); do$`).FindAllStringSubmatch(string(script), -1)
	if len(loops) == 0 {
		t.Fatalf("%s: no 'for name in ...; do' loop", SearchAttrScript)
	}
	for _, m := range loops {
		got := strings.Fields(m[1])
		sort.Strings(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s registers %v; workflows.SearchAttributes has %v", SearchAttrScript, got, want)
		}
	}

	w := c.Services["worker"]
	if !slices.Contains(w.Volumes, "./"+RoutesFile+":/etc/durallm/routes.yaml:ro") || !containsRun(w.Command, []string{"--routes", "/etc/durallm/routes.yaml"}) {
		t.Errorf("the workers must read ./%s (command %v, volumes %v)", RoutesFile, w.Command, w.Volumes)
	}
	if !containsRun(w.Command, SharedWorkerFlags) {
		t.Errorf("the workers' command %v lacks the harness's %v", w.Command, SharedWorkerFlags)
	}
	if w.Deploy.Replicas != 2 {
		t.Errorf("compose runs %d worker replicas; the harness runs 2", w.Deploy.Replicas)
	}
	grace, err := time.ParseDuration(w.StopGrace)
	stop, _ := time.ParseDuration(SharedWorkerFlags[slices.Index(SharedWorkerFlags, "--stop-timeout")+1])
	if err != nil || grace <= stop {
		t.Errorf("stop_grace_period %q must be longer than --stop-timeout %s", w.StopGrace, stop)
	}
	// The replicas share one journal and result store, in database
	// JournalDatabase on the cluster's PostgreSQL, as the harness's
	// workers do (--journal-dsn).
	// Compose's own interpolation, with the defaults: ${NAME:-default}.
	dsn := regexp.MustCompile(`\$\{[A-Z_]+:-([^}]*)\}`).ReplaceAllString(w.Environment["DURALLM_JOURNAL_DSN"], "$1")
	if u, err := url.Parse(dsn); err != nil || u.Scheme != "postgres" || strings.TrimPrefix(u.Path, "/") != JournalDatabase || u.Hostname() != "postgres" {
		t.Errorf("the workers' DURALLM_JOURNAL_DSN %q is not database %s on the compose PostgreSQL", dsn, JournalDatabase)
	}
	for _, k := range []string{"DURALLM_JOURNAL_DIR", "DURALLM_RESULT_DIR"} {
		if v, ok := w.Environment[k]; ok {
			t.Errorf("the workers set %s=%q beside the DSN: the worker refuses both", k, v)
		}
	}
}

// containsRun reports whether run appears in s as consecutive elements.
func containsRun(s, run []string) bool {
	for i := 0; i+len(run) <= len(s); i++ {
		if slices.Equal(s[i:i+len(run)], run) {
			return true
		}
	}
	return false
}
