package cluster

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// binaries are the executables a cluster runs.
type binaries struct {
	server, sqlTool, durallm string
	schemaDir                string // the module's schema/postgresql/v12
	version                  string // the server module's version
}

// serverModuleInfo is the Temporal server module's directory and version
// in go.mod's build list, read in the repository at root.
func serverModuleInfo(ctx context.Context, root string) (dir, version string, err error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}\t{{.Version}}", serverModule)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", "", fmt.Errorf("cluster: locating %s: %w", serverModule, err)
	}
	dir, version, _ = strings.Cut(strings.TrimSpace(string(out)), "\t")
	return dir, version, nil
}

// build builds the Temporal server and temporal-sql-tool once per server
// version into cacheDir (a cold build takes minutes; go.mod's tool
// directives pin them to the module version the project builds with), and
// durallm every time (the Go build cache makes that quick).
func build(ctx context.Context, root, cacheDir string) (binaries, error) {
	modDir, version, err := serverModuleInfo(ctx, root)
	if err != nil {
		return binaries{}, err
	}
	bin := filepath.Join(cacheDir, "temporal-"+version, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return binaries{}, fmt.Errorf("cluster: %w", err)
	}
	b := binaries{
		server:  filepath.Join(bin, "temporal-server"),
		sqlTool: filepath.Join(bin, "temporal-sql-tool"),
		durallm: filepath.Join(cacheDir, "durallm"),
	}
	goBuild := func(out, pkg string, always bool) error {
		if _, err := os.Stat(out); err == nil && !always {
			return nil
		}
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out+".tmp", pkg)
		cmd.Dir = root
		if msg, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("cluster: go build %s: %w\n%s", pkg, err, msg)
		}
		return os.Rename(out+".tmp", out)
	}
	if err := goBuild(b.server, serverModule+"/cmd/server", false); err != nil {
		return b, err
	}
	if err := goBuild(b.sqlTool, serverModule+"/cmd/tools/sql", false); err != nil {
		return b, err
	}
	if err := goBuild(b.durallm, "./cmd/durallm", true); err != nil {
		return b, err
	}
	b.schemaDir = filepath.Join(modDir, "schema", "postgresql", "v12")
	b.version = version
	return b, nil
}

// ReadEnvFile reads KEY=VALUE lines (comments and blank lines skipped),
// the format docker compose's env_file takes.
func ReadEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("cluster: %s:%d: not KEY=VALUE: %q", path, n, line)
		}
		env[k] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("cluster: %s: %w", path, err)
	}
	return env, nil
}
