package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/devproto"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/train"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// The tests in this file put one hostile enrolled device — real
// credentials, real key, everything it sends signed — next to honest edge
// agents on a real server with security on (the servertest default:
// enrollment, NATS authorization, signed reports), and check that what the
// hostile device sends cannot impersonate, outweigh, poison or corrupt the
// honest devices' rounds.

// startAgent runs an enrolled edge agent from its data directory dir until
// the test ends.
func startAgent(t testing.TB, h *servertest.Harness, dir, id string, ds *data.Dataset, opts ...edge.Option) *edge.Agent {
	t.Helper()
	a, err := edge.New(edge.Config{NATSURL: h.NATSURL(), DataDir: dir, DeviceID: id},
		append([]edge.Option{edge.WithDataset(ds), edge.WithSandbox(sharedSandbox(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return a
}

// softmaxTask registers the softmax module and an 8×3 model and returns a
// task spec on them with the given seats: target reports, and room for
// seats devices in all. Aggregation is left unset, as the CLI leaves it.
func softmaxTask(t testing.TB, h *servertest.Harness, name string, rounds, target, seats uint32) (*pb.Task, string) {
	t.Helper()
	init, _ := train.InitMLP([]int{8, 3}, 1)
	version := h.ImportModel(t, name, init)
	code := wasmtest.Build(t, wasmtest.Softmax)
	module := h.RegisterModule(t, "softmax", code)
	warmModule(t, code)
	spec := baseTask(name, version, module, rounds)
	spec.CohortTarget, spec.ReportGoal = target, target
	// Over-selection is read as a fraction; this one gives exactly seats.
	spec.OverSelection = float64(seats-target) / float64(target)
	spec.SelectionTimeout, spec.ReportTimeout = durationpb.New(10*time.Second), durationpb.New(20*time.Second)
	return spec, version
}

// steppingModel is a 25-parameter model of L2 norm √55: the default update
// bound of a task on it is √55.
func steppingModel(t testing.TB) *model.Model {
	t.Helper()
	m, err := model.New(model.Tensor{Name: "w", Shape: []int{4, 5}, Data: make([]float32, 20)},
		model.Tensor{Name: "b", Shape: []int{5}, Data: []float32{1, 2, 3, 4, 5}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func l2(v []float32) float64 {
	var ss float64
	for _, x := range v {
		ss += float64(x) * float64(x)
	}
	return math.Sqrt(ss)
}

// joinWith checks in with ci until the device is in the cohort of round.
func joinWith(t testing.TB, d *scripted, ci *pb.CheckIn, round uint64) *pb.RoundPlan {
	t.Helper()
	for end := time.Now().Add(scriptedWait); ; time.Sleep(50 * time.Millisecond) {
		resp := d.checkIn(t, ci)
		if p := resp.GetPlan(); p != nil && p.Round >= round {
			if p.Round > round {
				t.Fatalf("%s: got the plan of round %d, wanted round %d", d.id, p.Round, round)
			}
			return p
		}
		if time.Now().After(end) {
			t.Fatalf("%s: not selected for round %d: %v", d.id, round, resp.GetRetryAfter())
		}
	}
}

// evalReport is a well-formed evaluation report for plan.
func evalReport(plan *pb.RoundPlan, device string, examples uint64, metrics map[string]float64) *pb.EvaluationReport {
	return &pb.EvaluationReport{TaskId: plan.TaskId, Round: plan.Round, DeviceId: device,
		ModelVersion: plan.GetModel().GetVersion(), ModuleSha256: plan.GetModule().GetSha256(),
		NumExamples: examples, Metrics: &pb.Metrics{Values: metrics}}
}

// signEval signs an evaluation report with the device's enrolled key.
func (d *scripted) signEval(t testing.TB, r *pb.EvaluationReport) *pb.EvaluationReport {
	t.Helper()
	key, err := identity.LoadOrCreateUserKey(filepath.Join(d.dir, edge.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	sig, err := identity.SignReport(key.PrivateKey(), identity.EvalStatement(r))
	if err != nil {
		t.Fatal(err)
	}
	r.Signature, r.KeyId = sig, key.ID()
	return r
}

// evaluations returns the task's model.evaluated audit events by round,
// each verified against the log's entry key.
func evaluations(t testing.TB, h *servertest.Harness, task string) map[uint64][]audit.ModelEvaluated {
	t.Helper()
	out := map[uint64][]audit.ModelEvaluated{}
	for _, ev := range h.AuditEvents(t, &pb.AuditFilter{TaskId: task, EventType: string(audit.TypeModelEvaluated)}) {
		p, err := ev.DecodePayload()
		if err != nil {
			t.Fatal(err)
		}
		me := p.(audit.ModelEvaluated)
		out[me.Round] = append(out[me.Round], me)
	}
	return out
}

// completed waits for the task to complete and returns its rounds, failing
// unless every one of them committed.
func completed(t testing.TB, h *servertest.Harness, task string, timeout time.Duration, want int) []*pb.RoundSummary {
	t.Helper()
	done := h.WaitTask(t, task, timeout, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", done.State, done.StateReason)
	}
	rounds := h.Rounds(t, task)
	for _, r := range rounds {
		t.Logf("round %d %v %v assigned %d reported %d dropped %d metrics %v failures %v (%s)", r.Round, r.Kind, r.State,
			r.Assigned, r.Reported, r.Dropped, r.Metrics.GetValues(), r.Failures, r.Reason)
		if r.State != pb.RoundState_ROUND_STATE_COMMITTED {
			t.Errorf("round %d %v: %s", r.Round, r.State, r.Reason)
		}
	}
	if len(rounds) != want {
		t.Fatalf("%d rounds, want %d", len(rounds), want)
	}
	return rounds
}

// checkHonest: no honest agent's report was refused.
func checkHonest(t testing.TB, agents ...*edge.Agent) {
	t.Helper()
	for _, a := range agents {
		s := a.Stats()
		// On a loaded machine an agent may retry a round's plan after the
		// round committed without it, and be told the round is over: that
		// is the protocol working, not a report refused for what it held.
		// With every attempt's report accepted, its refusals were such
		// retries, however many the load caused.
		late := strings.Contains(a.LastRefusal(), "is not open") && (s.Refused == 1 || s.Reports >= s.Rounds)
		if s.Refused != 0 && !late || s.Failures != 0 {
			t.Errorf("honest %s: %+v, last refusal %q", a.ID(), s, a.LastRefusal())
		}
	}
}

// violationsOf collects the asynchronous errors of d's connection, where
// NATS reports a publish it refused.
func violationsOf(d *scripted) <-chan error {
	ch := make(chan error, 256)
	d.nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case ch <- err:
		default:
		}
	})
	return ch
}

// wantViolation waits for NATS to report a permissions violation for a
// publish to subject.
func wantViolation(t testing.TB, errs <-chan error, subject string) {
	t.Helper()
	timeout := time.After(scriptedWait)
	for {
		select {
		case err := <-errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), fmt.Sprintf("Publish to %q", subject)) {
				return
			}
		case <-timeout:
			t.Errorf("no permissions violation reported for a publish to %s", subject)
			return
		}
	}
}

// TestHostileCheckInImpersonation: a hostile enrolled device tries to
// check in as others — offline enrolled devices and an honest one. On the
// other devices' check-in (and plan failure) subjects NATS refuses the
// publish (no reply, a permissions violation); on its own subject, with a body naming another device (and
// claiming one example, which would shrink the honest device's weight or
// get its genuine report refused), the server refuses it as not eligible.
// It keeps trying all through the task; four honest agents' rounds commit
// with exactly the honest devices in each cohort, each report counted with
// its real example count, none abandoned.
func TestHostileCheckInImpersonation(t *testing.T) {
	h := servertest.New(t)
	// Security is on: NATS takes no client without credentials.
	if nc, err := nats.Connect(h.NATSURL(), nats.Timeout(5*time.Second)); err == nil {
		nc.Close()
		t.Fatal("NATS accepted a client without credentials")
	}
	spec, _ := softmaxTask(t, h, "impersonation", 2, 4, 5) // a free seat an impersonation could take
	task := h.CreateTask(t, spec).Id

	ids, sizes := []string{"dev-000", "dev-001", "dev-002", "dev-003"}, []int{100, 120, 140, 160}
	victim := ids[1]
	dirs := make([]string, len(ids))
	for i, id := range ids {
		dirs[i] = enrollDir(t, h, id)
	}
	offline := []string{"offline-1", "offline-2"}
	for _, id := range offline {
		enrollDir(t, h, id)
	}
	hostile := newScripted(t, h, "hostile-1")
	violations := violationsOf(hostile)
	victims := append(append([]string{}, offline...), victim)
	// What a victim would say at check-in: eligible, one example.
	asVictim := func(id string) []byte {
		ci := hostile.eligibleCheckIn(task)
		ci.DeviceId = id
		ci.Attributes.ExamplesAvailable = 1
		return mustMarshal(t, ci)
	}
	refusedCheckIn := func(resp *pb.CheckInResponse, id string) error {
		r := resp.GetRetryAfter()
		want := fmt.Sprintf("check-in names device %q on the subject of device %q; a device checks in only as itself", id, hostile.id)
		if r == nil || r.Reason != pb.RetryReason_RETRY_REASON_NOT_ELIGIBLE || r.Detail != want {
			return fmt.Errorf("check-in as %s answered %v, want NOT_ELIGIBLE %q", id, resp, want)
		}
		return nil
	}

	waitRound(t, h, task, 1, 10*time.Second, pb.RoundState_ROUND_STATE_OPEN)
	t.Run("other subjects", func(t *testing.T) {
		for _, id := range victims {
			for _, subj := range []string{wire.CheckInSubject(id), wire.FailureSubject(task, 1, id)} {
				// No answer ever comes to a refused publish: a short timeout.
				if _, err := hostile.nc.Request(subj, asVictim(id), 300*time.Millisecond); !errors.Is(err, nats.ErrTimeout) {
					t.Errorf("request on %s: %v, want a timeout", subj, err)
				}
				wantViolation(t, violations, subj)
			}
		}
		if !hostile.nc.IsConnected() {
			t.Fatal("the hostile device lost its connection")
		}
	})
	t.Run("own subject", func(t *testing.T) {
		for _, id := range victims {
			if err := refusedCheckIn(hostile.checkInRaw(t, asVictim(id)), id); err != nil {
				t.Error(err)
			}
		}
	})

	// It keeps at it while the honest agents train.
	stop := make(chan struct{})
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		problems []error
		tries    int
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(25 * time.Millisecond):
			}
			id := victims[i%len(victims)]
			hostile.nc.Publish(wire.CheckInSubject(id), asVictim(id))
			var err error
			msg, rerr := hostile.nc.Request(wire.CheckInSubject(hostile.id), asVictim(id), 10*time.Second)
			if rerr != nil {
				err = fmt.Errorf("check-in as %s: %w", id, rerr)
			} else {
				var resp pb.CheckInResponse
				if err = proto.Unmarshal(msg.Data, &resp); err == nil {
					err = refusedCheckIn(&resp, id)
				}
			}
			mu.Lock()
			tries++
			if err != nil {
				problems = append(problems, err)
			}
			mu.Unlock()
		}
	}()
	var agents []*edge.Agent
	for i, id := range ids {
		agents = append(agents, startAgent(t, h, dirs[i], id, datatest.Synthetic(sizes[i], 8, 3, uint64(i+1))))
	}
	rounds := completed(t, h, task, 60*time.Second, 2)
	close(stop)
	wg.Wait()
	t.Logf("%d impersonating check-ins during the task", tries)
	for _, err := range problems {
		t.Error(err)
	}

	evals := evaluations(t, h, task)
	total := uint64(0)
	for _, n := range sizes {
		total += uint64(n)
	}
	for _, r := range rounds {
		// Five seats, and only the four honest devices in them.
		if r.Assigned != 4 || r.Reported != 4 || r.Dropped != 0 || len(r.Failures) != 0 {
			t.Errorf("round %d: assigned %d reported %d dropped %d failures %v, want the four honest devices", r.Round,
				r.Assigned, r.Reported, r.Dropped, r.Failures)
		}
		// The metrics' weight is every honest report's real example count.
		if ev := evals[r.Round]; len(ev) != 1 || ev[0].Samples != total {
			t.Errorf("round %d: model.evaluated %+v, want one over %d examples", r.Round, ev, total)
		}
	}
	checkHonest(t, agents...)
	for _, a := range agents {
		if s := a.Stats(); s.Reports != 2 {
			t.Errorf("%s: %d reports accepted, want 2 (%+v)", a.ID(), s.Reports, s)
		}
	}
	hostile.noMoreReceipts(t)
}

// TestHostilePoisonDefaultBound: tasks created without a norm bound, as the
// CLI creates them, get the base model's norm as their bound. A hostile
// device in every round sends signed updates of 1e30, -1e30 and one value
// over the bound: each is refused with a receipt naming the norm and the
// bound, while an update just under the bound counts. Honest agents' rounds
// commit, each step finite and within the bound. Then a task runs a
// hostile module, wasmtest.Stepping(3e38), on the honest agents: they clip
// its absurd (but finite) updates to the bound, every round commits a step
// of exactly the bound, and the task runs to its end.
func TestHostilePoisonDefaultBound(t *testing.T) {
	h := servertest.New(t)
	spec, version := softmaxTask(t, h, "poison", 2, 4, 5)
	created := h.CreateTask(t, spec)
	task := created.Id
	base := fetchModel(t, h, version)
	bound := created.GetAggregation().GetMaxUpdateNorm()
	if want := max(l2(base.Flatten()), 1); math.Abs(bound-want) > 1e-9*want || created.GetAggregation().GetUnboundedUpdates() {
		t.Fatalf("task created with bound %v (unbounded %v), want the base model's norm %v", bound,
			created.GetAggregation().GetUnboundedUpdates(), want)
	}
	dim := base.Layout().Size()
	hostile := newScripted(t, h, "hostile-1")
	poison := func(t *testing.T, round uint64) {
		plan := hostile.join(t, task, round)
		if plan.GetMaxUpdateNorm() != bound {
			t.Errorf("round %d plan says max_update_norm %v, task %v", round, plan.GetMaxUpdateNorm(), bound)
		}
		parent := fetchModel(t, h, plan.GetModel().GetVersion())
		subj := wire.ReportSubject(task, round, hostile.id)
		want := fmt.Sprintf("exceeds bound %.6g", bound)
		for _, v := range []float32{1e30, -1e30} {
			hostile.refused(t, subj, mustMarshal(t, hostile.sign(t, rogueUpdate(plan, hostile.id, parent, v, 200))), task, round, want)
		}
		one := rogueUpdate(plan, hostile.id, parent, 0, 200)
		spike := make([]float32, dim)
		spike[dim/2] = float32(1.01 * bound)
		setDense(one, wire.EncodeDense(spike))
		hostile.refused(t, subj, mustMarshal(t, hostile.sign(t, one)), task, round, want)
		// Just under the bound, with the full weight of its 200 examples.
		under := float32(0.999 * bound / math.Sqrt(float64(dim)))
		hostile.accepted(t, subj, mustMarshal(t, hostile.sign(t, rogueUpdate(plan, hostile.id, parent, under, 200))))
	}
	t.Run("round 1", func(t *testing.T) { poison(t, 1) })
	var agents []*edge.Agent
	for i, id := range []string{"dev-000", "dev-001", "dev-002"} {
		agents = append(agents, startAgent(t, h, enrollDir(t, h, id), id, datatest.Synthetic(200, 8, 3, uint64(i+1))))
	}
	t.Run("round 2", func(t *testing.T) { poison(t, 2) })
	rounds := completed(t, h, task, 60*time.Second, 2)
	parent := base
	for _, r := range rounds {
		next := fetchModel(t, h, r.Model.GetVersion())
		checkStep(t, next, parent, bound*(1+1e-5))
		parent = next
	}
	checkHonest(t, agents...)

	t.Run("hostile module", func(t *testing.T) {
		sbase := steppingModel(t)
		version := h.ImportModel(t, "stepping", sbase)
		module := h.RegisterModule(t, "stepping", wasmtest.Stepping(3e38))
		created := h.CreateTask(t, &pb.Task{Name: "hostile-module", Model: &pb.ModelRef{Version: version},
			Module: &pb.ModuleRef{Sha256: module}, CohortTarget: 3, ReportGoal: 3, RoundsTotal: 3,
			SelectionTimeout: durationpb.New(10 * time.Second), ReportTimeout: durationpb.New(20 * time.Second)})
		bound := created.GetAggregation().GetMaxUpdateNorm()
		if want := math.Sqrt(55); math.Abs(bound-want) > 1e-9 {
			t.Fatalf("task created with bound %v, want √55", bound)
		}
		rounds := completed(t, h, created.Id, 60*time.Second, 3)
		parent := sbase.Flatten()
		for _, r := range rounds {
			next := fetchModel(t, h, r.Model.GetVersion()).Flatten()
			if i := nonFiniteAt(next); i >= 0 {
				t.Fatalf("round %d committed %v at %d", r.Round, next[i], i)
			}
			// Every agent's update is 3e38 in every value, clipped to the
			// bound: a step of bound/5 in each of the 25 values.
			step := make([]float32, len(next))
			for i := range next {
				step[i] = next[i] - parent[i]
				if d := math.Abs(float64(step[i]) - bound/5); d > 1e-5 {
					t.Fatalf("round %d moved value %d by %v, want %v", r.Round, i, step[i], bound/5)
				}
			}
			if n := l2(step); n > bound*(1+1e-5) {
				t.Errorf("round %d step norm %v over the bound %v", r.Round, n, bound)
			}
			parent = next
		}
		checkHonest(t, agents...)
	})
}

// TestHostileWeightClaim: a hostile device checks in with 2^40 examples
// and reports an update with num_examples 2^40 next to two honest scripted
// devices with known updates and counts, on a task that caps a report's
// weight at 100. A claim above its own check-in is refused; the claim of
// 2^40 counts as 100, so the committed model is exactly the capped
// weighted mean — and so are the metrics' weights.
func TestHostileWeightClaim(t *testing.T) {
	h := servertest.New(t)
	base, err := model.New(model.Tensor{Name: "w", Shape: []int{2, 3}, Data: make([]float32, 6)})
	if err != nil {
		t.Fatal(err)
	}
	version := h.ImportModel(t, "weights", base)
	module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
	task := h.CreateTask(t, &pb.Task{Name: "weights", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
		CohortTarget: 3, ReportGoal: 3, RoundsTotal: 1, SelectionTimeout: durationpb.New(20 * time.Second),
		ReportTimeout: durationpb.New(20 * time.Second),
		Aggregation:   &pb.AggregationConfig{MaxUpdateNorm: 10, MaxExamplesPerReport: 100}}).Id

	const huge = uint64(1) << 40
	hostile, a, b := newScripted(t, h, "hostile-1"), newScripted(t, h, "honest-a"), newScripted(t, h, "honest-b")
	ci := hostile.eligibleCheckIn(task)
	ci.Attributes.ExamplesAvailable = huge
	plan := joinWith(t, hostile, ci, 1)
	planA, planB := a.join(t, task, 1), b.join(t, task, 1)
	subj := wire.ReportSubject(task, 1, hostile.id)
	hostile.refused(t, subj, mustMarshal(t, hostile.sign(t, rogueUpdate(plan, hostile.id, base, 1, huge+1))), task, 1,
		fmt.Sprintf("num_examples %d not in [1, %d] (examples available at check-in)", huge+1, huge))
	hostile.accepted(t, subj, mustMarshal(t, hostile.sign(t, rogueUpdate(plan, hostile.id, base, 1, huge))))
	a.accepted(t, wire.ReportSubject(task, 1, a.id), mustMarshal(t, a.sign(t, rogueUpdate(planA, a.id, base, 0.1, 50))))
	b.accepted(t, wire.ReportSubject(task, 1, b.id), mustMarshal(t, b.sign(t, rogueUpdate(planB, b.id, base, 0.2, 100))))

	r := completed(t, h, task, 30*time.Second, 1)[0]
	// (50·0.1 + 100·0.2 + 100·1) / 250; uncapped it would be all but 1.
	const want = 0.5
	for i, v := range fetchModel(t, h, r.Model.GetVersion()).Flatten() {
		if math.Abs(float64(v)-want) > 1e-6 {
			t.Fatalf("value %d is %v, want the capped weighted mean %v", i, v, want)
		}
	}
	if ev := evaluations(t, h, task)[1]; len(ev) != 1 || ev[0].Samples != 250 || ev[0].Metrics["train_loss"] != 1 {
		t.Errorf("model.evaluated %+v, want one over 250 examples with train_loss 1", ev)
	}
	for _, d := range []*scripted{hostile, a, b} {
		d.noMoreReceipts(t)
	}
}

// TestHostileMetric: a hostile device in every round reports signed
// updates whose loss is ±1.7e308 or just over the 1e12 bound; each is
// refused with a receipt naming the metric. Its honest-looking report and
// the honest agents' count; every round commits with finite, plausible
// metrics, and the audit log holds a model.evaluated event for each,
// with the round's metrics and weight.
func TestHostileMetric(t *testing.T) {
	h := servertest.New(t)
	spec, _ := softmaxTask(t, h, "metric", 2, 4, 5)
	task := h.CreateTask(t, spec).Id
	hostile := newScripted(t, h, "hostile-1")
	play := func(t *testing.T, round uint64) {
		plan := hostile.join(t, task, round)
		parent := fetchModel(t, h, plan.GetModel().GetVersion())
		subj := wire.ReportSubject(task, round, hostile.id)
		report := func(loss float64) []byte {
			r := rogueUpdate(plan, hostile.id, parent, 0.001, 200)
			r.Metrics.Values["loss"] = loss
			return mustMarshal(t, hostile.sign(t, r))
		}
		for _, v := range []float64{1.7e308, -1.7e308, 1.000001e12, math.Inf(1)} {
			hostile.refused(t, subj, report(v), task, round, fmt.Sprintf(`metric "loss" is %v (metrics must be finite, at most 1e+12 in magnitude)`, v))
		}
		hostile.accepted(t, subj, report(1.5))
	}
	t.Run("round 1", func(t *testing.T) { play(t, 1) })
	var agents []*edge.Agent
	for i, id := range []string{"dev-000", "dev-001", "dev-002"} {
		agents = append(agents, startAgent(t, h, enrollDir(t, h, id), id, datatest.Synthetic(200, 8, 3, uint64(i+1))))
	}
	t.Run("round 2", func(t *testing.T) { play(t, 2) })
	rounds := completed(t, h, task, 60*time.Second, 2)
	evals := evaluations(t, h, task)
	for _, r := range rounds {
		m := r.Metrics.GetValues()
		for k, v := range m {
			if math.IsNaN(v) || math.Abs(v) > 1e12 {
				t.Errorf("round %d metric %s = %v", r.Round, k, v)
			}
		}
		// Three classes: an honest loss is about ln 3; the hostile's 1.5.
		if loss, ok := m["train_loss"]; !ok || !(loss > 0 && loss < 5) {
			t.Errorf("round %d train_loss %v (present %v)", r.Round, loss, ok)
		}
		if len(m) == 0 {
			continue
		}
		ev := evals[r.Round]
		if len(ev) != 1 || ev[0].Dataset != "federated:train" || ev[0].Model != r.Model.GetParentVersion() || ev[0].Samples != 800 ||
			!equalMetrics(ev[0].Metrics, m) {
			t.Errorf("round %d: model.evaluated %+v, want one of the round's metrics %v on %s over 800 examples", r.Round, ev, m,
				r.Model.GetParentVersion())
		}
	}
	if len(evals) != len(rounds) {
		t.Errorf("model.evaluated for rounds %v, want one per committed round", evals)
	}
	checkHonest(t, agents...)
}

func equalMetrics(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// watchCommits collects the task's COMMITTED round events until the task
// ends (when the server closes the stream).
func watchCommits(t testing.TB, h *servertest.Harness, task string) <-chan []*pb.RoundEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	st, err := h.Tasks.WatchTask(ctx, &pb.WatchTaskRequest{TaskId: task})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	out := make(chan []*pb.RoundEvent, 1)
	go func() {
		defer cancel()
		var evs []*pb.RoundEvent
		for {
			resp, err := st.Recv()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					evs = append(evs, &pb.RoundEvent{Reason: "watch: " + err.Error()})
				}
				out <- evs
				return
			}
			if e := resp.GetEvent(); e.GetType() == pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED {
				evs = append(evs, e)
			}
		}
	}()
	return out
}

