package store_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// poolJob is a job as the pool service stores it, with a command program
// (a oneof), a placement and usage, so that a round trip covers nested and
// repeated fields.
func poolJob(id string, st pb.PoolJobState, submitted time.Time) *pb.PoolJob {
	return &pb.PoolJob{
		Spec: &pb.PoolJobSpec{Id: id, Tenant: "team-a", Priority: 3, Ranks: 2, MaxRestarts: 4, CheckpointInterval: 50,
			TotalSteps: 1000, OutputModel: "lm", PerRank: &pb.PoolResources{MilliCpu: 2000, MemoryBytes: 1 << 30, Gpus: 1},
			Deadline: timestamppb.New(submitted.Add(time.Hour)),
			Program:  &pb.PoolJobSpec_Command{Command: &pb.PoolCommand{Argv: []string{"train", "--lr=0.1"}, Env: map[string]string{"SEED": "7"}}}},
		SpecDigest: "d1g35t", State: st, StateReason: "submitted", Submitter: "alice",
		SubmitTime: timestamppb.New(submitted),
	}
}

func checkJob(t *testing.T, what string, got *store.PoolJobRow, want *pb.PoolJob, then *pb.Task) {
	t.Helper()
	if !proto.Equal(got.Job, want) {
		t.Errorf("%s: job %v, want %v", what, got.Job, want)
	}
	if (got.ThenTask == nil) != (then == nil) || !proto.Equal(got.ThenTask, then) {
		t.Errorf("%s: then task %v, want %v", what, got.ThenTask, then)
	}
}

func jobIDs(rows []*store.PoolJobRow) []string {
	var ids []string
	for _, r := range rows {
		ids = append(ids, r.Job.GetSpec().GetId())
	}
	return ids
}

