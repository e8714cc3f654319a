package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

func roundNumbers(rows []*store.RoundRow) []uint64 {
	var out []uint64
	for _, r := range rows {
		out = append(out, r.Round)
	}
	return out
}

// Every field OpenRound writes reads back, rounds page by number within
// their task, and a round number is opened once.
func TestOpenRoundAndRounds(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, target := open(t)
		for _, id := range []string{"t", "u"} {
			if err := s.InsertTask(ctx, &pb.Task{Id: id, Name: "n", Model: &pb.ModelRef{Version: "m0"}}, now); err != nil {
				t.Fatal(err)
			}
		}
		var opened []*store.RoundRow
		for n := uint64(1); n <= 3; n++ {
			r := &store.RoundRow{TaskID: "t", Round: n, Kind: pb.RoundKind_ROUND_KIND_EVALUATE, Seed: 1<<63 + n, BaseModel: fmt.Sprintf("m%d", n-1),
				Open: now.Add(time.Duration(n) * time.Minute), Deadline: now.Add(time.Duration(n)*time.Minute + 30*time.Second)}
			if n != 2 {
				r.Kind = pb.RoundKind_ROUND_KIND_TRAIN
			}
			if err := s.OpenRound(ctx, r, now.Add(time.Duration(n)*time.Minute)); err != nil {
				t.Fatal(err)
			}
			opened = append(opened, r)
		}
		if err := s.OpenRound(ctx, &store.RoundRow{TaskID: "u", Round: 1, BaseModel: "m0", Open: now, Deadline: now}, now); err != nil {
			t.Fatal(err)
		}
		dup := *opened[1]
		dup.Seed = 5
		if err := s.OpenRound(ctx, &dup, now.Add(time.Hour)); err == nil {
			t.Fatal("round t/2 opened twice")
		}
		// The refused open left the task's current round and time alone.
		task, err := s.Task(ctx, "t")
		if err != nil || task.CurrentRound != 3 || !task.Updated.Equal(now.Add(3*time.Minute)) {
			t.Fatalf("task after opening 3 rounds: round %d updated %v, %v", task.CurrentRound, task.Updated, err)
		}

		check := func(s *store.Store) {
			t.Helper()
			for _, want := range opened {
				got, err := s.Round(ctx, "t", want.Round)
				if err != nil {
					t.Fatal(err)
				}
				if got.Kind != want.Kind || got.Seed != want.Seed || got.BaseModel != want.BaseModel || !got.Open.Equal(want.Open) ||
					!got.Deadline.Equal(want.Deadline) || got.State != pb.RoundState_ROUND_STATE_OPEN || !got.Close.IsZero() ||
					got.Model != "" || got.Metrics != nil || got.Failures != nil {
					t.Errorf("round %d: %+v, want %+v open", want.Round, got, want)
				}
			}
			page, err := s.Rounds(ctx, "t", 0, 2)
			if err != nil || !reflect.DeepEqual(roundNumbers(page), []uint64{1, 2}) {
				t.Fatalf("first page %v, %v", roundNumbers(page), err)
			}
			page, err = s.Rounds(ctx, "t", page[1].Round, 2)
			if err != nil || !reflect.DeepEqual(roundNumbers(page), []uint64{3}) || page[0].Seed != opened[2].Seed {
				t.Fatalf("second page %v, %v", roundNumbers(page), err)
			}
			if page, err = s.Rounds(ctx, "t", 3, 2); err != nil || len(page) != 0 {
				t.Fatalf("past the last round %v, %v", roundNumbers(page), err)
			}
			if page, err = s.Rounds(ctx, "u", 0, 10); err != nil || !reflect.DeepEqual(roundNumbers(page), []uint64{1}) {
				t.Fatalf("rounds of u %v, %v", roundNumbers(page), err)
			}
		}
		check(s)
		if _, err := s.Round(ctx, "t", 4); !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("round never opened: %v", err)
		}
		if _, err := s.Round(ctx, "nope", 1); !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("round of an unknown task: %v", err)
		}
		s.Close()
		s2, err := store.Open(ctx, target)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		check(s2)
	})
}

