package coord

import (
	"errors"
	"math"
	"testing"
	"time"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/round"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
)

// TestRefusalClasses: each check names its class, an inner check's class
// wins over the caller's, and the error still reads and matches as before.
func TestRefusalClasses(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{checkMetrics(map[string]float64{"loss": math.NaN()}), metrics.RefusedMetrics},
		{checkExamples(5, round.Seat{Examples: 2}), metrics.RefusedExamples},
		{refuseAs(metrics.RefusedCohort, "device %q is not in the cohort", "x"), metrics.RefusedCohort},
		{refuse("unclassified"), metrics.RefusedOther},
		{errors.New("not a refusal"), metrics.RefusedOther},
	} {
		if got := refusalReason(c.err); got != c.want {
			t.Errorf("%v: class %q, want %q", c.err, got, c.want)
		}
	}
	inner := func() (err error) {
		defer classify(&err, metrics.RefusedSecAgg)
		return checkExamples(0, round.Seat{Examples: 1})
	}()
	if got := refusalReason(inner); got != metrics.RefusedExamples || !errors.Is(inner, ErrReport) {
		t.Errorf("nested refusal: class %q (want %q), is ErrReport %v", got, metrics.RefusedExamples, errors.Is(inner, ErrReport))
	}
}

// histogram is what the checks read of a gathered histogram.
type histogram interface {
	GetSampleCount() uint64
	GetSampleSum() float64
}

// stageHistograms reads fleetlearn_secagg_stage_duration_seconds by stage.
func stageHistograms(t *testing.T, m *metrics.M) map[string]histogram {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]histogram{}
	for _, f := range fams {
		if f.GetName() != "fleetlearn_secagg_stage_duration_seconds" {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "stage" {
					out[l.GetValue()] = s.GetHistogram()
				}
			}
		}
	}
	return out
}

// TestSecureStageDurations: a secure round on the fake clock whose
// advertisement stage is held to its timeout by a silent device records one
// duration per stage, the advertisement's the timeout exactly and the
// stages that close as soon as everyone answered none.
func TestSecureStageDurations(t *testing.T) {
	h := newHarness(t)
	task := h.start(secureTask(h))
	ev := h.watch(task.Id)
	devs, plans := h.joinCohort(6)
	acked := make(chan string, 64)
	results := make([]<-chan error, 6)
	for i, d := range devs {
		silent := ""
		if i == 0 {
			silent = "nothing"
		}
		results[i] = d.secure(plans[i], constant(8, 0.1), 1, silent, acked)
	}
	stage := 5 * time.Second
	awaitAcks(t, acked, "*fleetlearnv1.SecAggUp_Advertise", 5)
	awaitArmed(t, h.clk, h.clk.Now().Add(stage))
	h.clk.Advance(stage)
	for i := 1; i < 6; i++ {
		if err := <-results[i]; err != nil {
			t.Fatalf("device %d: %v", i, err)
		}
	}
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED {
		t.Fatalf("secure round: %v", got)
	}
	hs := stageHistograms(t, h.deps.Metrics)
	for _, st := range []string{"advertise", "share keys", "masked input", "consistency", "unmask"} {
		hg, ok := hs[st]
		if !ok || hg.GetSampleCount() != 1 {
			t.Errorf("stage %q: not recorded once (%v)", st, hg)
			continue
		}
		want := 0.0
		if st == "advertise" {
			want = stage.Seconds()
		}
		if hg.GetSampleSum() != want {
			t.Errorf("stage %q took %vs on the fake clock, want %vs", st, hg.GetSampleSum(), want)
		}
	}
}
