package poolsvc

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

func TestCheckpointGCKeepsCommittedAndOneOlder(t *testing.T) {
	e := newEnv(t, nil)
	ws, ls := startGang(t, e, "j", 1)
	w := ws[0]
	r := ref(w, ls[0])
	var ids []string
	for step := int64(10); step <= 40; step += 10 {
		res, err := w.commit(r, "j", step, float32(step))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.GetId())
	}
	list, err := w.c.ListRankCheckpoints(w.ctx, &pb.ListRankCheckpointsRequest{Ref: r})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(list.GetIds(), ",")
	if len(list.GetIds()) != 2 || !strings.Contains(got, ids[3]) || !strings.Contains(got, ids[2]) {
		t.Fatalf("kept %v, want the checkpoints of steps 40 and 30 (%s, %s)", list.GetIds(), ids[3], ids[2])
	}
	cks, err := e.st.PoolCheckpoints(t.Context(), "j")
	if err != nil || len(cks) != 2 {
		t.Fatalf("recorded checkpoints %v %v", cks, err)
	}
}

func TestJobStorageCap(t *testing.T) {
	e := newEnv(t, func(d *Deps) { d.MaxJobStorageBytes = 1 << 10 })
	ws, ls := startGang(t, e, "j", 1)
	w := ws[0]
	big := make([]float32, 512) // 2 KiB of parameters
	_, err := w.commit(ref(w, ls[0]), "j", 10, big...)
	wantCode(t, "checkpoint over the job's storage cap", err, codes.ResourceExhausted)
}

func TestThenTaskFailureKeepsJobSucceeded(t *testing.T) {
	e := newEnv(t, nil)
	e.taskErr = errors.New("module not registered")
	sp := spec("pre", 1)
	sp.TotalSteps = 10
	e.submit(sp, &pb.Task{Name: "fine-tune", Module: &pb.ModuleRef{Sha256: strings.Repeat("ab", 32)}})
	ws, _ := startGangExisting(t, e, "pre")
	w := ws[0]
	l := e.leases("pre")[0].l
	if _, err := w.commit(ref(w, l), "pre", 10, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := w.c.RankExited(w.ctx, &pb.RankExitedRequest{WorkerId: w.id, JobId: "pre", Attempt: 1, Completed: true}); err != nil {
		t.Fatal(err)
	}
	j := e.job("pre")
	if j.GetState() != succeeded || j.GetThenTaskId() != "" || !strings.Contains(j.GetStateReason(), "then_task not created: module not registered") {
		t.Fatalf("job %v: %s", j.GetState(), j.GetStateReason())
	}
}

// startGangExisting registers one worker for an already submitted 1-rank
// job and takes its lease.
func startGangExisting(t *testing.T, e *env, job string) ([]*worker, []*pb.RankLease) {
	t.Helper()
	w := e.register("worker-a", oneRank)
	res, err := w.heartbeat()
	if err != nil || len(res.GetStart()) != 1 || res.GetStart()[0].GetJobId() != job {
		t.Fatalf("%v %v", res, err)
	}
	return []*worker{w}, res.GetStart()
}
