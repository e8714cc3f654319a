package processes_test

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/train"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// TestPoolPretrainLM pretrains a language model through the pool as an
// operator would: data gosrc writes the standard library's public windows,
// model init and model import register a tiny transformer, and a 2-rank
// job starts from it, on real server and worker processes. One worker is
// killed mid-run; the job resumes from its committed checkpoint, AdamW's
// moments included, and ends bitwise equal to the same job run without a
// kill. The held-out loss (windows of other packages) drops.
func TestPoolPretrainLM(t *testing.T) {
	pc := newPoolCluster(t)
	root := t.TempDir()
	runCLI(t, pc.cli, "", "data", "gosrc", "--out", root, "--goroot", goroot(), "--window", "16", "--stride", "16", "--max-devices", "1")
	public, err := data.ReadDir(filepath.Join(root, "public"))
	if err != nil {
		t.Fatal(err)
	}
	const train0, trainN, heldN = 0, 600, 400
	if public.Len() < trainN+heldN {
		t.Skipf("the public Go source set has %d windows, want %d", public.Len(), trainN+heldN)
	}
	held := public.Subset(seqRange(public.Len()-heldN, heldN))

	initPath := filepath.Join(t.TempDir(), "lm.safetensors")
	runCLI(t, pc.cli, "", "model", "init", "--arch", "lm:d=16,layers=1,context=16", "--seed", "3", "-o", initPath)
	initVersion := runCLI(t, pc.cli, pc.grpcAddr, "model", "import", initPath, "--name", "golm-init")

	workers := map[string]*poolWorker{}
	for _, n := range []string{"w1", "w2", "w3"} {
		w := pc.startWorker(n, "--data-root", root)
		workers[w.id] = w
	}
	const steps, every = 300, 20
	spec := func(id string) []string {
		return []string{"--id", id, "--ranks", "2", "--cpu", "1", "--memory", fmt.Sprint(rankMemory),
			"--init-model", "golm-init", "--dataset", fmt.Sprintf("dir:public:%d:%d", train0, trainN),
			"--steps", fmt.Sprint(steps), "--checkpoint-every", fmt.Sprint(every), "--sync-every", "10",
			"--seed", "7", "--batch", "8", "--lr", "0.003", "--output-model", "golm"}
	}
	pc.submit(spec("golm-killed")...)
	var j *pb.PoolJob
	pc.waitFor("the job's checkpoint at step 40", func() bool {
		j = pc.get("golm-killed")
		return j.GetCommittedStep() >= 40 || terminal(j.GetState())
	})
	if j.GetCommittedStep() >= steps || terminal(j.GetState()) || len(j.GetPlacement()) != 2 {
		t.Fatalf("the job ran to %v at step %d on %v before a worker could be killed", j.GetState(), j.GetCommittedStep(), placedOn(j))
	}
	victim := workers[j.GetPlacement()[1].GetWorker()]
	if victim == nil {
		t.Fatalf("placement names unknown worker %s", j.GetPlacement()[1].GetWorker())
	}
	victim.p.kill9()
	t.Logf("kill -9 %s at committed step %d", victim.name, j.GetCommittedStep())
	j = pc.waitEnd("golm-killed")
	if j.GetState() != pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED || j.GetAttempt() != 2 || j.GetOutputVersion() == "" {
		t.Fatalf("killed job %v (%s) attempt %d, model %q", j.GetState(), j.GetStateReason(), j.GetAttempt(), j.GetOutputVersion())
	}
	// Every rank says what it trains; the killed worker's rank may have
	// died before its worker shipped that line (logs go up in batches), so
	// attempt 1 counts only the survivor's.
	kinds, resumed := map[uint32]int{}, 0
	for _, l := range pc.logs("golm-killed") {
		if strings.Contains(l.GetText(), "language model, AdamW") {
			kinds[l.GetAttempt()]++
		}
		if l.GetAttempt() == 2 && strings.Contains(l.GetText(), "resuming from the checkpoint at step ") {
			resumed++
		}
	}
	if kinds[1] < 1 || kinds[2] != 2 || resumed != 2 {
		t.Fatalf("rank starts that say they train a language model with AdamW: %d of attempt 1 (want 1 or 2), %d of attempt 2 (want 2); %d of attempt 2 resumed (want 2)",
			kinds[1], kinds[2], resumed)
	}

	pc.submit(spec("golm-straight")...)
	s := pc.waitEnd("golm-straight")
	if s.GetState() != pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED || s.GetAttempt() != 1 {
		t.Fatalf("uninterrupted job %v (%s) attempt %d", s.GetState(), s.GetStateReason(), s.GetAttempt())
	}
	a, b := pc.export(j.GetOutputVersion()), pc.export(s.GetOutputVersion())
	if !train.IsLM(a) || a.Layout().Size() != b.Layout().Size() || !a.Layout().Equal(b.Layout()) {
		t.Fatalf("the job's models are not the same language model: %d and %d tensors", len(a.Tensors), len(b.Tensors))
	}
	va, vb := a.Flatten(), b.Flatten()
	for i := range va {
		if math.Float32bits(va[i]) != math.Float32bits(vb[i]) {
			t.Fatalf("parameter %d: resumed %v, uninterrupted %v", i, va[i], vb[i])
		}
	}

	res, err := apiv1.NewModelServiceClient(pc.conn).GetModel(context.Background(), &pb.GetModelRequest{Version: j.GetOutputVersion()})
	if err != nil {
		t.Fatal(err)
	}
	got := res.GetModel()
	if got.GetSource() != pb.ModelSource_MODEL_SOURCE_POOL || got.GetLineage().GetJobId() != "golm-killed" || got.GetLineage().GetSteps() != steps {
		t.Fatalf("model %s: source %v, lineage %v", j.GetOutputVersion(), got.GetSource(), got.GetLineage())
	}

	before := lmLoss(t, pc.export(initVersion), held)
	after := lmLoss(t, a, held)
	t.Logf("held-out loss on %d windows of other packages: %.4f before, %.4f after %d steps of 2 ranks (ln 98 = %.4f)",
		heldN, before, after, steps, math.Log(98))
	if !(after < before-0.5) {
		t.Fatalf("held-out loss %.4f from %.4f, want a drop of at least 0.5", after, before)
	}
}

func lmLoss(t *testing.T, m *model.Model, d *data.Dataset) float64 {
	t.Helper()
	met, err := train.EvaluateLM(m, d, nil)
	if err != nil {
		t.Fatal(err)
	}
	return met.Loss
}

func seqRange(first, n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = first + i
	}
	return idx
}
