package round_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/fleetlearn/fleetlearn/round"
)

var spec = round.Spec{Task: "t", Round: 7, Kind: round.Train, Model: "m1", Module: "w1"}

// refusedAs checks err is a refusal of class c whose message names want.
func refusedAs(t *testing.T, name string, err error, c round.Class, want string) {
	t.Helper()
	var r *round.Refusal
	switch {
	case c == "" && err != nil:
		t.Errorf("%s: refused: %v", name, err)
	case c == "":
	case !errors.As(err, &r) || !errors.Is(err, round.ErrRefused):
		t.Errorf("%s: %v, want a %s refusal", name, err, c)
	case r.Class != c || !strings.Contains(err.Error(), want):
		t.Errorf("%s: %s refusal %q, want %s naming %q", name, r.Class, err, c, want)
	}
}

// TestCheckSender: what a hostile device's subject can claim, and what it
// gets for it (server TestBadReportsAreRefused, TestHostileChunkFlood end
// to end).
func TestCheckSender(t *testing.T) {
	seated := round.Standing{Seat: round.Seat{Examples: 10}, Seated: true}
	for _, c := range []struct {
		name   string
		task   string
		round  uint64
		kind   round.Kind
		cohort round.Standing
		class  round.Class
		want   string
	}{
		{"seated, first report", "t", 7, round.Train, seated, "", ""},
		{"another task", "u", 7, round.Train, seated, round.ClassSubject, "subject is for u/7, round is t/7"},
		{"an earlier round", "t", 6, round.Train, seated, round.ClassSubject, "subject is for t/6"},
		{"not in the cohort", "t", 7, round.Train, round.Standing{}, round.ClassCohort, `device "d" is not in the cohort of round 7`},
		{"second report", "t", 7, round.Train, round.Standing{Seated: true, Reported: true}, round.ClassDuplicate, "already reported"},
		{"over its storage quota", "t", 7, round.Train, round.Standing{Seated: true, OverQuota: true}, round.ClassQuota, "stored more than round 7 admits"},
		{"evaluation in a training round", "t", 7, round.Evaluate, seated, round.ClassKind, "evaluation report in a round that wants update reports"},
		// The order is the protocol's: a duplicate is a duplicate before it is over quota.
		{"duplicate and over quota", "t", 7, round.Train, round.Standing{Seated: true, Reported: true, OverQuota: true}, round.ClassDuplicate, "already reported"},
	} {
		refusedAs(t, c.name, round.CheckSender(spec, c.task, c.round, "d", c.kind, c.cohort), c.class, c.want)
	}
	eval := spec
	eval.Kind = round.Evaluate
	refusedAs(t, "update in an evaluation round", round.CheckSender(eval, "t", 7, "d", round.Train, seated),
		round.ClassKind, "update report in a round that wants evaluation reports")
}

// TestCheckHeader: a body that claims another round, device, model or
// module than its subject and the round (server TestBadReportsAreRefused).
func TestCheckHeader(t *testing.T) {
	ok := round.Header{Task: "t", Round: 7, Device: "d", Model: "m1", Module: "w1"}
	refusedAs(t, "matching", round.CheckHeader(spec, "d", ok), "", "")
	for _, c := range []struct {
		name string
		edit func(*round.Header)
		want string
	}{
		{"another task", func(h *round.Header) { h.Task = "u" }, "report body is for u/7, not t/7"},
		{"another round", func(h *round.Header) { h.Round = 8 }, "report body is for t/8"},
		{"another device (replay of someone else's report)", func(h *round.Header) { h.Device = "e" }, `report body names device "e", subject "d"`},
		{"an old model", func(h *round.Header) { h.Model = "m0" }, `trained on model "m0", round 7 serves "m1"`},
		{"another module", func(h *round.Header) { h.Module = "evil" }, `ran module "evil", task uses "w1"`},
	} {
		h := ok
		c.edit(&h)
		refusedAs(t, c.name, round.CheckHeader(spec, "d", h), round.ClassHeader, c.want)
	}
}

// TestCheckExamples: the weight a device claims (server TestBadReportsAreRefused).
func TestCheckExamples(t *testing.T) {
	seat := round.Seat{Examples: 100}
	refusedAs(t, "within", round.CheckExamples(100, seat), "", "")
	refusedAs(t, "none", round.CheckExamples(0, seat), round.ClassExamples, "num_examples 0 not in [1, 100]")
	refusedAs(t, "more than it declared", round.CheckExamples(1<<40, seat), round.ClassExamples, "not in [1, 100]")
}

