package poolsvc

import (
	"bytes"
	"crypto/rand"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
)

// leaseOf takes the one lease a worker's next heartbeat carries.
func leaseOf(t *testing.T, w *worker) *pb.RankLease {
	t.Helper()
	res, err := w.heartbeat()
	if err != nil || len(res.GetStart()) != 1 {
		t.Fatalf("worker %s: %v %v", w.id, res, err)
	}
	return res.GetStart()[0]
}

// encode is the canonical encoding of a manifest the test builds.
func encode(t *testing.T, m *checkpoint.Manifest) []byte {
	t.Helper()
	b, _, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCheckpointForgeryRefused: a pool worker holding a lease of one job
// tries to write another job's checkpoints (through its own worker, as
// the victim's worker, and by naming the victim in its own manifest) and
// commits manifests that lie about their blobs. Each is refused, and the
// victim job ends with the honest worker's checkpoint as its model.
func TestCheckpointForgeryRefused(t *testing.T) {
	e := newEnv(t, nil)
	e.submit(spec("victim", 1), nil)
	honest := e.register("gpu-node-1", oneRank)
	vl := leaseOf(t, honest)
	e.submit(spec("mine", 1), nil)
	mallory := e.register("mallory", oneRank)
	ml := leaseOf(t, mallory)
	mine := ref(mallory, ml)

	// Another job's rank, through the attacker's own worker.
	victimRank := &pb.RankRef{WorkerId: mallory.id, JobId: "victim", Attempt: 1, Rank: 0}
	_, err := mallory.commit(victimRank, "victim", 10, 6, 6)
	wantCode(t, "commit to a rank of a job the worker holds no lease of", err, codes.FailedPrecondition)
	blob := []byte{1, 2, 3, 4}
	_, err = mallory.c.PutCheckpointBlob(mallory.ctx, &pb.PutCheckpointBlobRequest{Ref: victimRank, Digest: checkpoint.Sum(blob).String(), Data: blob})
	wantCode(t, "blob for a rank of another job", err, codes.FailedPrecondition)
	_, err = mallory.c.GetCheckpointBlob(mallory.ctx, &pb.GetCheckpointBlobRequest{Ref: victimRank, Digest: checkpoint.Sum(blob).String()})
	wantCode(t, "read of another job's blob", err, codes.FailedPrecondition)
	// ... as the victim's worker.
	asHonest := &worker{e: e, ctx: mallory.ctx, c: mallory.c, id: honest.id}
	_, err = asHonest.commit(ref(honest, vl), "victim", 10, 6, 6)
	wantCode(t, "commit as the victim's worker", err, codes.PermissionDenied)
	// ... by naming the victim in a manifest on its own lease.
	_, err = mallory.commit(mine, "victim", 10, 6, 6)
	wantCode(t, "manifest of another job", err, codes.InvalidArgument)

	// Manifests that lie. A blob the store never got:
	never := &checkpoint.Manifest{Format: 1, Job: "mine", Step: 10, Params: []checkpoint.TensorEntry{
		{Name: "w", Shape: []int{2}, Chunks: []checkpoint.Chunk{{Digest: checkpoint.Sum([]byte("never sent")), Size: 8}}}}}
	_, err = mallory.c.CommitCheckpoint(mallory.ctx, &pb.CommitCheckpointRequest{Ref: mine, Manifest: encode(t, never)})
	wantCode(t, "manifest naming a blob never put", err, codes.FailedPrecondition)
	// A size other than the blob's: 8 bytes put, 16 claimed for a
	// tensor of 4.
	eight := make([]byte, 8)
	if _, err := mallory.c.PutCheckpointBlob(mallory.ctx, &pb.PutCheckpointBlobRequest{Ref: mine, Digest: checkpoint.Sum(eight).String(), Data: eight}); err != nil {
		t.Fatal(err)
	}
	bigger := &checkpoint.Manifest{Format: 1, Job: "mine", Step: 10, Params: []checkpoint.TensorEntry{
		{Name: "w", Shape: []int{4}, Chunks: []checkpoint.Chunk{{Digest: checkpoint.Sum(eight), Size: 16}}}}}
	_, err = mallory.c.CommitCheckpoint(mallory.ctx, &pb.CommitCheckpointRequest{Ref: mine, Manifest: encode(t, bigger)})
	wantCode(t, "manifest claiming a blob bigger than it is", err, codes.FailedPrecondition)
	// A shape its chunks do not fill.
	honestShape := encode(t, &checkpoint.Manifest{Format: 1, Job: "mine", Step: 10, Params: []checkpoint.TensorEntry{
		{Name: "w", Shape: []int{2}, Chunks: []checkpoint.Chunk{{Digest: checkpoint.Sum(eight), Size: 8}}}}})
	shapeLie := bytes.Replace(honestShape, []byte(`"shape":[2]`), []byte(`"shape":[3]`), 1)
	_, err = mallory.c.CommitCheckpoint(mallory.ctx, &pb.CommitCheckpointRequest{Ref: mine, Manifest: shapeLie})
	wantCode(t, "manifest whose shape its chunks do not fill", err, codes.InvalidArgument)

	// The victim is untouched: the honest worker's checkpoint is its model.
	res, err := honest.commit(ref(honest, vl), "victim", 100, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := honest.c.RankExited(honest.ctx, &pb.RankExitedRequest{WorkerId: honest.id, JobId: "victim", Attempt: 1, Completed: true}); err != nil {
		t.Fatal(err)
	}
	if j := e.job("victim"); j.GetState() != succeeded || j.GetCheckpoint() != res.GetId() {
		t.Fatalf("victim job %v with checkpoint %s, want succeeded with %s", j.GetState(), j.GetCheckpoint(), res.GetId())
	}
	// The attacker's honest manifest on its own lease still commits.
	if _, err := mallory.c.CommitCheckpoint(mallory.ctx, &pb.CommitCheckpointRequest{Ref: mine, Manifest: honestShape}); err != nil {
		t.Fatalf("a true manifest on the worker's own lease: %v", err)
	}
}

// builtinSpec is a built-in job of ranks ranks on a 2-1 MLP: a model of
// 3 parameters, so its checkpoints are a few bytes.
func builtinSpec(id string, ranks uint32) *pb.PoolJobSpec {
	sp := spec(id, ranks)
	sp.Program = &pb.PoolJobSpec_Builtin{Builtin: &pb.PoolBuiltinTrainer{Arch: []uint32{2, 1}, BatchSize: 4, LearningRate: 0.1,
		SyncEvery: 10, Dataset: &pb.PoolDataset{Source: "mnist-train"}}}
	return sp
}

// TestCheckpointStorageBounded: a worker holding one rank of a two-rank
// job uploads blobs no manifest names, far beyond what the job's 3-
// parameter model admits, and commits a checkpoint at every boundary
// ahead of the other rank. Both stop at their bounds with
// ResourceExhausted; the honest rank of the same job commits within its
// own share, and the job moves on once it has.
func TestCheckpointStorageBounded(t *testing.T) {
	m := metrics.New()
	e := newEnv(t, func(d *Deps) { d.Metrics = m })
	e.submit(builtinSpec("shared", 2), nil)
	mallory := e.register("mallory", oneRank)
	honest := e.register("gpu-node-1", oneRank)
	ml, hl := leaseOf(t, mallory), leaseOf(t, honest)
	mine, theirs := ref(mallory, ml), ref(honest, hl)

	// Storage: distinct 4 MiB blobs until refused. The cap is the
	// model's checkpoints and room for manifests, not the 32 GiB a rank's
	// share of the server's cap per job would be.
	var err error
	puts := 0
	for puts = 0; puts < 64; puts++ {
		data := make([]byte, MaxBlobBytes)
		_, _ = rand.Read(data)
		_, err = mallory.c.PutCheckpointBlob(mallory.ctx, &pb.PutCheckpointBlobRequest{Ref: mine, Digest: checkpoint.Sum(data).String(), Data: data})
		if err != nil {
			break
		}
	}
	wantCode(t, "blobs past the model's checkpoints", err, codes.ResourceExhausted)
	if puts != checkpointSlack/MaxBlobBytes || !strings.Contains(err.Error(), "what one rank of a 3-parameter model keeps") {
		t.Fatalf("refused after %d blobs of 4 MiB: %v", puts, err)
	}
	if n := refusals(t, m, metrics.PoolRefusedCheckpointBytes); n != 1 {
		t.Errorf("storage refusals counted %v, want 1", n)
	}

	// Checkpoints ahead: the attacker's rank commits every boundary.
	for step := int64(10); step <= 40; step += 10 {
		if _, err := mallory.commit(mine, "shared", step, 1, 2, 3); err != nil {
			t.Fatalf("commit at step %d: %v", step, err)
		}
	}
	_, err = mallory.commit(mine, "shared", 50, 1, 2, 3)
	wantCode(t, "a fifth checkpoint past the job's committed step", err, codes.ResourceExhausted)
	if err != nil && !strings.Contains(err.Error(), "holds 4 checkpoints past the job's committed step 0") {
		t.Errorf("refusal %v", err)
	}
	_, err = mallory.commit(mine, "shared", 90, 1, 2, 3)
	wantCode(t, "a checkpoint far past the job's committed step", err, codes.ResourceExhausted)
	if n := refusals(t, m, metrics.PoolRefusedCheckpointsAhead); n != 2 {
		t.Errorf("ahead refusals counted %v, want 2", n)
	}
	// The honest rank commits in its own share, and the job moves on.
	if _, err := honest.commit(theirs, "shared", 10, 1, 2, 3); err != nil {
		t.Fatalf("the honest rank's commit: %v", err)
	}
	if j := e.job("shared"); j.GetCommittedStep() != 10 {
		t.Fatalf("committed step %d, want 10", j.GetCommittedStep())
	}
	if _, err := mallory.commit(mine, "shared", 50, 1, 2, 3); err != nil {
		t.Fatalf("once the job committed 10, the rank holds 3 ahead: %v", err)
	}
	list, err := mallory.c.ListRankCheckpoints(mallory.ctx, &pb.ListRankCheckpointsRequest{Ref: mine})
	if err != nil || len(list.GetIds()) > MaxCheckpointsAhead+1 {
		t.Fatalf("the rank's store holds %v (%v), want at most the committed step and %d ahead", list.GetIds(), err, MaxCheckpointsAhead)
	}
}

// TestManifestsCountAgainstTheCap: a manifest is stored too, so it counts.
// Without that, manifests of up to 16 MiB each, one per boundary, would
// be storage outside every cap.
func TestManifestsCountAgainstTheCap(t *testing.T) {
	e := newEnv(t, func(d *Deps) { d.MaxJobStorageBytes = 64 })
	ws, ls := startGang(t, e, "j", 1)
	w := ws[0]
	_, err := w.commit(ref(w, ls[0]), "j", 10, 1, 2) // an 8-byte blob, a manifest of some 250
	wantCode(t, "a manifest over the rank's cap", err, codes.ResourceExhausted)
	if err != nil && !strings.Contains(err.Error(), "commit checkpoint: rank 0 of job j holds 8 bytes") {
		t.Errorf("refusal %v", err)
	}
}

// TestStaleCheckpointsDoNotBlockANewAttempt: a rank's holder commits four
// checkpoints far ahead, then vanishes. The next attempt's honest holder
// of that rank must still commit the next boundary: the count of
// checkpoints ahead is the running attempt's.
func TestStaleCheckpointsDoNotBlockANewAttempt(t *testing.T) {
	e := newEnv(t, nil)
	e.submit(builtinSpec("g", 2), nil)
	mallory := e.register("mallory", oneRank)
	honest := e.register("gpu-node-1", oneRank)
	ml, hl := leaseOf(t, mallory), leaseOf(t, honest)
	for step := int64(60); step <= 90; step += 10 {
		if _, err := mallory.commit(ref(mallory, ml), "g", step, 1, 2, 3); err != nil {
			t.Fatal(err)
		}
	}
	// Mallory falls silent; the honest worker's calls carry the clock
	// past the loss timeout.
	for range DefaultHeartbeatsToLoss {
		honest.beat(&pb.RankStatus{JobId: "g", Attempt: 1, Rank: hl.GetRank(), Step: 5})
	}
	if j := e.job("g"); j.GetState() != queued || j.GetRestarts() != 1 {
		t.Fatalf("job after the loss: %v (%s)", j.GetState(), j.GetStateReason())
	}
	second := e.register("gpu-node-2", oneRank)
	ls := map[*worker]*pb.RankLease{}
	for _, w := range []*worker{honest, second} {
		for ls[w] == nil {
			res, err := w.heartbeat()
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range res.GetStart() {
				ls[w] = l
			}
		}
	}
	for w, l := range ls {
		if _, err := w.commit(ref(w, l), "g", 10, 1, 2, 3); err != nil {
			t.Fatalf("attempt %d rank %d at step 10: %v", l.GetAttempt(), l.GetRank(), err)
		}
	}
	if j := e.job("g"); j.GetCommittedStep() != 10 || j.GetAttempt() != 2 {
		t.Fatalf("job %v at committed step %d, attempt %d", j.GetState(), j.GetCommittedStep(), j.GetAttempt())
	}
}
