package ui

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/privacy/dp"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"/tasks/t-1": "/tasks/t-1", "": "/", "//evil.example": "/", "https://evil.example/": "/",
		"/\\evil.example": "/", "/a\r\nSet-Cookie: x": "/", "tasks": "/",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSameOrigin(t *testing.T) {
	for _, c := range []struct {
		origin, site string
		want         bool
	}{
		{"https://ui.example:8443", "", true},
		{"https://evil.example", "", false},
		{"null", "", false},
		{"", "same-origin", true},
		{"", "cross-site", false},
		{"", "", true}, // not a browser: it holds the token itself
	} {
		r := httptest.NewRequest("POST", "https://ui.example:8443/logout", nil)
		if c.origin != "" {
			r.Header.Set("Origin", c.origin)
		}
		if c.site != "" {
			r.Header.Set("Sec-Fetch-Site", c.site)
		}
		if got := sameOrigin(r); got != c.want {
			t.Errorf("Origin %q Sec-Fetch-Site %q: %v, want %v", c.origin, c.site, got, c.want)
		}
	}
}

func TestReasonClass(t *testing.T) {
	for in, want := range map[string]string{
		"update norm 7.1 exceeds the bound: device dev-3": "update norm 7.1 exceeds the bound",
		"late":                   "late",
		": starts with a colon":  ": starts with a colon",
		strings.Repeat("x", 500): strings.Repeat("x", maxReasonLen) + "…",
	} {
		if got := reasonClass(in); got != want {
			t.Errorf("reasonClass(%.40q) = %.40q, want %.40q", in, got, want)
		}
	}
}

// TestChartPoints: one dot per committed round, and none for rounds that
// did not commit.
func TestChartPoints(t *testing.T) {
	rs := []*pb.RoundSummary{
		{Round: 1, State: pb.RoundState_ROUND_STATE_COMMITTED, Metrics: &pb.Metrics{Values: map[string]float64{"accuracy": 0.5}}},
		{Round: 2, State: pb.RoundState_ROUND_STATE_ABANDONED, Metrics: &pb.Metrics{Values: map[string]float64{"accuracy": 0.1}}},
		{Round: 3, State: pb.RoundState_ROUND_STATE_COMMITTED, Metrics: &pb.Metrics{Values: map[string]float64{"accuracy": 0.7}}},
	}
	pts := series(rs, "accuracy")
	if len(pts) != 2 || pts[1] != (point{3, 0.7}) {
		t.Fatalf("series %v", pts)
	}
	for _, n := range []int{0, 1, 2} {
		svg, err := chartSVG("accuracy", pts[:n])
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Count(strings.ToUpper(string(svg)), "FILL:#1F6FB4"); got != n {
			t.Errorf("%d points drawn as %d dots", n, got)
		}
	}
}