// TestCheckMetrics: metrics that would poison the round's mean or the audit
// log (server TestHostileEvaluationRounds, coord FuzzReportChecks).
func TestCheckMetrics(t *testing.T) {
	many := map[string]float64{}
	for i := range round.MaxMetrics + 1 {
		many[strings.Repeat("m", i%60+1)+string(rune('a'+i/60))] = 1
	}
	refusedAs(t, "fine", round.CheckMetrics(map[string]float64{"loss": 0.25, "accuracy": -1e12}), "", "")
	for _, c := range []struct {
		name string
		m    map[string]float64
		want string
	}{
		{"too many", many, "65 metrics, at most 64"},
		{"empty name", map[string]float64{"": 1}, "must be 1-64 bytes"},
		{"long name", map[string]float64{strings.Repeat("l", 65): 1}, "must be 1-64 bytes"},
		{"invalid UTF-8", map[string]float64{"\xff": 1}, "must be 1-64 bytes of UTF-8"},
		{"control character", map[string]float64{"lo\nss": 1}, "control character"},
		{"NaN", map[string]float64{"loss": math.NaN()}, `metric "loss" is NaN`},
		{"infinite", map[string]float64{"loss": math.Inf(-1)}, "-Inf"},
		{"huge", map[string]float64{"loss": 1.7e308}, "at most 1e+12 in magnitude"},
	} {
		refusedAs(t, c.name, round.CheckMetrics(c.m), round.ClassMetrics, c.want)
	}
}

func FuzzCheckMetrics(f *testing.F) {
	f.Add("loss", 0.5)
	f.Add("lo\x00ss", math.Inf(1))
	f.Fuzz(func(t *testing.T, name string, v float64) {
		err := round.CheckMetrics(map[string]float64{name: v})
		if err == nil && (name == "" || len(name) > round.MaxMetricNameSize || !(math.Abs(v) <= round.MaxMetricAbs) ||
			!utf8.ValidString(name) || strings.ContainsFunc(name, unicode.IsControl)) {
			t.Fatalf("accepted %q = %v", name, v)
		}
		if err != nil && !errors.Is(err, round.ErrRefused) {
			t.Fatalf("error without ErrRefused: %v", err)
		}
	})
}

// TestPlainDecide: when a plaintext round closes, and how (server
// TestDropout*, coord round tests end to end).
func TestPlainDecide(t *testing.T) {
	for _, c := range []struct {
		name    string
		p       round.Plain
		outcome round.Outcome
		reason  string
		short   bool
	}{
		{"reports coming in", round.Plain{CohortTarget: 5, ReportGoal: 3, Assigned: 5, Reported: 2, Settled: 2}, round.Wait, "", false},
		{"cohort target reached", round.Plain{CohortTarget: 5, ReportGoal: 3, Assigned: 6, Reported: 5, Settled: 5}, round.Commit, "cohort target 5 reached", false},
		{"everyone reported", round.Plain{ReportGoal: 3, Assigned: 4, Reported: 4, Settled: 4}, round.Commit, "every selected device reported", false},
		{"everyone reported or failed", round.Plain{ReportGoal: 3, Assigned: 5, Reported: 3, Settled: 5}, round.Commit, "every selected device reported or failed", false},
		// A refused device may still send a valid report: below the goal the round waits.
		{"everyone settled below the goal", round.Plain{ReportGoal: 3, Assigned: 4, Reported: 2, Settled: 4}, round.Wait, "", false},
		{"still selecting", round.Plain{ReportGoal: 1, Assigned: 2, Reported: 2, Settled: 2, Selecting: true}, round.Wait, "", false},
		{"deadline with enough", round.Plain{ReportGoal: 2, Assigned: 5, Reported: 3, Settled: 3, DeadlinePassed: true}, round.Commit, "report deadline passed", false},
		{"deadline below the goal", round.Plain{ReportGoal: 3, Assigned: 5, Reported: 1, Settled: 1, DeadlinePassed: true}, round.Abandon,
			"report deadline passed with 1 reports, below the report goal 3", false},
		{"deadline with too few devices", round.Plain{ReportGoal: 3, Assigned: 2, Reported: 2, Settled: 2, DeadlinePassed: true}, round.Abandon,
			"report deadline passed with 2 reports, below the report goal 3", true},
		{"deadline with no reports and no goal", round.Plain{Assigned: 2, DeadlinePassed: true}, round.Abandon,
			"report deadline passed with 0 reports, below the report goal 0", false},
		{"cohort target below the goal", round.Plain{CohortTarget: 2, ReportGoal: 3, Assigned: 3, Reported: 2, Settled: 2}, round.Abandon,
			"cohort target 2 reached with 2 reports, below the report goal 3", false},
	} {
		o, reason, short := c.p.Decide()
		if o != c.outcome || reason != c.reason || short != c.short {
			t.Errorf("%s: %v %q short %v, want %v %q short %v", c.name, o, reason, short, c.outcome, c.reason, c.short)
		}
	}
}