// checkEvalRounds checks a task of two training rounds evaluated after
// each: kinds train, evaluate, train, evaluate, all committed, evaluation
// rounds with eval_ metrics and no model of their own, in the round list
// and in the watch stream.
func checkEvalRounds(t *testing.T, rounds []*pb.RoundSummary, watched <-chan []*pb.RoundEvent, wantEval ...string) {
	t.Helper()
	kinds := []pb.RoundKind{pb.RoundKind_ROUND_KIND_TRAIN, pb.RoundKind_ROUND_KIND_EVALUATE,
		pb.RoundKind_ROUND_KIND_TRAIN, pb.RoundKind_ROUND_KIND_EVALUATE}
	for i, r := range rounds {
		if r.Kind != kinds[i] {
			t.Errorf("round %d is %v, want %v", r.Round, r.Kind, kinds[i])
		}
		if r.Kind != pb.RoundKind_ROUND_KIND_EVALUATE {
			continue
		}
		m := r.Metrics.GetValues()
		for _, k := range wantEval {
			if v, ok := m[k]; !ok || math.IsNaN(v) || math.IsInf(v, 0) {
				t.Errorf("evaluation round %d: %s = %v (present %v), metrics %v", r.Round, k, v, ok, m)
			}
		}
		for k := range m {
			if !strings.HasPrefix(k, "eval_") {
				t.Errorf("evaluation round %d has metric %s", r.Round, k)
			}
		}
		if acc := m["eval_accuracy"]; !(acc >= 0 && acc <= 1) {
			t.Errorf("evaluation round %d accuracy %v", r.Round, acc)
		}
		if r.Model.GetVersion() != "" {
			t.Errorf("evaluation round %d produced model %s", r.Round, r.Model.GetVersion())
		}
	}
	var evs []*pb.RoundEvent
	select {
	case evs = <-watched:
	case <-time.After(30 * time.Second):
		t.Fatal("the watch stream did not end with the task")
	}
	seen := map[uint64]*pb.RoundEvent{}
	for _, e := range evs {
		if strings.HasPrefix(e.Reason, "watch: ") {
			t.Fatal(e.Reason)
		}
		seen[e.Round] = e
	}
	// Round 1 may have committed before the stream was set up on the server.
	for _, round := range []uint64{2, 3, 4} {
		e := seen[round]
		if e == nil || e.Kind != kinds[round-1] {
			t.Errorf("watch: round %d committed as %v, want %v (events %v)", round, e.GetKind(), kinds[round-1], evs)
			continue
		}
		if e.Kind == pb.RoundKind_ROUND_KIND_EVALUATE {
			if _, ok := e.Metrics.GetValues()["eval_accuracy"]; !ok {
				t.Errorf("watch: evaluation round %d committed without eval_accuracy: %v", round, e.Metrics.GetValues())
			}
		}
	}
}