// TestPagesDraw draws every page from empty and from filled data: a
// template that dereferences what an API may leave unset fails here, not
// in front of an operator.
func TestPagesDraw(t *testing.T) {
	h := &Handler{o: options{log: slog.New(slog.NewTextHandler(tWriter{t}, nil))}}
	v := &viewer{CSRF: "x"}
	task := &pb.Task{Id: "t-1", Name: "demo", Dp: &pb.DPConfig{TargetEpsilon: 4, Delta: 1e-5}}
	round := roundRow{RoundSummary: &pb.RoundSummary{Round: 1, Metrics: &pb.Metrics{Values: map[string]float64{"accuracy": 0.9}}},
		Metrics: []metricValue{{"accuracy", 0.9}}}
	job := &pb.PoolJob{Spec: &pb.PoolJobSpec{Id: "j-1"}}
	cases := map[string][]any{
		"login": {loginData{}, loginData{Msg: "m", Next: "/x"}},
		"error": {struct {
			Code int
			Msg  string
		}{500, "boom"}},
		"overview": {overviewData{Fleet: &fleet{}, Checkpoint: &checkpointView{}, Pool: &poolView{}}, overviewData{FleetDenied: &denied{"no"}, TasksDenied: &denied{"no"}, NoPool: true, AuditDenied: &denied{"no"}}, overviewData{Fleet: &fleet{}, Tasks: []taskRow{{Task: task}, {Task: task, Counted: true, roundCounts: roundCounts{Trained: 1, Abandoned: 2}}}, Checkpoint: &checkpointView{Verified: true}, PoolDenied: &denied{"no"}}},
		"devices":  {devicesData{Fleet: &fleet{}}, devicesData{Fleet: &fleet{Devices: []*pb.Device{{Id: "d"}, {Id: "r", RevokeTime: nil}}}, CanRevoke: true}},
		"task":     {&taskData{Task: &pb.Task{}}, &taskData{Task: task, roundCounts: roundCounts{Trained: 1, Evaluated: 1, Abandoned: 1}, DP: true, Budget: 4, Epsilon: 1, Rounds: []roundRow{round}, Charts: []chartRef{{Metric: "accuracy", Points: []point{{1, 0.9}}}}, Refusals: []reasonCount{{"late", 1}}, CanStop: true, CanResume: true}},
		"round":    {roundData{Task: task, Round: round}, roundData{Task: task, Round: round, Denied: &denied{"no"}, Events: []eventView{{Type: "round.opened"}}, Failures: []*pb.DeviceFailure{{DeviceId: "d", Reason: "late"}}}},
		"audit":    {auditData{Checkpoint: &checkpointView{}}, auditData{Checkpoint: &checkpointView{Pending: "none"}}, auditData{Checkpoint: &checkpointView{Verified: true, Witnesses: []witnessView{{Name: "w", Cosigned: true}, {Name: "v", Problem: "p"}}}, Events: []eventView{{Index: 1, Task: "t"}}, Next: "n"}, auditData{Checkpoint: &checkpointView{}, Denied: &denied{"no"}}},
		"entry":    {entryData{Checkpoint: &checkpointView{}}, entryData{Checkpoint: &checkpointView{Pending: "none"}, Problem: "not yet"}, entryData{Checkpoint: &checkpointView{Size: 2}, Included: true, Proof: []string{"ab"}}},
		"pool":     {poolData{NoPool: true}, poolData{poolView: &poolView{}}, poolData{poolView: &poolView{Jobs: []*pb.PoolJob{job, {}}, Workers: []*pb.PoolWorker{{Id: "w"}}, Tenants: []tenantUsage{{Tenant: "a"}}}}},
		"job":      {jobData{Job: &pb.PoolJob{}}, jobData{Job: job, Islands: []*pb.PoolJob{job}, Model: &pb.Model{}, CanCancel: true}},
	}
	for name := range pages {
		if _, ok := cases[name]; !ok {
			t.Errorf("page %s has no case here", name)
		}
	}
	for name, datas := range cases {
		for i, d := range datas {
			w := httptest.NewRecorder()
			h.renderFrame(w, http.StatusOK, name, frame{Viewer: v, Data: d})
			if w.Code != http.StatusOK {
				t.Errorf("%s #%d: %d %s", name, i, w.Code, w.Body.String())
			}
		}
	}
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(b []byte) (int, error) { w.t.Log(string(b)); return len(b), nil }

// TestCollectStopsAtItsLimit: a server that always has another page costs
// a bounded number of calls.
func TestCollectStopsAtItsLimit(t *testing.T) {
	calls := 0
	items, truncated, err := collect(25, func(tok string) ([]int, string, error) {
		calls++
		return make([]int, 10), "more", nil
	})
	if err != nil || !truncated || len(items) != 30 || calls != 3 {
		t.Fatalf("%d items, truncated %v, %d calls, %v", len(items), truncated, calls, err)
	}
	items, truncated, _ = collect(25, func(tok string) ([]int, string, error) { return []int{1}, "", nil })
	if truncated || len(items) != 1 {
		t.Fatalf("one page: %d items, truncated %v", len(items), truncated)
	}
}

// TestPagesEscapePeerText: what devices report about themselves and what
// modules name their metrics reaches the pages escaped.
func TestPagesEscapePeerText(t *testing.T) {
	h := &Handler{o: options{log: slog.New(slog.NewTextHandler(tWriter{t}, nil))}}
	const evil = `<script>alert(1)</script>`
	for name, d := range map[string]any{
		"devices": devicesData{Fleet: &fleet{Devices: []*pb.Device{{Id: "d", Attributes: &pb.DeviceAttributes{DeviceClass: evil, AgentVersion: evil}}}}},
		"task": &taskData{Task: &pb.Task{Name: "t", StateReason: evil}, Rounds: []roundRow{{RoundSummary: &pb.RoundSummary{Round: 1, Reason: evil},
			Metrics: []metricValue{{evil, 1}}}}, Refusals: []reasonCount{{evil, 1}}, Charts: []chartRef{{Metric: evil}}},
		"round": roundData{Task: &pb.Task{}, Round: roundRow{RoundSummary: &pb.RoundSummary{Round: 1}},
			Failures: []*pb.DeviceFailure{{DeviceId: evil, Reason: evil}}, Events: []eventView{{Payload: evil, Actor: evil}}},
		"entry": entryData{Checkpoint: &checkpointView{}, Event: eventView{Payload: `{"x":"` + evil + `"}`}},
	} {
		w := httptest.NewRecorder()
		h.renderFrame(w, http.StatusOK, name, frame{Viewer: &viewer{}, Data: d})
		if w.Code != http.StatusOK || strings.Contains(w.Body.String(), "<script>alert") {
			t.Errorf("%s: %d, raw script in the page: %v", name, w.Code, strings.Contains(w.Body.String(), "<script>alert"))
		}
	}
}

// TestEpsilonChart: the spent ε is one dot per committed training round
// (evaluation and abandoned rounds spend none), the plan is the task's
// accountant's over rounds_total at no more than maxPlanPoints rounds, and
// a distributed mechanism has none.
func TestEpsilonChart(t *testing.T) {
	rs := []*pb.RoundSummary{
		{Round: 1, Kind: pb.RoundKind_ROUND_KIND_TRAIN, State: pb.RoundState_ROUND_STATE_COMMITTED, EpsilonSpent: 0.5},
		{Round: 2, Kind: pb.RoundKind_ROUND_KIND_EVALUATE, State: pb.RoundState_ROUND_STATE_COMMITTED, EpsilonSpent: 0.5},
		{Round: 3, Kind: pb.RoundKind_ROUND_KIND_TRAIN, State: pb.RoundState_ROUND_STATE_ABANDONED, EpsilonSpent: 0.5},
		{Round: 4, Kind: pb.RoundKind_ROUND_KIND_TRAIN, State: pb.RoundState_ROUND_STATE_COMMITTED, EpsilonSpent: 0.8},
	}
	spent := epsilonSpent(rs)
	if len(spent) != 2 || spent[1] != (point{2, 0.8}) {
		t.Fatalf("spent %v", spent)
	}
	task := &pb.Task{RoundsTotal: 200, ReportGoal: 10, Dp: &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN,
		ClipNorm: 1, NoiseMultiplier: 1, TargetEpsilon: 8, Delta: 1e-5}}
	plan := epsilonPlan(task)
	if len(plan) == 0 || len(plan) > maxPlanPoints || plan[len(plan)-1].Round != 200 {
		t.Fatalf("plan of %d points ending at %v", len(plan), plan[len(plan)-1])
	}
	want, err := dp.Epsilon([]dp.Event{{Q: 1, NoiseMultiplier: 1, Steps: 200}}, 1e-5)
	if err != nil || plan[len(plan)-1].Value != want {
		t.Fatalf("ε after 200 rounds planned %v, accountant %v (%v)", plan[len(plan)-1].Value, want, err)
	}
	for i := 1; i < len(plan); i++ {
		if plan[i].Value < plan[i-1].Value {
			t.Fatalf("plan falls at %v", plan[i])
		}
	}
	var c planCache
	if again := c.plan(task); len(again) != len(plan) || c.plan(task)[0] != plan[0] {
		t.Fatalf("cached plan %v", again)
	}
	dist := proto.CloneOf(task)
	dist.Secagg, dist.Dp.Mechanism = &pb.SecAggConfig{}, pb.DPMechanism_DP_MECHANISM_SKELLAM
	if p := epsilonPlan(dist); p != nil {
		t.Fatalf("a distributed mechanism's plan without the model's size: %v", p)
	}
	svg, err := epsilonChartSVG(spent, plan, 8)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(strings.ToUpper(string(svg)), "FILL:#1F6FB4"); got != len(spent)+1 { // and the legend's glyph
		t.Errorf("%d spent rounds drawn as %d dots", len(spent), got)
	}
	if _, err := epsilonChartSVG(nil, nil, 0); err != nil {
		t.Fatalf("an empty chart: %v", err)
	}
}