// A committed close writes the round, the new model, the task's progress
// and the participations at once; a second close of the round is refused
// and changes none of it.
func TestCloseRound(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, target := open(t)
		if p, err := s.Participations(ctx, "t"); err != nil || p == nil || len(p) != 0 {
			t.Fatalf("participations of an unknown task %v (nil %v), %v", p, p == nil, err)
		}
		r := openRound(t, s, "t", "d-1", "d-2", "d-3")
		closeTime := now.Add(45 * time.Second)
		r.State, r.Close, r.Assigned, r.Reported, r.Dropped = pb.RoundState_ROUND_STATE_COMMITTED, closeTime, 3, 2, 1
		r.Metrics, r.Model, r.Reason, r.Epsilon = map[string]float64{"train_loss": 0.25, "examples": 20}, "m1", "", 0.75
		r.Failures = map[string]string{"d-3": "timeout"}
		r.Participants = []string{"d-1", "d-2"}
		r.NoiseState, r.ClipNorm = []byte("noise after step 1"), 0.75
		m1 := &store.ModelRow{Version: "m1", Name: "n", Parent: "m0", TaskID: "t", Round: 1, Source: pb.ModelSource_MODEL_SOURCE_FEDERATED,
			Tensors: 4, Params: 1000, Size: 4096, Created: closeTime}
		if err := s.CloseRound(ctx, r, m1, []byte("opt-1"), closeTime); err != nil {
			t.Fatal(err)
		}
		// A retried close, or a close with another outcome, is refused whole.
		again := *r
		again.Model, again.Participants = "m1b", []string{"d-1", "d-2", "d-3"}
		m1b := &store.ModelRow{Version: "m1b", Name: "n", Parent: "m0", TaskID: "t", Round: 1, Created: closeTime}
		if err := s.CloseRound(ctx, &again, m1b, []byte("opt-x"), closeTime.Add(time.Minute)); !errors.Is(err, store.ErrRoundClosed) {
			t.Fatalf("second close: %v", err)
		}
		never := &store.RoundRow{TaskID: "t", Round: 9, State: pb.RoundState_ROUND_STATE_ABANDONED}
		if err := s.CloseRound(ctx, never, nil, nil, now); !errors.Is(err, store.ErrRoundClosed) {
			t.Fatalf("close of a round never opened: %v", err)
		}

		// Round 2 commits with d-1 again, round 3 is abandoned short.
		r2 := &store.RoundRow{TaskID: "t", Round: 2, Kind: pb.RoundKind_ROUND_KIND_TRAIN, BaseModel: "m1", Open: closeTime, Deadline: closeTime.Add(time.Minute)}
		if err := s.OpenRound(ctx, r2, closeTime); err != nil {
			t.Fatal(err)
		}
		r2.State, r2.Close, r2.Model, r2.Participants = pb.RoundState_ROUND_STATE_COMMITTED, closeTime.Add(time.Minute), "m2", []string{"d-1", "d-4"}
		m2 := &store.ModelRow{Version: "m2", Name: "n", Parent: "m1", TaskID: "t", Round: 2, Source: pb.ModelSource_MODEL_SOURCE_FEDERATED, Created: r2.Close}
		if err := s.CloseRound(ctx, r2, m2, []byte("opt-2"), r2.Close); err != nil {
			t.Fatal(err)
		}
		r3 := &store.RoundRow{TaskID: "t", Round: 3, Kind: pb.RoundKind_ROUND_KIND_TRAIN, BaseModel: "m2", Open: r2.Close, Deadline: r2.Close}
		if err := s.OpenRound(ctx, r3, r2.Close); err != nil {
			t.Fatal(err)
		}
		r3.State, r3.Close, r3.Reason, r3.Short = pb.RoundState_ROUND_STATE_ABANDONED, r2.Close.Add(time.Minute), "too few devices", true
		if err := s.CloseRound(ctx, r3, nil, nil, r3.Close); err != nil {
			t.Fatal(err)
		}

		check := func(s *store.Store) {
			t.Helper()
			task, err := s.Task(ctx, "t")
			if err != nil || task.CurrentModel != "m2" || task.TrainRounds != 2 || string(task.OptState) != "opt-2" ||
				task.CurrentRound != 3 || task.ShortRounds != 1 || !task.Updated.Equal(r2.Close) {
				t.Fatalf("task %+v, %v", task, err)
			}
			got, err := s.Round(ctx, "t", 1)
			if err != nil || got.State != r.State || !got.Close.Equal(closeTime) || got.Assigned != 3 || got.Reported != 2 ||
				got.Dropped != 1 || !maps.Equal(got.Metrics, r.Metrics) || got.Model != "m1" || got.Epsilon != 0.75 ||
				!maps.Equal(got.Failures, r.Failures) {
				t.Fatalf("round 1 %+v, %v", got, err)
			}
			if got, err := s.Round(ctx, "t", 3); err != nil || got.State != pb.RoundState_ROUND_STATE_ABANDONED || got.Reason != "too few devices" || got.Model != "" {
				t.Fatalf("round 3 %+v, %v", got, err)
			}
			for _, want := range []*store.ModelRow{m1, m2} {
				if got, err := s.Model(ctx, want.Version); err != nil || !reflect.DeepEqual(got, want) {
					t.Fatalf("model %s: %+v, %v; want %+v", want.Version, got, err, want)
				}
			}
			if _, err := s.Model(ctx, "m1b"); !errors.Is(err, backend.ErrNotFound) {
				t.Fatalf("the refused close's model was stored: %v", err)
			}
			p, err := s.Participations(ctx, "t")
			if want := map[string]store.Participation{"d-1": {2, 2}, "d-2": {1, 1}, "d-4": {1, 2}}; err != nil || !maps.Equal(p, want) {
				t.Fatalf("participations %v, %v; want %v", p, err, want)
			}
			// Round 2 carried no noise state, round 3 was abandoned: the
			// task's is still round 1's.
			if ns, err := s.NoiseState(ctx, "t"); err != nil || string(ns) != "noise after step 1" {
				t.Fatalf("noise state %q, %v", ns, err)
			}
			if c, err := s.ClipNorm(ctx, "t"); err != nil || c != 0.75 {
				t.Fatalf("clip norm %v, %v; want round 1's 0.75", c, err)
			}
			if a, err := s.Assignments(ctx, "t", 1); err != nil || len(a) != 0 {
				t.Fatalf("assignments of a closed round %v, %v", a, err)
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
		if p, err := s2.Participations(ctx, "other"); err != nil || len(p) != 0 {
			t.Fatalf("participations of another task %v, %v", p, err)
		}
	})
}

