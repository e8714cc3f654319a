package ui

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"net/http"
	"regexp"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// point is one committed round's value of a metric.
type point struct {
	Round uint64
	Value float64
}

// series is metric over the task's committed rounds, in round order: one
// point per committed round that reported it.
func series(rs []*pb.RoundSummary, metric string) []point {
	var out []point
	for _, r := range rs {
		if r.GetState() != pb.RoundState_ROUND_STATE_COMMITTED {
			continue
		}
		if v, ok := r.GetMetrics().GetValues()[metric]; ok {
			out = append(out, point{r.GetRound(), v})
		}
	}
	return out
}

// PointColor fills the glyph of each point, and only those: the browser
// tests count the points by it.
var PointColor = color.RGBA{R: 0x1f, G: 0x6f, B: 0xb4, A: 0xff}

var lineColor = color.NRGBA{R: 0x1f, G: 0x6f, B: 0xb4, A: 0x90}

// chartSVG draws a metric's series with gonum/plot as SVG: a line through
// the rounds and a dot per round.
func chartSVG(metric string, pts []point) ([]byte, error) {
	p := plot.New()
	p.X.Label.Text = "round"
	p.Y.Label.Text = metric
	p.Add(plotter.NewGrid())
	xy := make(plotter.XYs, len(pts))
	for i, q := range pts {
		xy[i] = plotter.XY{X: float64(q.Round), Y: q.Value}
	}
	if len(xy) > 0 {
		l, s, err := plotter.NewLinePoints(xy)
		if err != nil {
			return nil, fmt.Errorf("ui: chart %s: %w", metric, err)
		}
		l.Color = lineColor
		l.Width = vg.Points(1.5)
		s.Shape = draw.CircleGlyph{}
		s.Color = PointColor
		s.Radius = vg.Points(2.5)
		p.Add(l, s)
	}
	// Room around the data keeps the first and last dots whole.
	if len(xy) > 0 {
		xmin, xmax, ymin, ymax := plotter.XYRange(xy)
		p.X.Min, p.X.Max = xmin-0.5, xmax+0.5
		pad := 0.08 * (ymax - ymin)
		if pad == 0 {
			pad = 0.05*math.Abs(ymax) + 1e-3
		}
		p.Y.Min, p.Y.Max = ymin-pad, ymax+pad
	}
	b, err := drawSVG(p)
	if err != nil {
		return nil, fmt.Errorf("ui: chart %s: %w", metric, err)
	}
	return b, nil
}

// drawSVG draws a chart by rounds (whole-round ticks on x, precise labels
// on y) at the dashboard's size.
func drawSVG(p *plot.Plot) ([]byte, error) {
	p.X.Tick.Marker = roundTicks{}
	p.Y.Tick.Marker = precise{}
	c := vgsvg.New(6*vg.Inch, 2.6*vg.Inch)
	p.Draw(draw.New(c))
	var b bytes.Buffer
	if _, err := c.WriteTo(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// precise labels gonum/plot's ticks with enough digits to tell them apart:
// its default rounds a loss of 1.02 and 1.04 both to "1".
type precise struct{}

func (precise) Ticks(min, max float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = strconv.FormatFloat(ts[i].Value, 'g', 4, 64)
		}
	}
	return ts
}

// roundTicks marks whole rounds only.
type roundTicks struct{}

func (roundTicks) Ticks(min, max float64) []plot.Tick {
	step := math.Max(1, math.Ceil((max-min)/10))
	var ts []plot.Tick
	for v := math.Ceil(min/step) * step; v <= max; v += step {
		ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', 0, 64)})
	}
	return ts
}

var metricName = regexp.MustCompile(`^[A-Za-z0-9_.\-]{1,64}$`)

func (h *Handler) taskChart(w http.ResponseWriter, r *http.Request, v *viewer) {
	metric := r.PathValue("metric")
	if !metricName.MatchString(metric) {
		http.Error(w, "metric names are letters, digits, '_', '.' and '-'", http.StatusBadRequest)
		return
	}
	rs, err := h.rounds(v.ctx(r), r.PathValue("id"))
	if err != nil {
		h.fail(w, r, v, err)
		return
	}
	b, err := chartSVG(metric, series(rs, metric))
	h.writeSVG(w, r, v, b, err)
}

// writeSVG answers with a chart, or with err.
func (h *Handler) writeSVG(w http.ResponseWriter, r *http.Request, v *viewer, b []byte, err error) {
	if err != nil {
		h.fail(w, r, v, err)
		return
	}
	// An SVG opened on its own is a document: it gets no script and only
	// its own inline styles, which gonum/plot's output uses.
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	w.Header().Set("Content-Type", "image/svg+xml")
	w.Write(b)
}