// TestHostileEvaluationRounds: with security on, tasks evaluated after
// every training round (eval_every 1, two training rounds) commit their
// evaluation rounds with eval_ metrics from signed evaluation reports.
// In the plaintext task a hostile device takes one of the three seats of
// every round (so no round closes without it): its evaluation reports with
// metrics altered after signing, or out of bounds, are refused, its genuine
// one counts. In the SecAgg task training rounds are secure sums and
// evaluation rounds plaintext; both kinds commit.
func TestHostileEvaluationRounds(t *testing.T) {
	t.Run("plaintext", func(t *testing.T) {
		h := servertest.New(t)
		spec, _ := softmaxTask(t, h, "evaluated", 2, 3, 3)
		spec.EvalEvery = 1
		// Every round waits for the hostile device's reports, sent between
		// its refused ones; on a loaded machine that outlasted 20 s. A
		// round with all three reports closes at once whatever the timeout.
		spec.ReportTimeout = durationpb.New(2 * time.Minute)
		task := h.CreateTask(t, spec).Id
		watched := watchCommits(t, h, task)
		hostile := newScripted(t, h, "hostile-1")
		var agents []*edge.Agent
		for i, id := range []string{"dev-000", "dev-001"} {
			agents = append(agents, startAgent(t, h, enrollDir(t, h, id), id, datatest.Synthetic(150+50*i, 8, 3, uint64(i+1))))
		}
		for round := uint64(1); round <= 4; round++ {
			plan := hostile.join(t, task, round)
			if plan.Kind != pb.RoundKind_ROUND_KIND_EVALUATE {
				parent := fetchModel(t, h, plan.GetModel().GetVersion())
				hostile.accepted(t, wire.ReportSubject(task, round, hostile.id),
					mustMarshal(t, hostile.sign(t, rogueUpdate(plan, hostile.id, parent, 0.001, 200))))
				continue
			}
			subj := wire.EvalSubject(task, round, hostile.id)
			honest := map[string]float64{"loss": 1, "accuracy": 0.5}
			tampered := hostile.signEval(t, evalReport(plan, hostile.id, 10, honest))
			tampered.Metrics.Values["accuracy"] = 1 // after signing
			hostile.refused(t, subj, mustMarshal(t, tampered), task, round, "does not verify")
			huge := hostile.signEval(t, evalReport(plan, hostile.id, 10, map[string]float64{"loss": 1.7e308, "accuracy": 0.5}))
			hostile.refused(t, subj, mustMarshal(t, huge), task, round, `metric "loss" is 1.7e+308`)
			hostile.accepted(t, subj, mustMarshal(t, hostile.signEval(t, evalReport(plan, hostile.id, 10, honest))))
		}
		rounds := completed(t, h, task, 60*time.Second, 4)
		checkEvalRounds(t, rounds, watched, "eval_loss", "eval_accuracy")
		// Each evaluation measured the model the training before it committed.
		evals := evaluations(t, h, task)
		for _, round := range []uint64{2, 4} {
			ev := evals[round]
			if len(ev) != 1 || ev[0].Dataset != "federated:evaluate" || ev[0].Model != rounds[round-2].Model.GetVersion() {
				t.Errorf("round %d: model.evaluated %+v, want federated:evaluate of %s", round, ev, rounds[round-2].Model.GetVersion())
			}
		}
		checkHonest(t, agents...)
		for _, a := range agents {
			if s := a.Stats(); s.Reports != 4 {
				t.Errorf("%s: %d reports accepted, want 4 (%+v)", a.ID(), s.Reports, s)
			}
		}
	})

	t.Run("secagg", func(t *testing.T) {
		h := servertest.New(t, servertest.WithPace(50*time.Millisecond))
		base := steppingModel(t)
		version := h.ImportModel(t, "secure", base)
		module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
		task := h.CreateTask(t, &pb.Task{Name: "secure-evaluated", Model: &pb.ModelRef{Version: version},
			Module: &pb.ModuleRef{Sha256: module}, CohortTarget: 4, ReportGoal: 3, RoundsTotal: 2, EvalEvery: 1,
			SelectionTimeout: durationpb.New(10 * time.Second), ReportTimeout: durationpb.New(20 * time.Second),
			Secagg: &pb.SecAggConfig{ClipRange: 0.01, MaxWeight: 1, StageTimeout: durationpb.New(2500 * time.Millisecond)}}).Id
		watched := watchCommits(t, h, task)
		var agents []*edge.Agent
		for i, id := range []string{"dev-000", "dev-001", "dev-002", "dev-003"} {
			agents = append(agents, startAgent(t, h, enrollDir(t, h, id), id, datatest.Synthetic(20, 4, 2, uint64(i+1))))
		}
		rounds := completed(t, h, task, 90*time.Second, 4)
		checkEvalRounds(t, rounds, watched, "eval_accuracy")
		for _, r := range rounds {
			if r.Kind == pb.RoundKind_ROUND_KIND_TRAIN && !strings.Contains(r.Reason, "secure sum of 4") {
				t.Errorf("training round %d: %s, want a secure sum of the four devices", r.Round, r.Reason)
			}
		}
		want := base.Flatten()
		for i, v := range fetchModel(t, h, rounds[2].Model.GetVersion()).Flatten() {
			if d := float64(v - want[i]); math.Abs(d-2*wasmtest.TrivialStep) > 1e-6 {
				t.Fatalf("value %d moved by %v over two secure rounds, want %v", i, d, 2*wasmtest.TrivialStep)
			}
		}
		checkHonest(t, agents...)
	})
}

