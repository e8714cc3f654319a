package fleetlearn_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadmeArchitectureNamesEveryBinary: the README's architecture table
// names each program under cmd/ (a directory with a main.go) in its cmd/ row, and each service's binary
// in the row of the services it runs.
func TestReadmeArchitectureNamesEveryBinary(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{} // first cell → the row
	for line := range strings.SplitSeq(string(b), "\n") {
		if cells := strings.Split(line, "|"); len(cells) > 3 && strings.HasPrefix(line, "| `") {
			rows[strings.TrimSpace(cells[1])] = line
		}
	}
	cmdRow, servicesRow := rows["`cmd/`"], rows["`server/`, `edge/`, `worker/`"]
	if cmdRow == "" || servicesRow == "" {
		t.Fatalf("README.md's architecture table has no cmd/ row or no server/, edge/, worker/ row")
	}
	entries, err := os.ReadDir("cmd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if _, err := os.Stat(filepath.Join("cmd", e.Name(), "main.go")); err != nil {
			continue // not a program: the programs' shared code (internal) or cmdtest
		}
		name := "`" + e.Name() + "`"
		if !strings.Contains(cmdRow, name) {
			t.Errorf("README.md's architecture table: the cmd/ row does not name %s", name)
		}
		if e.Name() != "fleetlearn" && !strings.Contains(servicesRow, name) {
			t.Errorf("README.md's architecture table: the server/, edge/, worker/ row does not name %s", name)
		}
	}
}
