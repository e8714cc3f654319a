package store_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/sqldb"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// together runs fn(0..n-1) in n goroutines released at once and returns
// their errors.
func together(n int, fn func(i int) error) []error {
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			errs[i] = fn(i)
		})
	}
	close(start)
	wg.Wait()
	return errs
}

// Tasks run their rounds at once while operators change their states:
// every close counts (models, progress, participations of a device shared
// by all tasks), and every state change lands, since each write changes
// only its own columns.
func TestConcurrentClosesAndStates(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, _ := open(t)
		const tasks, rounds = 4, 5
		for i := range tasks {
			if err := s.InsertTask(ctx, &pb.Task{Id: fmt.Sprintf("t%d", i), Name: "n", State: pb.TaskState_TASK_STATE_RUNNING,
				Model: &pb.ModelRef{Version: "m0"}}, now); err != nil {
				t.Fatal(err)
			}
		}
		errs := together(2*tasks, func(i int) error {
			id := fmt.Sprintf("t%d", i/2)
			if i%2 == 1 { // the operator
				for n := range rounds {
					if err := s.SetTaskState(ctx, id, pb.TaskState_TASK_STATE_RUNNING, fmt.Sprintf("nudge %d", n), now); err != nil {
						return err
					}
				}
				return s.SetTaskState(ctx, id, pb.TaskState_TASK_STATE_STOPPED, "enough", now)
			}
			for n := uint64(1); n <= rounds; n++ {
				r := &store.RoundRow{TaskID: id, Round: n, Kind: pb.RoundKind_ROUND_KIND_TRAIN, BaseModel: fmt.Sprintf("%s-m%d", id, n-1),
					Open: now, Deadline: now.Add(time.Minute)}
				if err := s.OpenRound(ctx, r, now); err != nil {
					return err
				}
				for _, d := range []string{"d-shared", "d-" + id} {
					if _, _, err := s.Assign(ctx, id, n, d, 10, now); err != nil {
						return err
					}
				}
				version := fmt.Sprintf("%s-m%d", id, n)
				r.State, r.Close, r.Model, r.Assigned, r.Reported = pb.RoundState_ROUND_STATE_COMMITTED, now.Add(time.Second), version, 2, 2
				r.Participants = []string{"d-shared", "d-" + id}
				m := &store.ModelRow{Version: version, Name: "n", TaskID: id, Round: n, Source: pb.ModelSource_MODEL_SOURCE_FEDERATED, Created: now}
				if err := s.CloseRound(ctx, r, m, []byte(version), now); err != nil {
					return err
				}
			}
			return nil
		})
		for _, err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		for i := range tasks {
			id := fmt.Sprintf("t%d", i)
			last := fmt.Sprintf("%s-m%d", id, rounds)
			task, err := s.Task(ctx, id)
			if err != nil || task.State != pb.TaskState_TASK_STATE_STOPPED || task.Reason != "enough" || task.CurrentModel != last ||
				task.TrainRounds != rounds || task.CurrentRound != rounds || string(task.OptState) != last {
				t.Errorf("task %s: %+v, %v", id, task, err)
			}
			p, err := s.Participations(ctx, id)
			every := store.Participation{Rounds: rounds, LastStep: uint64(rounds)}
			if want := map[string]store.Participation{"d-shared": every, "d-" + id: every}; err != nil || !maps.Equal(p, want) {
				t.Errorf("participations of %s: %v, %v; want %v", id, p, err, want)
			}
			list, err := s.Rounds(ctx, id, 0, 100)
			if err != nil || len(list) != rounds {
				t.Fatalf("rounds of %s: %d, %v", id, len(list), err)
			}
			for _, r := range list {
				if r.State != pb.RoundState_ROUND_STATE_COMMITTED {
					t.Errorf("round %s/%d is %v", id, r.Round, r.State)
				}
			}
		}
	})
}

// Server-side evaluations of one round merge at once: no metric is lost to
// a writer that read the round before another wrote it.
func TestUpdateRoundMetricsConcurrent(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, _ := open(t)
		r := openRound(t, s, "t", "d-1")
		r.State, r.Metrics = pb.RoundState_ROUND_STATE_COMMITTED, map[string]float64{"train_loss": 1}
		if err := s.CloseRound(ctx, r, nil, nil, now); err != nil {
			t.Fatal(err)
		}
		const writers = 8
		for _, err := range together(writers, func(i int) error {
			return s.UpdateRoundMetrics(ctx, "t", 1, map[string]float64{fmt.Sprintf("server_m%d", i): float64(i)})
		}) {
			if err != nil {
				t.Error(err)
			}
		}
		got, err := s.Round(ctx, "t", 1)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]float64{"train_loss": 1}
		for i := range writers {
			want[fmt.Sprintf("server_m%d", i)] = float64(i)
		}
		if !maps.Equal(got.Metrics, want) {
			t.Fatalf("metrics %v, want %v", got.Metrics, want)
		}
	})
}

