package deploy_test

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/audit/witness"
	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/pool/stepdir"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
)

// dockerignore is a .dockerignore file read and matched by Docker's own
// code (moby/patternmatcher, which the builder uses).
type dockerignore struct {
	pm *patternmatcher.PatternMatcher
}

func parseDockerignore(s string) (dockerignore, error) {
	patterns, err := ignorefile.ReadAll(strings.NewReader(s))
	if err != nil {
		return dockerignore{}, err
	}
	pm, err := patternmatcher.New(patterns)
	return dockerignore{pm}, err
}

func readDockerignore(t *testing.T) dockerignore {
	t.Helper()
	b, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	ign, err := parseDockerignore(string(b))
	if err != nil {
		t.Fatalf(".dockerignore: %v", err)
	}
	return ign
}

// excludes reports whether the slash-separated path p, relative to the
// context's root, is left out: it or a parent directory matches.
func (d dockerignore) excludes(p string) bool {
	ok, err := d.pm.MatchesOrParentMatches(p)
	return err == nil && ok
}

// context walks root as the builder does when it sends a context: top
// down, each path matched with its parent's results, a directory left out
// whole when no pattern could bring anything in it back. It returns the
// files sent, slash-separated and relative to root.
func (d dockerignore) context(t *testing.T, root string) []string {
	t.Helper()
	var sent []string
	var walk func(rel string, parent patternmatcher.MatchInfo)
	walk = func(rel string, parent patternmatcher.MatchInfo) {
		entries, err := os.ReadDir(filepath.Join(root, filepath.FromSlash(rel)))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			p := path.Join(rel, e.Name())
			excluded, info, err := d.pm.MatchesUsingParentResults(p, parent)
			if err != nil {
				t.Fatalf(".dockerignore on %s: %v", p, err)
			}
			switch {
			case e.IsDir() && excluded && !d.pm.Exclusions():
			case e.IsDir():
				walk(p, info)
			case !excluded:
				sent = append(sent, p)
			}
		}
	}
	walk("", patternmatcher.MatchInfo{})
	return sent
}