func TestPoolJobs(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, target := open(t)
		then := &pb.Task{Id: "t-after", Name: "fine-tune", RoundsTotal: 5, Model: &pb.ModelRef{Version: "lm"}}
		jobs := map[string]*pb.PoolJob{}
		for i, c := range []struct {
			id string
			st pb.PoolJobState
		}{
			{"j1", pb.PoolJobState_POOL_JOB_STATE_QUEUED},
			{"j2", pb.PoolJobState_POOL_JOB_STATE_RUNNING},
			{"j3", pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED},
			{"j4", pb.PoolJobState_POOL_JOB_STATE_QUEUED},
		} {
			j := poolJob(c.id, c.st, now.Add(time.Duration(i)*time.Second))
			var tt *pb.Task
			if c.id == "j1" {
				tt = then
			}
			if err := s.InsertPoolJob(ctx, j, tt); err != nil {
				t.Fatal(err)
			}
			jobs[c.id] = j
		}
		if err := s.InsertPoolJob(ctx, poolJob("j2", pb.PoolJobState_POOL_JOB_STATE_QUEUED, now), nil); !errors.Is(err, backend.ErrExists) {
			t.Fatalf("a second job j2: %v", err)
		}
		// The refused insert left the first j2 as it was.
		j2, err := s.PoolJob(ctx, "j2")
		if err != nil {
			t.Fatal(err)
		}
		checkJob(t, "j2", j2, jobs["j2"], nil)
		j1, err := s.PoolJob(ctx, "j1")
		if err != nil {
			t.Fatal(err)
		}
		checkJob(t, "j1", j1, jobs["j1"], then)
		if j1.Seq >= j2.Seq {
			t.Errorf("seq of j1 %d, of j2 %d: want submission order", j1.Seq, j2.Seq)
		}
		if _, err := s.PoolJob(ctx, "nope"); !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("unknown job: %v", err)
		}

		// Newest first, paged by seq.
		page, err := s.PoolJobs(ctx, pb.PoolJobState_POOL_JOB_STATE_UNSPECIFIED, 0, 3)
		if err != nil || !reflect.DeepEqual(jobIDs(page), []string{"j4", "j3", "j2"}) {
			t.Fatalf("first page %v, %v", jobIDs(page), err)
		}
		page, err = s.PoolJobs(ctx, pb.PoolJobState_POOL_JOB_STATE_UNSPECIFIED, page[len(page)-1].Seq, 3)
		if err != nil || !reflect.DeepEqual(jobIDs(page), []string{"j1"}) {
			t.Fatalf("second page %v, %v", jobIDs(page), err)
		}
		checkJob(t, "j1 listed", page[0], jobs["j1"], then)
		if page, err = s.PoolJobs(ctx, pb.PoolJobState_POOL_JOB_STATE_UNSPECIFIED, page[0].Seq, 3); err != nil || len(page) != 0 {
			t.Fatalf("past the oldest %v, %v", jobIDs(page), err)
		}
		queued, err := s.PoolJobs(ctx, pb.PoolJobState_POOL_JOB_STATE_QUEUED, 0, 10)
		if err != nil || !reflect.DeepEqual(jobIDs(queued), []string{"j4", "j1"}) {
			t.Fatalf("queued %v, %v", jobIDs(queued), err)
		}
		active, err := s.ActivePoolJobs(ctx)
		if err != nil || !reflect.DeepEqual(jobIDs(active), []string{"j1", "j2", "j4"}) {
			t.Fatalf("active %v, %v", jobIDs(active), err)
		}

		// An update replaces the job and moves it between states.
		up := proto.CloneOf(jobs["j1"])
		up.State, up.StateReason, up.Step, up.CommittedStep, up.Checkpoint = pb.PoolJobState_POOL_JOB_STATE_FAILED, "rank 1 crashed", 120, 100, "c0ffee"
		up.StartTime, up.EndTime = timestamppb.New(now.Add(time.Minute)), timestamppb.New(now.Add(time.Hour))
		up.Placement = []*pb.PoolAssignment{{Worker: "w-a", FirstRank: 0, Ranks: 1}, {Worker: "w-b", FirstRank: 1, Ranks: 1}}
		up.Usage = &pb.PoolUsage{CpuSeconds: 12.5, GpuSeconds: 3.25, PeakMemoryBytes: 1 << 29, EnergyJoules: 4e3, Meter: "rapl"}
		up.Restarts = 2
		if err := s.UpdatePoolJob(ctx, up); err != nil {
			t.Fatal(err)
		}
		jobs["j1"] = up
		if err := s.UpdatePoolJob(ctx, poolJob("nope", pb.PoolJobState_POOL_JOB_STATE_RUNNING, now)); !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("update of an unknown job: %v", err)
		}
		if failed, err := s.PoolJobs(ctx, pb.PoolJobState_POOL_JOB_STATE_FAILED, 0, 10); err != nil || !reflect.DeepEqual(jobIDs(failed), []string{"j1"}) {
			t.Fatalf("failed %v, %v", jobIDs(failed), err)
		}
		if active, err := s.ActivePoolJobs(ctx); err != nil || !reflect.DeepEqual(jobIDs(active), []string{"j2", "j4"}) {
			t.Fatalf("active after j1 failed %v, %v", jobIDs(active), err)
		}

		// Jobs, their then-tasks and their order survive a reopen, and a
		// new job comes after them.
		s.Close()
		s2, err := store.Open(ctx, target)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		for id, want := range jobs {
			got, err := s2.PoolJob(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			var tt *pb.Task
			if id == "j1" {
				tt = then
			}
			checkJob(t, id+" after reopen", got, want, tt)
		}
		if err := s2.InsertPoolJob(ctx, poolJob("j5", pb.PoolJobState_POOL_JOB_STATE_QUEUED, now.Add(time.Hour)), nil); err != nil {
			t.Fatal(err)
		}
		if all, err := s2.PoolJobs(ctx, 0, 0, 10); err != nil || !reflect.DeepEqual(jobIDs(all), []string{"j5", "j4", "j3", "j2", "j1"}) {
			t.Fatalf("after reopen %v, %v", jobIDs(all), err)
		}
	})
}

