package server_test

import (
	"bufio"

	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/train"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/examples/embedded"
)

// goCorpus is the federated code-completion setup at test scale: windows
// of the Go standard library's source, the public packages pooled for
// pretraining, and devices that are private packages, each with its own
// held-out tail.
type goCorpus struct {
	public  *data.Dataset
	devices []*data.Dataset
	heldOut *data.Dataset
}

func loadGoCorpus(t *testing.T, window, devices, perDevice int) goCorpus {
	t.Helper()
	src := filepath.Join(runtime.GOROOT(), "src")
	if _, err := os.Stat(filepath.Join(src, "fmt")); err != nil {
		t.Skipf("no Go source tree at %s: %v", src, err)
	}
	pkgs, err := data.GoSource(src, data.GoSourceOptions{MaxPackages: 120, MaxPackageBytes: 24 << 10})
	if err != nil {
		t.Fatal(err)
	}
	var c goCorpus
	var pub, held []*data.Dataset
	for _, p := range pkgs {
		s, err := data.SplitGoPackage(p, data.WindowOptions{Window: window, Stride: window})
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case s.Public:
			pub = append(pub, s.Train, s.HeldOut)
		case len(c.devices) < devices && s.Train.Len() >= perDevice && s.HeldOut.Len() > 0:
			idx := make([]int, perDevice)
			for i := range idx {
				idx[i] = i
			}
			c.devices = append(c.devices, s.Train.Subset(idx))
			held = append(held, s.HeldOut)
		}
	}
	if len(c.devices) < devices || len(pub) == 0 {
		t.Skipf("the Go source tree has %d usable private packages and %d public ones", len(c.devices), len(pub)/2)
	}
	if c.public, err = data.ConcatDatasets(pub...); err != nil {
		t.Fatal(err)
	}
	if c.heldOut, err = data.ConcatDatasets(held...); err != nil {
		t.Fatal(err)
	}
	return c
}

