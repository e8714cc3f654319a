package cli_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/cli"
	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/train"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// poolModel runs a pool job through the real server's worker API, as a
// worker would, that ends with m as its model, and returns the version.
func poolModel(t *testing.T, h *servertest.Harness, job, name string, m *model.Model) string {
	t.Helper()
	spec := &pb.PoolJobSpec{Id: job, Ranks: 1, PerRank: &pb.PoolResources{MilliCpu: 1000, MemoryBytes: 1 << 30},
		CheckpointInterval: 10, TotalSteps: 10, OutputModel: name,
		Program: &pb.PoolJobSpec_Builtin{Builtin: &pb.PoolBuiltinTrainer{Arch: []uint32{2, 1}, BatchSize: 4, LearningRate: 0.1,
			Dataset: &pb.PoolDataset{Source: "mnist-train"}}}}
	_, j := h.RunPoolJob(t, spec, m, &pb.PoolUsage{CpuSeconds: 2})
	if j.GetOutputVersion() == "" {
		t.Fatalf("job %v", j)
	}
	return j.GetOutputVersion()
}

// TestModelLoRAAddLineageServer: model lora add on a registered model
// imports the adapted model with that model as its parent, and model
// lineage then runs from the pool job through the pool's model and the
// LoRA model to the task that fine-tuned it.
func TestModelLoRAAddLineageServer(t *testing.T) {
	h := servertest.New(t)
	base, err := train.InitLM(train.LMConfig{Vocab: 16, Context: 4, Dim: 8, Layers: 1}, 1)
	if err != nil {
		t.Fatal(err)
	}
	pooled := poolModel(t, h, "pretrain-lm", "gocode", base)

	out, err := runServer(t, h, "model", "lora", "add", "gocode", "--rank", "2", "--targets", "attn.q,attn.v", "--name", "gocode-lora")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	version := regexp.MustCompile(`(?m)^  version      ([0-9a-f]{64})  the server's name`).FindStringSubmatch(out)
	if version == nil || !strings.Contains(out, "imported as gocode-lora@1") || !strings.Contains(out, "parent gocode@1 "+pooled) ||
		!strings.Contains(out, "added rank-2 adapters on attn.q,attn.v to gocode@1") {
		t.Fatalf("model lora add printed:\n%s", out)
	}
	res, err := h.Models.GetModel(t.Context(), &pb.GetModelRequest{Version: version[1]})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.GetModel(); got.GetRef().GetParentVersion() != pooled || got.GetName() != "gocode-lora" ||
		!strings.Contains(got.GetDescription(), "LoRA rank 2 on attn.q,attn.v (seed 1) of gocode@1") {
		t.Fatalf("imported model %v", got)
	}
	// The stored model is the base with the adapters, and its content hash
	// is the one printed.
	exported := filepath.Join(t.TempDir(), "lora.safetensors")
	if _, err := runServer(t, h, "model", "export", "gocode-lora", "-o", exported); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(exported)
	if err != nil {
		t.Fatal(err)
	}
	got, err := model.ReadSafetensors(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	want, err := train.AddLoRA(base, 2, []string{"attn.q", "attn.v"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got.HashHex() != want.HashHex() || !strings.Contains(out, "  content hash "+want.HashHex()+"  ") || got.Lineage.Parent != pooled {
		t.Errorf("stored model: content %s (want %s), parent %q", got.HashHex(), want.HashHex(), got.Lineage.Parent)
	}
	if getOut, err := runServer(t, h, "model", "get", "gocode-lora", "--content-hash"); err != nil ||
		!regexp.MustCompile(`(?m)^CONTENT HASH +`+want.HashHex()+`$`).MatchString(getOut) ||
		!regexp.MustCompile(`(?m)^PARENT +`+pooled+`$`).MatchString(getOut) {
		t.Errorf("model get: %v\n%s", err, getOut)
	}

	// A task fine-tunes it.
	module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
	var layout []*pb.TensorSpec
	for _, ts := range got.Tensors {
		shape := make([]uint64, len(ts.Shape))
		for i, d := range ts.Shape {
			shape[i] = uint64(d)
		}
		layout = append(layout, &pb.TensorSpec{Name: ts.Name, Shape: shape})
	}
	fleet := simFleet(t, h, 2)
	fleet.Layout, fleet.Delta = layout, make([]float32, got.Layout().Size())
	for i := range fleet.Delta {
		fleet.Delta[i] = 1e-4
	}
	startSimFleet(t, fleet)
	id := createTask(t, h, "--name", "ft-lora", "--model", "gocode-lora", "--module", module, "--cohort", "2",
		"--over-selection", "1", "--rounds", "2")
	if out, err := runServer(t, h, "task", "watch", id); err != nil {
		t.Fatalf("watch: %v\n%s", err, out)
	}

	out, err = runServer(t, h, "model", "lineage", "gocode-lora")
	if err != nil {
		t.Fatal(err)
	}
	lines := []string{
		`(?m)^pool job pretrain-lm: 10 steps, `,
		`(?m)^└─ model gocode@1 ` + pooled[:12] + ` \(pool\)$`,
		`(?m)^   └─ model gocode-lora@1 ` + version[1][:12] + ` \(imported\)   ← this version$`,
		`(?m)^      └─ federated task ` + id + `: 2 rounds \(1–2\), newest model ft-lora@2 [0-9a-f]{12}$`,
	}
	for _, re := range lines {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("model lineage gocode-lora lacks %s:\n%s", re, out)
		}
	}
	out, err = runServer(t, h, "model", "lineage", "gocode")
	if err != nil || !regexp.MustCompile(`(?m)^   └─ model gocode-lora@1 [0-9a-f]{12} \(imported, derived\)\n      └─ federated task `+id+`: 2 rounds`).MatchString(out) {
		t.Errorf("model lineage gocode: %v\n%s", err, out)
	}
}

// TestModelImportParentServer: the server records a parent only if it is
// registered and the model keeps its tensors, and the CLI says which hash
// is which.
func TestModelImportParentServer(t *testing.T) {
	h := servertest.New(t)
	base, err := train.InitLM(train.LMConfig{Vocab: 16, Context: 4, Dim: 8, Layers: 1}, 1)
	if err != nil {
		t.Fatal(err)
	}
	parent := h.ImportModel(t, "gocode", base)
	dir := t.TempDir()
	write := func(name string, m *model.Model) string {
		t.Helper()
		var buf bytes.Buffer
		if err := model.WriteSafetensors(&buf, m); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, buf.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	lora, err := train.AddLoRA(base, 2, []string{"mlp.fc"}, 3)
	if err != nil {
		t.Fatal(err)
	}
	loraFile := write("lora.safetensors", lora)
	stdout, stderr, err := runAll(t, []cli.Option{cli.WithTerminal(false)}, "", "--server", h.GRPCAddr(), "--ca", server.CAFile(h.Dir),
		"--token-file", server.AdminTokenPath(h.Dir), "model", "import", loraFile, "--name", "gocode-lora", "--parent", "gocode")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	version := strings.TrimSpace(stdout)
	res, err := h.Models.GetModel(t.Context(), &pb.GetModelRequest{Version: version})
	if err != nil || res.GetModel().GetRef().GetParentVersion() != parent {
		t.Fatalf("imported model %v, %v; want parent %s", res.GetModel(), err, parent)
	}
	b, _ := os.ReadFile(loraFile)
	for _, s := range []string{"imported " + loraFile + " as gocode-lora@1, derived from " + parent,
		"  version      " + version + "  the server's name for it",
		"  file sha256  " + digest(b) + "  of the file's bytes",
		"  content hash " + lora.HashHex() + "  of tensor names, shapes and values (and a seq: layer list) alone"} {
		if !strings.Contains(stderr, s) {
			t.Errorf("stderr lacks %q:\n%s", s, stderr)
		}
	}
	if digest(b) == version {
		t.Error("the test needs a file whose sha256 is not its version")
	}

	// A model of another architecture is not derived from it.
	other, err := train.InitLM(train.LMConfig{Vocab: 16, Context: 4, Dim: 16, Layers: 1}, 1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = runServer(t, h, "model", "import", write("other.safetensors", other), "--name", "x", "--parent", "gocode")
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "in its parent "+parent) ||
		!strings.Contains(err.Error(), "import it without --parent") {
		t.Errorf("another architecture: %v", err)
	}
	fewer := &model.Model{Tensors: base.Tensors[1:]}
	_, err = runServer(t, h, "model", "import", write("fewer.safetensors", fewer), "--name", "x", "--parent", "gocode")
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "has no tensor "+base.Tensors[0].Name) {
		t.Errorf("a tensor missing: %v", err)
	}
	// Merging the adapters back keeps the link.
	merged, err := train.MergeLoRA(lora)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := runServer(t, h, "model", "import", write("merged.safetensors", merged), "--name", "merged", "--parent", "gocode-lora"); err != nil {
		t.Errorf("merged model with the LoRA model as parent: %v", err)
	}
	// The server refuses a parent it does not hold, whatever the CLI sends.
	var buf bytes.Buffer
	if err := model.WriteSafetensors(&buf, base); err != nil {
		t.Fatal(err)
	}
	_, err = client.ImportModel(t.Context(), h.Models, &pb.ImportModelHeader{Name: "orphan", ParentVersion: strings.Repeat("ab", 32),
		SizeBytes: uint64(buf.Len())}, &buf)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "is not in the registry") {
		t.Errorf("unknown parent: %v", err)
	}
	if _, err := runServer(t, h, "model", "import", loraFile, "--name", "y", "--parent", "nope"); !errors.Is(err, cli.ErrUnknownModel) {
		t.Errorf("--parent nope: %v", err)
	}
}