// TestAsyncView: an async task's card reads its last committed buffer; an
// abandoned one after it, or a task in rounds, changes nothing.
func TestAsyncView(t *testing.T) {
	cfg := &pb.AsyncConfig{Concurrency: 50, Buffer: 10, MaxStaleness: 4}
	committed := func(round uint64, mean, maxS, training float64) *pb.RoundSummary {
		return &pb.RoundSummary{Round: round, State: pb.RoundState_ROUND_STATE_COMMITTED, Metrics: &pb.Metrics{Values: map[string]float64{
			"async_staleness_mean": mean, "async_staleness_max": maxS, "async_training": training, "train_loss": 1}}}
	}
	rs := []*pb.RoundSummary{committed(1, 0.5, 2, 40), committed(2, 1.5, 3, 48),
		{Round: 3, State: pb.RoundState_ROUND_STATE_ABANDONED, Reason: "restarted"}}
	v := asyncViewOf(&pb.Task{Async: cfg}, rs)
	if !v.Last || v.Version != 2 || v.StaleMean != 1.5 || v.StaleMax != 3 || v.Training != 48 || v.Buffer != 10 {
		t.Fatalf("%+v", v)
	}
	if v := asyncViewOf(&pb.Task{Async: cfg}, nil); v == nil || v.Last {
		t.Fatalf("no rounds: %+v", v)
	}
	if v := asyncViewOf(&pb.Task{}, rs); v != nil {
		t.Fatalf("a task in rounds: %+v", v)
	}
}