// A task's DP secret is the first one stored: a second replica's, or a
// restarted server's, fresh secret does not replace it.
func TestDPSecret(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, _ := open(t)
		openRound(t, s, "t", "d-1")
		first := bytes.Repeat([]byte{1}, 32)
		if got, err := s.DPSecret(ctx, "t", first); err != nil || !bytes.Equal(got, first) {
			t.Fatalf("first secret %x, %v", got, err)
		}
		if got, err := s.DPSecret(ctx, "t", bytes.Repeat([]byte{2}, 32)); err != nil || !bytes.Equal(got, first) {
			t.Fatalf("second call: %x, %v; want the first secret", got, err)
		}
		if _, err := s.DPSecret(ctx, "no-such-task", first); !errors.Is(err, backend.ErrNotFound) {
			t.Fatalf("unknown task: %v", err)
		}
		if ns, err := s.NoiseState(ctx, "t"); err != nil || ns != nil {
			t.Fatalf("noise state before any commit %q, %v", ns, err)
		}
		if c, err := s.ClipNorm(ctx, "t"); err != nil || c != 0 {
			t.Fatalf("clip norm before any commit %v, %v", c, err)
		}
		if _, err := s.ClipNorm(ctx, "no-such-task"); !errors.Is(err, backend.ErrNotFound) {
			t.Fatalf("clip norm of an unknown task: %v", err)
		}
	})
}

