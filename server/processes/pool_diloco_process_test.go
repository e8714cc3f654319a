package processes_test

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model/train"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// The DiLoCo comparison: 3 islands of one rank, H = 50, against the same
// job synchronised at every step (3 ranks averaging their parameters after
// each step), on the same shards, seeds and inner optimizer.
const (
	dilocoSteps   = 2000
	dilocoInner   = 50
	dilocoDataset = "mnist-train:0:6000"
)

func dilocoCommon(id string) []string {
	return []string{"--id", id, "--cpu", "1", "--memory", fmt.Sprint(rankMemory), "--arch", "mlp:784,32,10",
		"--dataset", dilocoDataset, "--steps", fmt.Sprint(dilocoSteps), "--seed", "7", "--init-seed", "3",
		"--lr", "0.05", "--batch", "32", "--max-restarts", "3", "--output-model", "base"}
}

// dilocoFlags are the DiLoCo flags of the comparison. The outer step is
// lr 1 with momentum 0.5: with SGD inner steps on this MLP the paper's 0.7
// and 0.9 (tuned for AdamW inner steps on language models) end 7% above
// per-step sync (docs/POOL.md has the sweep).
func dilocoFlags(more ...string) []string {
	return append([]string{"--islands", "3", "--inner-steps", fmt.Sprint(dilocoInner), "--outer-lr", "1", "--outer-momentum", "0.5"}, more...)
}

// heldOutLoss is the model's mean cross-entropy on the first 2000 MNIST
// test images, which no job trains on.
func (pc *poolCluster) heldOutLoss(version string) float64 {
	pc.t.Helper()
	dir, err := data.MNISTDir()
	if err != nil {
		pc.t.Fatal(err)
	}
	_, test, err := data.LoadMNIST(dir)
	if err != nil {
		pc.t.Fatal(err)
	}
	idx := make([]int, 2000)
	for i := range idx {
		idx[i] = i
	}
	met, err := train.Evaluate(pc.export(version), test.Subset(idx), 500)
	if err != nil {
		pc.t.Fatal(err)
	}
	return met.Loss
}

