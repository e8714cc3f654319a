package ui

import (
	"fmt"
	"image/color"
	"net/http"
	"sync"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/internal/lru"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
)

// The privacy card's chart: ε against committed training rounds, as the
// rounds spent it and as the task's own accountant plans it over its
// rounds_total, with the budget.

// maxPlanPoints bounds the accountant runs one plan takes: a PLD run takes
// tens of milliseconds, and a task may plan 20,000 rounds.
const maxPlanPoints = 60

// epsilonSpent is the cumulative ε each committed training round recorded,
// by training step (the rounds that spent privacy, counted from 1).
func epsilonSpent(rs []*pb.RoundSummary) []point {
	var out []point
	for _, r := range rs {
		if r.GetState() != pb.RoundState_ROUND_STATE_COMMITTED || r.GetKind() != pb.RoundKind_ROUND_KIND_TRAIN {
			continue
		}
		out = append(out, point{uint64(len(out) + 1), r.GetEpsilonSpent()})
	}
	return out
}

// epsilonPlan is the task's ε after n = 1…rounds_total training rounds by
// its accountant, at up to maxPlanPoints n evenly spread (the last always
// in); nil where the dashboard cannot compute it: no DP or rounds_total,
// or a distributed mechanism, whose ε depends on the model's size.
func epsilonPlan(t *pb.Task) []point {
	total := int(t.GetRoundsTotal())
	if total == 0 {
		return nil
	}
	acct, err := privacyconf.NewAccounting(t, 0, privacyconf.APINames)
	if err != nil || acct == nil {
		return nil
	}
	var out []point
	step := max(1, (total+maxPlanPoints-1)/maxPlanPoints)
	for n := step; ; n += step {
		n = min(n, total)
		e, err := acct.EpsilonAfter(n)
		if err != nil {
			return nil // ErrSizeUnknown: a distributed mechanism
		}
		out = append(out, point{uint64(n), e})
		if n == total {
			return out
		}
	}
}

// planCache keeps recent tasks' plans: a page's every refresh asks for
// its chart, and a BLT's fit alone takes up to seconds.
type planCache struct {
	mu   sync.Mutex
	tick uint64
	m    map[string]*planEntry // by the task's DP settings and rounds
}

type planEntry struct {
	pts  []point
	used uint64
}

const planCacheSize = 16

func (c *planCache) plan(t *pb.Task) []point {
	key, err := proto.MarshalOptions{Deterministic: true}.Marshal(&pb.Task{Dp: t.GetDp(), RoundsTotal: t.GetRoundsTotal(),
		ReportGoal: t.GetReportGoal(), CohortTarget: t.GetCohortTarget(), Secagg: t.GetSecagg()})
	if err != nil {
		return epsilonPlan(t)
	}
	c.mu.Lock()
	if e, ok := c.m[string(key)]; ok {
		c.tick++
		e.used = c.tick
		c.mu.Unlock()
		return e.pts
	}
	c.mu.Unlock()
	pts := epsilonPlan(t)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*planEntry{}
	}
	if len(c.m) >= planCacheSize {
		lru.DropOldest(c.m, func(e *planEntry) uint64 { return e.used })
	}
	c.tick++
	c.m[string(key)] = &planEntry{pts: pts, used: c.tick}
	return pts
}

var (
	planColor   = color.NRGBA{R: 0x88, G: 0x88, B: 0x88, A: 0xff}
	budgetColor = color.NRGBA{R: 0xc0, G: 0x39, B: 0x2b, A: 0xff}
)

// epsilonChartSVG draws the spent ε (a dot per committed training round,
// in PointColor), the plan (a grey dashed line) and the budget (a red
// line).
func epsilonChartSVG(spent, plan []point, budget float64) ([]byte, error) {
	p := plot.New()
	p.X.Label.Text = "committed training rounds"
	p.Y.Label.Text = "ε"
	p.Add(plotter.NewGrid())
	xys := func(pts []point) plotter.XYs {
		xy := make(plotter.XYs, len(pts))
		for i, q := range pts {
			xy[i] = plotter.XY{X: float64(q.Round), Y: q.Value}
		}
		return xy
	}
	xmax, ymax := 1.0, budget
	if len(plan) > 0 {
		l, err := plotter.NewLine(xys(plan))
		if err != nil {
			return nil, fmt.Errorf("ui: epsilon chart: %w", err)
		}
		l.Color, l.Width, l.Dashes = planColor, vg.Points(1.2), []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		p.Legend.Add("planned", l)
		xmax, ymax = max(xmax, float64(plan[len(plan)-1].Round)), max(ymax, plan[len(plan)-1].Value)
	}
	if len(spent) > 0 {
		l, s, err := plotter.NewLinePoints(xys(spent))
		if err != nil {
			return nil, fmt.Errorf("ui: epsilon chart: %w", err)
		}
		l.Color, l.Width = lineColor, vg.Points(1.5)
		s.Shape, s.Color, s.Radius = draw.CircleGlyph{}, PointColor, vg.Points(2.5)
		p.Add(l, s)
		p.Legend.Add("spent", l, s)
		last := spent[len(spent)-1]
		xmax, ymax = max(xmax, float64(last.Round)), max(ymax, last.Value)
	}
	if budget > 0 {
		l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: budget}, {X: xmax + 0.5, Y: budget}})
		if err != nil {
			return nil, fmt.Errorf("ui: epsilon chart: %w", err)
		}
		l.Color, l.Width = budgetColor, vg.Points(1)
		p.Add(l)
		p.Legend.Add("budget", l)
	}
	// ε grows with the rounds: the upper left, inside the axes, is free.
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(40), -vg.Points(6)
	p.X.Min, p.X.Max = 0, xmax+0.5
	p.Y.Min, p.Y.Max = 0, 1.12*max(ymax, 1e-3)
	b, err := drawSVG(p)
	if err != nil {
		return nil, fmt.Errorf("ui: epsilon chart: %w", err)
	}
	return b, nil
}

func (h *Handler) taskEpsilonChart(w http.ResponseWriter, r *http.Request, v *viewer) {
	id := r.PathValue("id")
	t, err := h.tasks().GetTask(v.ctx(r), &pb.GetTaskRequest{TaskId: id})
	if err != nil {
		h.fail(w, r, v, err)
		return
	}
	rs, err := h.rounds(v.ctx(r), id)
	if err != nil {
		h.fail(w, r, v, err)
		return
	}
	b, err := epsilonChartSVG(epsilonSpent(rs), h.plans.plan(t.GetTask()), t.GetTask().GetDp().GetTargetEpsilon())
	h.writeSVG(w, r, v, b, err)
}