// A prepared close reads back as written, is replaced by a later prepare,
// survives a reopen, and goes when dropped or when the round closes.
func TestPendingClose(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, target := open(t)
		r := openRound(t, s, "t", "d-1", "d-2")
		if p, err := s.Pending(ctx, "t", 1); err != nil || p != nil {
			t.Fatalf("nothing prepared: %+v, %v", p, err)
		}
		row := *r
		row.State, row.Close, row.Assigned, row.Reported, row.Dropped = pb.RoundState_ROUND_STATE_COMMITTED, now.Add(time.Minute), 2, 1, 1
		row.Metrics, row.Model, row.Epsilon = map[string]float64{"train_loss": 1.5}, "m1", 0.5
		row.Failures, row.Participants, row.Seed = map[string]string{"d-2": "crashed"}, []string{"d-1"}, 1<<63+1
		model := &store.ModelRow{Version: "m1", Name: "n", Description: "round 1", Parent: "m0", TaskID: "t", Round: 1,
			Source: pb.ModelSource_MODEL_SOURCE_FEDERATED, Tensors: 3, Params: 30, Size: 300, Created: now.Add(time.Minute),
			Lineage: &pb.PoolLineage{JobId: "j", SpecDigest: "sd", DataSha256: "ds", Checkpoint: "cp", Steps: 40,
				Usage: &pb.PoolUsage{CpuSeconds: 1.5, Meter: "rapl"}}}
		first := &store.PendingClose{Row: &row, Model: model, OptState: []byte{0, 1, 2, 255}}
		if err := s.PrepareClose(ctx, first); err != nil {
			t.Fatal(err)
		}
		checkPending(t, s, "t", 1, first)
		if p, err := s.Pending(ctx, "t", 2); err != nil || p != nil {
			t.Fatalf("another round's prepared close: %+v, %v", p, err)
		}

		// Prepared again (the coordinator retried with another outcome):
		// the later one stays, without a model.
		abandoned := *r
		abandoned.State, abandoned.Reason = pb.RoundState_ROUND_STATE_ABANDONED, "deadline"
		second := &store.PendingClose{Row: &abandoned}
		if err := s.PrepareClose(ctx, second); err != nil {
			t.Fatal(err)
		}
		checkPending(t, s, "t", 1, second)
		s.Close()
		s, err := store.Open(ctx, target)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		checkPending(t, s, "t", 1, second)

		if err := s.DropPending(ctx, "t", 1); err != nil {
			t.Fatal(err)
		}
		if p, err := s.Pending(ctx, "t", 1); err != nil || p != nil {
			t.Fatalf("dropped close still there: %+v, %v", p, err)
		}
		if err := s.DropPending(ctx, "t", 1); err != nil {
			t.Fatalf("dropping twice: %v", err)
		}

		// Committing the round forgets its prepared close in the same step.
		if err := s.PrepareClose(ctx, first); err != nil {
			t.Fatal(err)
		}
		if err := s.CloseRound(ctx, &row, model, first.OptState, now); err != nil {
			t.Fatal(err)
		}
		if p, err := s.Pending(ctx, "t", 1); err != nil || p != nil {
			t.Fatalf("prepared close of a committed round: %+v, %v", p, err)
		}
		if m, err := s.Model(ctx, "m1"); err != nil || !proto.Equal(m.Lineage, model.Lineage) {
			t.Fatalf("committed model %+v, %v", m, err)
		}
	})
}

func checkPending(t *testing.T, s *store.Store, task string, round uint64, want *store.PendingClose) {
	t.Helper()
	got, err := s.Pending(context.Background(), task, round)
	if err != nil || got == nil {
		t.Fatalf("pending %s/%d: %+v, %v", task, round, got, err)
	}
	if !reflect.DeepEqual(got.Row, want.Row) {
		t.Errorf("pending row %+v, want %+v", got.Row, want.Row)
	}
	if !slices.Equal(got.OptState, want.OptState) {
		t.Errorf("pending optimizer state %v, want %v", got.OptState, want.OptState)
	}
	if (got.Model == nil) != (want.Model == nil) {
		t.Fatalf("pending model %+v, want %+v", got.Model, want.Model)
	}
	if want.Model != nil {
		gm, wm := *got.Model, *want.Model
		if !proto.Equal(gm.Lineage, wm.Lineage) {
			t.Errorf("pending model lineage %v, want %v", gm.Lineage, wm.Lineage)
		}
		gm.Lineage, wm.Lineage = nil, nil
		if !reflect.DeepEqual(gm, wm) {
			t.Errorf("pending model %+v, want %+v", gm, wm)
		}
	}
}

// Server metrics merge into a closed round's; a round that does not exist
// is not found.
func TestUpdateRoundMetrics(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, target := open(t)
		r := openRound(t, s, "t", "d-1")
		r.State = pb.RoundState_ROUND_STATE_COMMITTED // without metrics
		if err := s.CloseRound(ctx, r, nil, nil, now); err != nil {
			t.Fatal(err)
		}
		if err := s.UpdateRoundMetrics(ctx, "t", 1, map[string]float64{"server_accuracy": 0.5, "server_loss": 2}); err != nil {
			t.Fatal(err)
		}
		if err := s.UpdateRoundMetrics(ctx, "t", 1, map[string]float64{"server_accuracy": 0.75}); err != nil {
			t.Fatal(err)
		}
		s.Close()
		s2, err := store.Open(ctx, target)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		got, err := s2.Round(ctx, "t", 1)
		if want := map[string]float64{"server_accuracy": 0.75, "server_loss": 2}; err != nil || !maps.Equal(got.Metrics, want) {
			t.Fatalf("metrics %v, %v; want %v", got.Metrics, err, want)
		}
		if err := s2.UpdateRoundMetrics(ctx, "t", 2, map[string]float64{"x": 1}); !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("metrics of a missing round: %v", err)
		}
	})
}

