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

// TestLMDemoSmall runs the language-model demo at a small scale: the pool
// pretrains the transformer on Go source, then the fleet fine-tunes it
// fully and with LoRA through real rounds.
func TestLMDemoSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("pretrains and fine-tunes a transformer through the whole system")
	}
	out := filepath.Join(t.TempDir(), "lm")
	var log bytes.Buffer
	cfg := demo.LMDefaults
	cfg.Edges, cfg.Rounds, cfg.Cohort, cfg.PretrainSteps = 3, 1, 2, 16
	cfg.OutDir, cfg.Out, cfg.DataDir = out, &log, t.TempDir()
	res, err := demo.RunLM(context.Background(), cfg)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if len(res.Full) != 1 || len(res.LoRA) != 1 || !(res.Base.Loss > 0) || !(res.Full[0].Loss > 0) {
		t.Fatalf("result %+v", res)
	}
	if res.FullBytes/res.LoRABytes < 10 || res.LoRAParams*10 > res.FullParams {
		t.Fatalf("LoRA sent %.0f bytes per report for %d parameters, full %.0f for %d", res.LoRABytes, res.LoRAParams, res.FullBytes, res.FullParams)
	}
	for _, want := range []string{"pretraining the base model on the pool", "update module: lm", "LoRA fine-tuning: rank 4", "bytes per update report on NATS"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, log.String())
		}
	}
	rows, err := readCSV(filepath.Join(out, "lm.csv"))
	if err != nil || len(rows) != 4 || rows[1][0] != "base" {
		t.Fatalf("lm.csv: %v %v", rows, err)
	}
	if png, err := os.ReadFile(filepath.Join(out, "lm.png")); err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Fatalf("lm.png: %v", err)
	}
	cfg.GoRoot = t.TempDir()
	if _, err := demo.RunLM(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "--goroot") {
		t.Fatalf("no Go source: %v", err)
	}
}

func readCSV(path string) ([][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return csv.NewReader(f).ReadAll()
}