// An enrollment token presented many times at once is redeemed once; many
// tokens redeemed at once are all redeemed.
func TestClaimConcurrent(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, _ := open(t)
		u := s.UsedTokens(func() time.Time { return now }, time.Minute)
		const n = 16
		won := 0
		for _, err := range together(n, func(int) error { return u.Claim(ctx, "same", now.Add(time.Hour)) }) {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, identity.ErrTokenReused):
				t.Errorf("claim: %v", err)
			}
		}
		if won != 1 {
			t.Fatalf("one token redeemed %d times at once", won)
		}
		for _, err := range together(n, func(i int) error { return u.Claim(ctx, fmt.Sprintf("j%d", i), now.Add(time.Hour)) }) {
			if err != nil {
				t.Error(err)
			}
		}
		if got, err := u.Len(ctx); err != nil || got != n+1 {
			t.Fatalf("%d redemptions on record, %v; want %d", got, err, n+1)
		}
	})
}

// Importing the same version at once stores it once and tells all but one
// importer that it exists.
func TestInsertModelConcurrent(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, _ := open(t)
		const n = 8
		ok := 0
		for _, err := range together(n, func(i int) error {
			return s.InsertModel(ctx, &store.ModelRow{Version: "v", Name: fmt.Sprintf("importer-%d", i), Created: now})
		}) {
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, backend.ErrExists):
				t.Errorf("insert: %v", err)
			}
		}
		if ok != 1 {
			t.Fatalf("%d importers of one version were told they stored it", ok)
		}
		if all, _, err := s.Models(ctx, "", 0, 10); err != nil || len(all) != 1 {
			t.Fatalf("models %v, %v", all, err)
		}
	})
}

// Tx commits all of fn or, when fn fails, none of it; read-modify-write
// transactions at once lose no update (PostgreSQL runs them serializable
// and retries the ones that collide).
func TestTx(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, _ := open(t)
		see := func(tx *sqldb.Tx, id string, n int64) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO devices (id, first_seen, last_seen) VALUES (?, ?, ?)`, id, n, n)
			return err
		}
		if err := s.Tx(ctx, func(tx *sqldb.Tx) error {
			if err := see(tx, "a", 1); err != nil {
				return err
			}
			return see(tx, "b", 1)
		}); err != nil {
			t.Fatal(err)
		}
		boom := errors.New("boom")
		if err := s.Tx(ctx, func(tx *sqldb.Tx) error {
			if err := see(tx, "c", 1); err != nil {
				return err
			}
			return boom
		}); !errors.Is(err, boom) {
			t.Fatalf("failed transaction: %v", err)
		}
		if err := s.Tx(ctx, func(tx *sqldb.Tx) error { return see(tx, "a", 2) }); err == nil {
			t.Fatal("duplicate row committed")
		}
		if n, err := s.DeviceCount(ctx); err != nil || n != 2 {
			t.Fatalf("%d rows after one commit and two rollbacks, %v; want 2", n, err)
		}

		const writers, each = 4, 3
		for _, err := range together(writers, func(int) error {
			for range each {
				if err := s.Tx(ctx, func(tx *sqldb.Tx) error {
					var v int64
					if err := tx.QueryRowContext(ctx, `SELECT last_seen FROM devices WHERE id = 'a'`).Scan(&v); err != nil {
						return err
					}
					_, err := tx.ExecContext(ctx, `UPDATE devices SET last_seen = ? WHERE id = 'a'`, v+1)
					return err
				}); err != nil {
					return err
				}
			}
			return nil
		}) {
			if err != nil {
				t.Error(err)
			}
		}
		var v int64
		err := s.Tx(ctx, func(tx *sqldb.Tx) error {
			return tx.QueryRowContext(ctx, `SELECT last_seen FROM devices WHERE id = 'a'`).Scan(&v)
		})
		if err != nil || v != 1+writers*each {
			t.Fatalf("counter %d, %v; want %d", v, err, 1+writers*each)
		}
	})
}