// TestHostileFailingPlan: an edge agent whose dataset the task's module
// refuses (4 features for a model of 8) fails its plan every time. On its
// own clock, driven here, it retries with back-off, at most
// devproto.DefaultMaxAttempts times, then reports the failure once and
// tries no more, though it checks in again; the round, held open by two
// scripted devices that report only then, commits with the failing device
// dropped and RoundSummary.failures naming it with the module's reason.
func TestHostileFailingPlan(t *testing.T) {
	h := servertest.New(t)
	spec, version := softmaxTask(t, h, "failing", 1, 2, 3)
	// Far off: the agent's clock runs ahead of the server's as it is driven.
	spec.SelectionTimeout, spec.ReportTimeout = durationpb.New(30*time.Second), durationpb.New(60*time.Second)
	task := h.CreateTask(t, spec).Id
	a, b := newScripted(t, h, "loyal-a"), newScripted(t, h, "loyal-b")
	planA, planB := a.join(t, task, 1), b.join(t, task, 1)

	fake := clock.NewFake(time.Now())
	broken := startAgent(t, h, enrollDir(t, h, "broken-1"), "broken-1", datatest.Synthetic(200, 4, 3, 7), edge.WithClock(fake))
	// next is the agent's one pending timer, if it has exactly one.
	next := func() (time.Duration, bool) {
		dl := fake.Deadlines()
		if len(dl) != 1 {
			return 0, false
		}
		return dl[0].Sub(fake.Now()), true
	}
	until := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(30 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: agent %+v, timers %v at %v", what, broken.Stats(), fake.Deadlines(), fake.Now())
			}
		}
	}
	// Between attempts the agent sleeps its back-off (under 8s); a request
	// in flight waits on a timeout of 5s (the failure report) or 10s (a
	// check-in), which must not be fired. Only back-offs are skipped, and
	// only while it may still try again.
	until("giving up", func() bool {
		s := broken.Stats()
		if s.Failures > 0 {
			return true
		}
		if d, ok := next(); ok && s.Rounds < devproto.DefaultMaxAttempts && d < 9*time.Second {
			fake.Advance(d)
		}
		return false
	})
	st := broken.Stats()
	if st.Rounds != devproto.DefaultMaxAttempts || st.Failures != 1 || st.Reports != 0 || st.Refused != 0 {
		t.Fatalf("agent %+v, want %d attempts, one round given up, no reports", st, devproto.DefaultMaxAttempts)
	}
	// Time passes on the device: it checks in again, is handed the same
	// plan, and leaves it alone.
	until("idle", func() bool { d, ok := next(); return ok && d > 20*time.Second })
	checkIns := broken.Stats().CheckIns
	d, _ := next()
	fake.Advance(d)
	until("checking in again", func() bool {
		d, ok := next()
		return broken.Stats().CheckIns > checkIns && ok && d > 900*time.Millisecond
	})
	if s := broken.Stats(); s.Rounds != devproto.DefaultMaxAttempts || s.Failures != 1 {
		t.Fatalf("after checking in again: %+v", s)
	}

	base := fetchModel(t, h, version)
	a.accepted(t, wire.ReportSubject(task, 1, a.id), mustMarshal(t, a.sign(t, rogueUpdate(planA, a.id, base, 0.01, 50))))
	b.accepted(t, wire.ReportSubject(task, 1, b.id), mustMarshal(t, b.sign(t, rogueUpdate(planB, b.id, base, 0.01, 50))))
	r := completed(t, h, task, 30*time.Second, 1)[0]
	if r.Assigned != 3 || r.Reported != 2 || r.Dropped != 1 {
		t.Errorf("round 1: assigned %d reported %d dropped %d, want 3/2/1", r.Assigned, r.Reported, r.Dropped)
	}
	want := fmt.Sprintf("device failed after %d attempts: ", devproto.DefaultMaxAttempts)
	if len(r.Failures) != 1 || r.Failures[0].DeviceId != "broken-1" || !strings.HasPrefix(r.Failures[0].Reason, want) ||
		!strings.Contains(r.Failures[0].Reason, "softmax: want fc1.weight [3 4]") {
		t.Errorf("failures %v, want broken-1: %q... naming the module's reason", r.Failures, want)
	}
	checkStep(t, fetchModel(t, h, r.Model.GetVersion()), base, 0.011*math.Sqrt(float64(base.Layout().Size())))
}