// reportBytes reads the server's count of report bytes taken off NATS.
func reportBytes(t *testing.T, h *servertest.Harness) float64 {
	t.Helper()
	resp, err := http.Get("http://" + h.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "fleetlearn_report_bytes_total "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatal("no fleetlearn_report_bytes_total in /metrics")
	return 0
}

// TestLanguageModelFineTuning: a transformer pretrained on the public
// packages is fine-tuned by a fleet of private packages through real
// rounds, fully and with LoRA adapters (only the adapters trainable, so only
// they travel). Both lower the held-out loss of the private packages below
// the base; LoRA sends at least 10 times fewer bytes over NATS. The figures
// are logged for docs/BENCHMARKS.md.
func TestLanguageModelFineTuning(t *testing.T) {
	if testing.Short() {
		t.Skip("pretrains and fine-tunes a transformer: tens of seconds")
	}
	const window, devices = 32, 4
	c := loadGoCorpus(t, window, devices, 96)
	base, err := train.InitLM(train.LMConfig{Vocab: data.VocabSize, Context: window, Dim: 64, Layers: 2}, 1)
	if err != nil {
		t.Fatal(err)
	}
	pre := []byte(`{"epochs": 1, "batch_size": 16, "learning_rate": 0.003, "max_steps": 150}`)
	if base, _, err = train.TrainLM(base, c.public, pre, 1, nil); err != nil {
		t.Fatal(err)
	}
	baseMet, err := train.EvaluateLM(base, c.heldOut, nil)
	if err != nil {
		t.Fatal(err)
	}
	lora, err := train.AddLoRA(base, 4, []string{"attn.q", "attn.v", "mlp.fc"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	evalDir := filepath.Join(t.TempDir(), "heldout")
	if err := data.WriteDir(evalDir, c.heldOut, "go-heldout"); err != nil {
		t.Fatal(err)
	}

	h := servertest.New(t)
	mod, err := embedded.Lookup("lm")
	if err != nil {
		t.Fatal(err)
	}
	code, err := mod.Code()
	if err != nil {
		t.Fatal(err)
	}
	module := h.RegisterModule(t, "lm", code)
	startFleet(t, h, devices, func(i int) *data.Dataset { return c.devices[i] }, edge.WithSandbox(sharedSandbox(t)))

	const rounds = 3
	run := func(name string, m *model.Model, lr string, trainable []string) (loss float64, bytes float64) {
		version := h.ImportModel(t, name, m)
		task := baseTask(name, version, module, rounds)
		task.Hyperparameters = []byte(`{"epochs": 1, "batch_size": 16, "learning_rate": ` + lr + `}`)
		task.CohortTarget, task.OverSelection, task.ReportGoal = devices, 0, devices
		task.ServerEvalDataset = evalDir
		task.Trainable = trainable
		task.ReportTimeout = nil
		before := reportBytes(t, h)
		created := h.CreateTask(t, task)
		done := h.WaitTask(t, created.Id, 10*time.Minute, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
		if done.State != pb.TaskState_TASK_STATE_COMPLETED {
			t.Fatalf("%s: %v: %s", name, done.State, done.StateReason)
		}
		var last map[string]float64
		for _, r := range h.Rounds(t, created.Id) {
			if r.State == pb.RoundState_ROUND_STATE_COMMITTED {
				last = r.Metrics.GetValues()
				t.Logf("%s round %d: %d reports, held-out loss %.4f, accuracy %.4f", name, r.Round, r.Reported,
					last["server_loss"], last["server_accuracy"])
			}
		}
		sent := reportBytes(t, h) - before
		return last["server_loss"], sent / float64(rounds*devices)
	}
	fullLoss, fullBytes := run("gocode-full", base, "0.001", nil)
	loraLoss, loraBytes := run("gocode-lora", lora, "0.003", []string{"lora"})
	t.Logf("held-out loss: base %.4f, full fine-tuning %.4f, LoRA r=4 %.4f; bytes per report on NATS: full %.0f, LoRA %.0f (%.1fx fewer)",
		baseMet.Loss, fullLoss, loraLoss, fullBytes, loraBytes, fullBytes/loraBytes)
	switch {
	case !(fullLoss < baseMet.Loss):
		t.Errorf("full fine-tuning held-out loss %.4f, base %.4f", fullLoss, baseMet.Loss)
	case !(loraLoss < baseMet.Loss):
		t.Errorf("LoRA held-out loss %.4f, base %.4f", loraLoss, baseMet.Loss)
	case fullBytes/loraBytes < 10:
		t.Errorf("LoRA reports are only %.1fx smaller", fullBytes/loraBytes)
	}
}

// TestTrainableTaskRefusals: partial fine-tuning needs a module that can
// be told what to freeze, and a list that names tensors the model has.
func TestTrainableTaskRefusals(t *testing.T) {
	h := servertest.New(t)
	m, err := train.InitLM(train.LMConfig{Vocab: data.VocabSize, Context: 8, Dim: 8, Layers: 1}, 1)
	if err != nil {
		t.Fatal(err)
	}
	version := h.ImportModel(t, "tiny-lm", m)
	code := func(name string) []byte {
		mod, err := embedded.Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		b, err := mod.Code()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	lmModule, softmax := h.RegisterModule(t, "lm", code("lm")), h.RegisterModule(t, "softmax", code("softmax"))
	for _, tc := range []struct {
		module    string
		trainable []string
		want      string
	}{
		{softmax, []string{"lm_head.weight"}, "needs a module of ABI 2 or later"},
		{lmModule, []string{"blocks.1.*"}, `"blocks.1.*" matches no tensor`},
		{lmModule, []string{"lora"}, "no LoRA adapter in the base model"},
		{lmModule, []string{"[x"}, "not a valid pattern"},
	} {
		task := baseTask("partial", version, tc.module, 1)
		task.Trainable = tc.trainable
		_, err := h.Tasks.CreateTask(t.Context(), &pb.CreateTaskRequest{Task: task})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("trainable %v: %v, want InvalidArgument containing %q", tc.trainable, err, tc.want)
		}
	}
	task := baseTask("partial", version, lmModule, 1)
	task.Trainable = []string{"blocks.0.*", "lm_head.weight"}
	if _, err := h.Tasks.CreateTask(t.Context(), &pb.CreateTaskRequest{Task: task}); err != nil {
		t.Fatalf("a valid partial task: %v", err)
	}
}