// Assignments reads back each seat with its participant number and the
// examples the device claimed at check-in; a seat taken again keeps both.
func TestAssignments(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, target := open(t)
		openRound(t, s, "t")
		for _, c := range []struct {
			device   string
			examples uint64
		}{{"d-c", 30}, {"d-a", 0}, {"d-b", ^uint64(0)}} {
			if _, fresh, err := s.Assign(ctx, "t", 1, c.device, c.examples, now); err != nil || !fresh {
				t.Fatalf("assign %s: fresh %v, %v", c.device, fresh, err)
			}
		}
		// The huge claim is clipped to what the column holds on both backends.
		want := map[string]store.Assignment{"d-c": {1, 30}, "d-a": {2, 0}, "d-b": {3, 1 << 62}}
		if p, fresh, err := s.Assign(ctx, "t", 1, "d-c", 99, now.Add(time.Second)); err != nil || fresh || p != 1 {
			t.Fatalf("assign d-c again: %d fresh %v, %v", p, fresh, err)
		}
		if a, err := s.Assignments(ctx, "t", 2); err != nil || len(a) != 0 {
			t.Fatalf("another round's cohort %v, %v", a, err)
		}
		if _, _, err := s.Assign(ctx, "u", 1, "d-a", 1, now); err != nil {
			t.Fatal(err)
		}
		// An open round's cohort survives a restart: the resumed round
		// gives each device its seat again.
		s.Close()
		s2, err := store.Open(ctx, target)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		if a, err := s2.Assignments(ctx, "t", 1); err != nil || !maps.Equal(a, want) {
			t.Fatalf("cohort %v, %v; want %v", a, err, want)
		}
		if p, fresh, err := s2.Assign(ctx, "t", 1, "d-b", 5, now); err != nil || fresh || p != 3 {
			t.Fatalf("resumed seat of d-b: %d fresh %v, %v", p, fresh, err)
		}
		if p, fresh, err := s2.Assign(ctx, "t", 1, "d-d", 5, now); err != nil || !fresh || p != 4 {
			t.Fatalf("new seat after reopen: %d fresh %v, %v", p, fresh, err)
		}
		if a, err := s2.Assignments(ctx, "u", 1); err != nil || !maps.Equal(a, map[string]store.Assignment{"d-a": {1, 1}}) {
			t.Fatalf("cohort of u: %v, %v", a, err)
		}
	})
}

// Devices checking in at once each get a seat of their own: participants
// 1..n, none twice, no error, and a device that checks in twice at once
// gets one seat. On PostgreSQL the seats race for the same count, and the
// unique index with Assign's retries sorts them out.
func TestAssignConcurrent(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, _ := open(t)
		openRound(t, s, "t")
		const devices = 40
		type seat struct {
			device string
			p      uint32
			fresh  bool
			err    error
		}
		seats := make(chan seat, 2*devices)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range 2 * devices {
			d := fmt.Sprintf("d-%02d", i%devices)
			wg.Go(func() {
				<-start
				p, fresh, err := s.Assign(ctx, "t", 1, d, uint64(i), now)
				seats <- seat{d, p, fresh, err}
			})
		}
		close(start)
		wg.Wait()
		close(seats)
		byDevice := map[string]uint32{}
		freshSeats := map[string]int{}
		for st := range seats {
			if st.err != nil {
				t.Errorf("assign %s: %v", st.device, st.err)
				continue
			}
			if p, ok := byDevice[st.device]; ok && p != st.p {
				t.Errorf("%s got seats %d and %d", st.device, p, st.p)
			}
			byDevice[st.device] = st.p
			if st.fresh {
				freshSeats[st.device]++
			}
		}
		taken := map[uint32]string{}
		for d, p := range byDevice {
			if other, ok := taken[p]; ok {
				t.Errorf("participant %d given to %s and %s", p, other, d)
			}
			taken[p] = d
			if p < 1 || p > devices {
				t.Errorf("%s has participant %d, want 1..%d", d, p, devices)
			}
			if freshSeats[d] != 1 {
				t.Errorf("%s newly seated %d times, want once", d, freshSeats[d])
			}
		}
		if len(byDevice) != devices {
			t.Fatalf("%d devices seated, want %d", len(byDevice), devices)
		}
		a, err := s.Assignments(ctx, "t", 1)
		if err != nil || len(a) != devices {
			t.Fatalf("cohort of %d, %v", len(a), err)
		}
		for d, as := range a {
			if as.Participant != byDevice[d] {
				t.Errorf("%s: stored participant %d, Assign said %d", d, as.Participant, byDevice[d])
			}
		}
	})
}
