package demo_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/demo"
)

// TestDemoSmall runs the demo end to end at a small scale: real server, real
// agents over NATS, the MLP module embedded in the binary.
func TestDemoSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("trains on MNIST through the whole system")
	}
	if _, err := data.MNISTDir(); errors.Is(err, data.ErrMNISTNotFound) {
		t.Skipf("MNIST not in the module cache: %v", err)
	}
	out := filepath.Join(t.TempDir(), "results", "small") // made by the demo
	var log bytes.Buffer
	cfg := demo.Defaults
	cfg.Edges, cfg.Rounds, cfg.Cohort, cfg.BaseExamples = 8, 3, 4, 2000
	cfg.OutDir, cfg.Out, cfg.DataDir = out, &log, t.TempDir()
	res, err := demo.Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if len(res.Rounds) != 3 {
		t.Fatalf("%d rounds, want 3", len(res.Rounds))
	}
	for _, r := range res.Rounds {
		if r.Reports != 4 || !(r.Accuracy > 0.5) {
			t.Fatalf("round %+v", r)
		}
	}
	if strings.Contains(log.String(), "\x1b[") {
		t.Errorf("escape sequences in output that is no terminal:\n%q", log.String())
	}
	for _, want := range []string{"pretraining the base model", "enrolling 8 edge agents", "(embedded)", "round  3/3", "results go to " + out} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, log.String())
		}
	}
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, "final test accuracy") || !strings.Contains(last, "base model") {
		t.Fatalf("last line %q", last)
	}
	f, err := os.Open(filepath.Join(out, "results.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil || len(rows) != 5 || rows[0][0] != "round" {
		t.Fatalf("results.csv: %v %v", rows, err)
	}
	png, err := os.ReadFile(filepath.Join(out, "accuracy.png"))
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Fatalf("accuracy.png: %v", err)
	}
	// --data-dir keeps the server's state.
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "server", "fleetlearn.db")); err != nil {
		t.Fatalf("server state not kept in the data dir: %v", err)
	}
}