// TestPoolDiLoCo: DiLoCo with 3 islands and H = 50 moves at least 40×
// fewer synchronisation bytes through the server than per-step
// synchronisation of the same run, and ends within 3% of its held-out
// loss. Mid-run, island 2's rank is killed: an outer step completes with
// the quorum of islands 0 and 1, and the island, restarted, rejoins at the
// outer step then open.
func TestPoolDiLoCo(t *testing.T) {
	pc := newPoolCluster(t)
	byName := map[string]*poolWorker{}
	for _, n := range []string{"w1", "w2", "w3"} {
		byName[n] = pc.startWorker(n)
	}

	pc.submit(append(dilocoCommon("sync"), "--ranks", "3", "--checkpoint-every", "500", "--sync-every", "1")...)
	sync := pc.waitEnd("sync")
	if sync.GetState() != pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED {
		t.Fatalf("per-step job %v: %s", sync.GetState(), sync.GetStateReason())
	}

	pc.submit(append(dilocoCommon("dl"), dilocoFlags("--quorum", "2")...)...)
	var j *pb.PoolJob
	pc.waitFor("DiLoCo outer step 2", func() bool {
		j = pc.get("dl")
		return j.GetDiloco().GetOuterStep() >= 2 || terminal(j.GetState())
	})
	if terminal(j.GetState()) {
		t.Fatalf("the DiLoCo job ended (%v: %s) before an island could be removed", j.GetState(), j.GetStateReason())
	}
	victim := pc.get("dl-i2")
	if len(victim.GetPlacement()) != 1 {
		t.Fatalf("island 2 is placed on %v", placedOn(victim))
	}
	// By name: a worker that missed heartbeats on a busy machine registers
	// again under a new id.
	var w *poolWorker
	for _, wk := range pc.workers() {
		if wk.GetId() == victim.GetPlacement()[0].GetWorker() {
			w = byName[wk.GetName()]
		}
	}
	if w == nil {
		t.Fatalf("island 2 is placed on worker %s, which is none of %v", victim.GetPlacement()[0].GetWorker(), pc.workers())
	}
	w.p.kill9()
	t.Logf("kill -9 %s, island 2's worker, at outer step %d", w.name, j.GetDiloco().GetOuterStep())
	// Once the server declares the worker lost, the open outer step stops
	// waiting for island 2; the island waits for a worker, which is
	// started only after an outer step went on without it.
	pc.waitFor("an outer step without island 2", func() bool {
		j = pc.get("dl")
		return slices.Equal(j.GetDiloco().GetLastIslands(), []uint32{0, 1}) || terminal(j.GetState())
	})
	if terminal(j.GetState()) {
		t.Fatalf("the DiLoCo job ended (%v: %s) without an outer step of islands 0 and 1 alone", j.GetState(), j.GetStateReason())
	}
	pc.startWorker("w4")

	j = pc.waitEnd("dl")
	if j.GetState() != pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED || j.GetOutputVersion() == "" {
		t.Fatalf("DiLoCo job %v (%s), model %q", j.GetState(), j.GetStateReason(), j.GetOutputVersion())
	}
	if got := j.GetDiloco().GetOuterStep(); got != dilocoSteps/dilocoInner {
		t.Fatalf("outer steps %d, want %d", got, dilocoSteps/dilocoInner)
	}

	// The job's log has a line per outer step naming its islands.
	without, rejoined := int64(-1), int64(-1)
	for _, l := range pc.logs("dl") {
		var step, of int64
		if _, err := fmt.Sscanf(l.GetText(), "outer step %d of %d:", &step, &of); err != nil {
			continue
		}
		switch {
		case strings.Contains(l.GetText(), "islands [0 1], without [2]") && without < 0:
			without = step
		case strings.Contains(l.GetText(), "islands [0 1 2]") && without >= 0 && rejoined < 0:
			rejoined = step
		}
	}
	if without < 0 || rejoined < 0 {
		t.Fatalf("no outer step without island 2 (%d) followed by one with it again (%d):\n%v", without, rejoined, pc.logs("dl"))
	}
	i2 := pc.get("dl-i2")
	if i2.GetAttempt() < 2 || i2.GetRestarts() < 1 || i2.GetState() != pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED {
		t.Fatalf("island 2: attempt %d, %d restarts, %v (%s)", i2.GetAttempt(), i2.GetRestarts(), i2.GetState(), i2.GetStateReason())
	}
	joined := int64(-1)
	for _, l := range pc.logs("dl-i2") {
		if l.GetAttempt() < 2 {
			continue
		}
		if _, after, ok := strings.Cut(l.GetText(), "joining at outer step "); ok {
			joined, _ = strconv.ParseInt(strings.Fields(after)[0], 10, 64)
			break
		}
	}
	// Outer step n is logged when it is taken, so the island joining
	// while step k is open is first counted in the line of step k+1.
	if joined < 0 || rejoined != joined+1 {
		t.Fatalf("island 2 rejoined at outer step %d but is first counted again in outer step %d", joined, rejoined)
	}
	t.Logf("outer step %d completed with islands 0 and 1; island 2 rejoined at outer step %d", without, joined)

	perStep := sync.GetSyncBytesReceived() + sync.GetSyncBytesSent()
	dl := j.GetSyncBytesReceived() + j.GetSyncBytesSent()
	ratio := float64(perStep) / float64(dl)
	syncLoss, dlLoss := pc.heldOutLoss(sync.GetOutputVersion()), pc.heldOutLoss(j.GetOutputVersion())
	t.Logf("per-step sync: %d bytes, held-out loss %.4f; DiLoCo H=%d: %d bytes (%.1f× fewer), held-out loss %.4f (%+.2f%%)",
		perStep, syncLoss, dilocoInner, dl, ratio, dlLoss, 100*(dlLoss-syncLoss)/syncLoss)
	if ratio < 40 {
		t.Errorf("DiLoCo moved %d bytes, per-step sync %d: %.1f× fewer, want at least 40×", dl, perStep, ratio)
	}
	if math.IsNaN(dlLoss) || dlLoss > 1.03*syncLoss {
		t.Errorf("DiLoCo held-out loss %.4f is more than 3%% above per-step sync's %.4f", dlLoss, syncLoss)
	}
	if os.Getenv("FLEETLEARN_DILOCO_INT8") == "" {
		return
	}
	pc.submit(append(dilocoCommon("dl8"), dilocoFlags("--int8")...)...)
	j8 := pc.waitEnd("dl8")
	b8 := j8.GetSyncBytesReceived() + j8.GetSyncBytesSent()
	t.Logf("DiLoCo int8: %d bytes (%.1f× fewer than per-step), held-out loss %.4f", b8, float64(perStep)/float64(b8), pc.heldOutLoss(j8.GetOutputVersion()))
}