func TestPoolCheckpoints(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, target := open(t)
		if cps, err := s.PoolCheckpoints(ctx, "j"); err != nil || len(cps) != 0 {
			t.Fatalf("a job without checkpoints: %v, %v", cps, err)
		}
		for _, c := range []struct {
			job      string
			rank     uint32
			step     int64
			manifest string
		}{
			{"j", 1, 100, "bb"},
			{"j", 0, 200, "cc"},
			{"j", 0, 100, "aa"},
			{"j", math.MaxUint32, 100, "dd"},
			{"k", 0, 100, "zz"},
			{"j", 0, 100, "aa2"}, // the same checkpoint committed again: the newer manifest stays
		} {
			if err := s.PutPoolCheckpoint(ctx, c.job, c.rank, c.step, c.manifest); err != nil {
				t.Fatal(err)
			}
		}
		want := []store.PoolCheckpointRow{{0, 100, "aa2"}, {0, 200, "cc"}, {1, 100, "bb"}, {math.MaxUint32, 100, "dd"}}
		if cps, err := s.PoolCheckpoints(ctx, "j"); err != nil || !reflect.DeepEqual(cps, want) {
			t.Fatalf("checkpoints %v, %v; want %v", cps, err, want)
		}
		if err := s.DeletePoolCheckpoint(ctx, "j", 0, 100); err != nil {
			t.Fatal(err)
		}
		// Deleting what is gone (GC running twice) is no error.
		if err := s.DeletePoolCheckpoint(ctx, "j", 0, 100); err != nil {
			t.Fatal(err)
		}
		want = want[1:]
		s.Close()
		s2, err := store.Open(ctx, target)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		if cps, err := s2.PoolCheckpoints(ctx, "j"); err != nil || !reflect.DeepEqual(cps, want) {
			t.Fatalf("checkpoints after reopen %v, %v; want %v", cps, err, want)
		}
		if cps, err := s2.PoolCheckpoints(ctx, "k"); err != nil || !reflect.DeepEqual(cps, []store.PoolCheckpointRow{{0, 100, "zz"}}) {
			t.Fatalf("another job's checkpoints %v, %v", cps, err)
		}
	})
}

func TestPoolWorkers(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, target := open(t)
		if ws, err := s.PoolWorkers(ctx); err != nil || len(ws) != 0 {
			t.Fatalf("no workers yet: %v, %v", ws, err)
		}
		worker := func(id, state string) *pb.PoolWorker {
			return &pb.PoolWorker{Id: id, Name: "host-" + id, Capacity: &pb.PoolResources{MilliCpu: 8000, MemoryBytes: 1 << 34, Gpus: 2},
				Free: &pb.PoolResources{MilliCpu: 4000, MemoryBytes: 1 << 33, Gpus: 1}, LastSeen: timestamppb.New(now),
				GpuModels: []string{"H100", "H100"}, State: state, Version: "1.2.3", Zone: "westus"}
		}
		b := store.PoolWorkerRow{Worker: worker("w-b", "ready"), Subject: "worker-b", TokenID: "tok-b"}
		a := store.PoolWorkerRow{Worker: worker("w-a", "ready"), Subject: "worker-a", TokenID: "tok-a"}
		for _, w := range []store.PoolWorkerRow{b, a} {
			if err := s.PutPoolWorker(ctx, w); err != nil {
				t.Fatal(err)
			}
		}
		// A put of a known worker replaces its record; the principal that
		// registered it stays bound to it (ids are fresh per registration,
		// and the service refuses calls from any other principal).
		a.Worker = worker("w-a", "lost")
		a.Worker.LastSeen = timestamppb.New(now.Add(time.Minute))
		if err := s.PutPoolWorker(ctx, store.PoolWorkerRow{Worker: a.Worker, Subject: "intruder", TokenID: "tok-x"}); err != nil {
			t.Fatal(err)
		}
		check := func(s *store.Store) {
			t.Helper()
			ws, err := s.PoolWorkers(ctx)
			if err != nil || len(ws) != 2 {
				t.Fatalf("workers %v, %v", ws, err)
			}
			for i, want := range []store.PoolWorkerRow{a, b} {
				got := ws[i]
				if got.Subject != want.Subject || got.TokenID != want.TokenID || !proto.Equal(got.Worker, want.Worker) {
					t.Errorf("worker %d: %s/%s %v, want %s/%s %v", i, got.Subject, got.TokenID, got.Worker, want.Subject, want.TokenID, want.Worker)
				}
			}
		}
		check(s)
		s.Close()
		s2, err := store.Open(ctx, target)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		check(s2)
	})
}

func logLines(n int, text string) []*pb.PoolLogLine {
	var out []*pb.PoolLogLine
	for i := range n {
		out = append(out, &pb.PoolLogLine{Attempt: 2, Rank: uint32(i % 2), Stream: "stdout", Text: fmt.Sprintf("%s %d", text, i),
			Time: timestamppb.New(now.Add(time.Duration(i) * time.Millisecond)), Seq: 999})
	}
	return out
}