// serverDataFiles starts a real server with the dashboard on, in a data
// directory of its own, and returns every file it wrote there, seen while
// it runs (the databases' journals) and after it stopped, plus the files
// it writes later in a pool checkpoint.
func serverDataFiles(t *testing.T) []string {
	t.Helper()
	h := servertest.New(t, servertest.WithConfig(func(c *server.Config) {
		c.UIAddr = "127.0.0.1:0"
		c.CacheDir = "" // the default: wasm-cache inside the data directory
	}))
	seen := map[string]bool{}
	list := func() {
		err := filepath.WalkDir(h.Dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, err := filepath.Rel(h.Dir, p)
			seen[filepath.ToSlash(rel)] = true
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	list()
	if err := h.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	list()
	pool, err := filepath.Rel(h.Dir, server.PoolCheckpointDir(h.Dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{stepdir.ModelFile, stepdir.OptimizerFile, stepdir.StateFile} {
		seen[path.Join(filepath.ToSlash(pool), "job-1", "step-3", f)] = true
	}
	files := slices.Sorted(func(yield func(string) bool) {
		for f := range seen {
			if !yield(f) {
				return
			}
		}
	})
	// What the issue found sent: the keys and the audit log's keys.
	for _, want := range []string{path.Join(server.KeysDir, server.APIKeyFile), path.Join(server.KeysDir, server.EnrollKeyFile),
		audit.KeysFile, audit.DBFile, server.AdminTokenFile, "tls/ca.key", "nats-auth/operator.nk"} {
		if !slices.Contains(files, want) {
			t.Fatalf("the server wrote no %s in its data directory: %v", want, files)
		}
	}
	return files
}

// The files other programs keep in their data directories, by the names
// in their code: an edge agent, a pool worker, an audit witness, and the
// keys and tokens the CLI writes where its user says.
var otherDataFiles = []string{
	edge.KeyFile, edge.CredsFile, edge.PublishersFile, edge.NATSURLFile, edge.CAFile, "device-id",
	"lease.json",
	witness.LogKeyFile, witness.LockFile, "conflict-1700000000.txt",
	"witness.key", "publisher.pem", "auditor.token", "admin.token", "audit.db-wal", "fleetlearn.db-wal", "fleetlearn.db-shm",
}

// TestDockerignore: the build context holds every file the images' go
// build reads, and nothing of a data directory whatever its name: with
// the files a real server wrote planted in directories of several names,
// at the root and deep in the source tree, as the builder walks them.
func TestDockerignore(t *testing.T) {
	ign := readDockerignore(t)

	// Every file go build reads for the images' binaries, on any platform
	// (files for other systems and architectures too), is sent.
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-deps",
		"-f", `{{if .Module}}{{if .Module.Main}}{{.Dir}}{{range .GoFiles}} {{.}}{{end}}{{range .IgnoredGoFiles}} {{.}}{{end}}{{range .EmbedFiles}} {{.}}{{end}}{{end}}{{end}}`,
		"./cmd/fleetlearn-server", "./cmd/fleetlearn", "./cmd/fleetlearn-edge", "./cmd/fleetlearn-worker")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	needed := []string{"go.mod", "go.sum"}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		rel, err := filepath.Rel(root, f[0])
		if err != nil {
			t.Fatal(err)
		}
		for _, file := range f[1:] {
			needed = append(needed, filepath.ToSlash(filepath.Join(rel, file)))
		}
	}
	if len(needed) < 100 {
		t.Fatalf("go list found only %v", needed)
	}
	sent := ign.context(t, root)
	repoSent := len(sent)
	for _, p := range needed {
		if !slices.Contains(sent, p) {
			t.Errorf(".dockerignore leaves out %s, which go build reads", p)
		}
	}
	for _, p := range sent {
		if strings.HasPrefix(p, ".git/") {
			t.Fatalf(".dockerignore sends the history (%s)", p)
		}
	}

	// Data directories of any name, at the root and inside the source
	// (where a test or a person may leave one), beside paths left out by
	// their own names.
	files := append(serverDataFiles(t), otherDataFiles...)
	ctx := t.TempDir()
	dirs := []string{"fleetlearn-data", "data", "my data", ".fleetlearn", "srv/fleetlearn", "var/lib/fleetlearn",
		"server/run-1", "cmd/fleetlearn-server/state", "deploy/docker/data", "edge-1", "worker"}
	var planted []string
	for _, d := range dirs {
		for _, f := range files {
			planted = append(planted, path.Join(d, f))
		}
	}
	planted = append(planted, ".git/config", "fleetlearn-edge/device.nk", "datasets/mnist/train.bin", "bin/fleetlearn",
		"fleetlearn", "fleetlearn-server", "server.test", "cmd/fleetlearn/.main.go.swp", ".idea/workspace.xml",
		"dist/linux-arm64/fleetlearn-edge", "token", "deploy/x.token", "model.safetensors")
	// Files beside them that must still be sent: the matcher is not
	// leaving everything out.
	keep := []string{"go.mod", "server/server.go", "cmd/fleetlearn-server/main.go", "pool/checkpoint/store.go",
		"audit/witness/witness.go", "deploy/docker/Dockerfile.server"}
	for _, p := range append(slices.Clone(planted), keep...) {
		full := filepath.Join(ctx, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sent = ign.context(t, ctx)
	for _, p := range planted {
		if slices.Contains(sent, p) {
			t.Errorf(".dockerignore sends %s to the builder", p)
		}
	}
	for _, p := range keep {
		if !slices.Contains(sent, p) {
			t.Errorf(".dockerignore leaves out %s", p)
		}
	}
	t.Logf("%d files of %d data directories left out; %d of the repository's files sent", len(planted), len(dirs), repoSent)
}