// checkLog reads job's kept lines and compares their numbers and texts.
func checkLog(t *testing.T, s *store.Store, job string, after uint64, limit int, wantSeqs []uint64, wantTexts []string) {
	t.Helper()
	got, err := s.PoolLogs(context.Background(), job, after, limit)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	var texts []string
	for _, l := range got {
		seqs, texts = append(seqs, l.Seq), append(texts, l.Text)
		if l.Stream != "stdout" || l.Attempt != 2 || l.Time == nil {
			t.Errorf("line %d of %s: %v", l.Seq, job, l)
		}
	}
	if !reflect.DeepEqual(seqs, wantSeqs) || !reflect.DeepEqual(texts, wantTexts) {
		t.Fatalf("%s after %d (limit %d): seqs %v texts %q, want %v %q", job, after, limit, seqs, texts, wantSeqs, wantTexts)
	}
}

func TestPoolLogs(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, target := open(t)
		if last, err := s.AppendPoolLogs(ctx, "j", nil, 10); err != nil || last != 0 {
			t.Fatalf("nothing appended to an empty log: %d, %v", last, err)
		}
		checkLog(t, s, "j", 0, 10, nil, nil)
		in := logLines(3, "a")
		last, err := s.AppendPoolLogs(ctx, "j", in, 10)
		if err != nil || last != 3 {
			t.Fatalf("append: last %d, %v", last, err)
		}
		if in[0].Seq != 999 {
			t.Errorf("append renumbered the caller's line: seq %d", in[0].Seq)
		}
		if last, err := s.AppendPoolLogs(ctx, "k", logLines(2, "k"), 10); err != nil || last != 2 {
			t.Fatalf("another job's log numbers its own lines: last %d, %v", last, err)
		}
		checkLog(t, s, "j", 0, 2, []uint64{1, 2}, []string{"a 0", "a 1"})
		checkLog(t, s, "j", 2, 10, []uint64{3}, []string{"a 2"})
		checkLog(t, s, "j", 3, 10, nil, nil)

		// Past keep, the oldest lines go.
		if last, err = s.AppendPoolLogs(ctx, "j", logLines(4, "b"), 5); err != nil || last != 7 {
			t.Fatalf("append past keep: last %d, %v", last, err)
		}
		checkLog(t, s, "j", 0, 100, []uint64{3, 4, 5, 6, 7}, []string{"a 2", "b 0", "b 1", "b 2", "b 3"})
		// An empty append with a smaller keep trims.
		if last, err = s.AppendPoolLogs(ctx, "j", nil, 2); err != nil || last != 7 {
			t.Fatalf("trim: last %d, %v", last, err)
		}
		checkLog(t, s, "j", 0, 100, []uint64{6, 7}, []string{"b 2", "b 3"})
		checkLog(t, s, "k", 0, 100, []uint64{1, 2}, []string{"k 0", "k 1"})

		// Numbering goes on after a reopen.
		s.Close()
		s2, err := store.Open(ctx, target)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		if last, err = s2.AppendPoolLogs(ctx, "j", logLines(1, "c"), 10); err != nil || last != 8 {
			t.Fatalf("append after reopen: last %d, %v", last, err)
		}
		checkLog(t, s2, "j", 5, 100, []uint64{6, 7, 8}, []string{"b 2", "b 3", "c 0"})
	})
}

// Ranks append to one job's log at once: every line is kept, each with its
// own number, and none is lost to a writer that counted the same last line.
func TestPoolLogsConcurrent(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, _ := open(t)
		const writers, batches, per = 8, 4, 3
		var wg sync.WaitGroup
		errs := make(chan error, writers*batches)
		start := make(chan struct{})
		for w := range writers {
			wg.Go(func() {
				<-start
				for b := range batches {
					if _, err := s.AppendPoolLogs(ctx, "j", logLines(per, fmt.Sprintf("w%d b%d", w, b)), 1000); err != nil {
						errs <- err
					}
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		got, err := s.PoolLogs(ctx, "j", 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		texts := map[string]bool{}
		for i, l := range got {
			if l.Seq != uint64(i+1) {
				t.Fatalf("line %d has seq %d: want 1..n with no gap", i, l.Seq)
			}
			texts[l.Text] = true
		}
		if len(got) != writers*batches*per || len(texts) != len(got) {
			t.Fatalf("%d lines (%d distinct), want %d", len(got), len(texts), writers*batches*per)
		}
	})
}
