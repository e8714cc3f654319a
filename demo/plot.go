package demo

import (
	"fmt"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
)

// plotAccuracy draws test accuracy per round, with the base model at round 0.
func plotAccuracy(path string, res *Result) error {
	p := plot.New()
	p.Title.Text = "Fleetlearn federated fine-tuning on MNIST"
	p.X.Label.Text = "round"
	p.Y.Label.Text = "test accuracy (%)"
	pts := plotter.XYs{{X: 0, Y: 100 * res.BaseAccuracy}}
	for i, r := range res.Rounds {
		pts = append(pts, plotter.XY{X: float64(i + 1), Y: 100 * r.Accuracy})
	}
	line, points, err := plotter.NewLinePoints(pts)
	if err != nil {
		return err
	}
	base, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 100 * res.BaseAccuracy}, {X: float64(len(res.Rounds)), Y: 100 * res.BaseAccuracy}})
	if err != nil {
		return err
	}
	base.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
	p.Add(plotter.NewGrid(), line, points, base)
	p.Legend.Add("federated model", line, points)
	p.Legend.Add("base model", base)
	p.Legend.Top = true
	p.Legend.Left = true
	return savePNG(p, path)
}

// PrivacyPoint is one demo run of a privacy sweep.
type PrivacyPoint struct {
	NoiseMultiplier float64
	Epsilon         float64
	Accuracy        float64
}

// plotPrivacy draws final test accuracy against ε (log scale), with the
// accuracy without DP and the base model's as reference lines.
func plotPrivacy(path, mechanism string, pts []PrivacyPoint, plain, base float64) error {
	p := plot.New()
	p.Title.Text = "Fleetlearn on MNIST: accuracy vs privacy (" + mechanism + " DP, delta 1e-5)"
	p.X.Label.Text = "epsilon (log scale)"
	p.Y.Label.Text = "final test accuracy (%)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	xy := make(plotter.XYs, len(pts))
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, pt := range pts {
		xy[i] = plotter.XY{X: pt.Epsilon, Y: 100 * pt.Accuracy}
		lo, hi = min(lo, pt.Epsilon), max(hi, pt.Epsilon)
	}
	line, points, err := plotter.NewLinePoints(xy)
	if err != nil {
		return err
	}
	p.Add(plotter.NewGrid(), line, points)
	p.Legend.Add("with DP", line, points)
	for _, ref := range []struct {
		name   string
		acc    float64
		dashes []vg.Length
	}{{"without DP", plain, []vg.Length{vg.Points(6), vg.Points(3)}}, {"base model", base, []vg.Length{vg.Points(1), vg.Points(3)}}} {
		if ref.acc <= 0 {
			continue
		}
		l, err := plotter.NewLine(plotter.XYs{{X: lo, Y: 100 * ref.acc}, {X: hi, Y: 100 * ref.acc}})
		if err != nil {
			return err
		}
		l.Dashes = ref.dashes
		p.Add(l)
		p.Legend.Add(ref.name, l)
	}
	// Accuracy rises with ε: the lower right is free for the legend.
	p.Legend.Top = false
	p.Legend.Left = false
	return savePNG(p, path)
}

// savePNG writes p as a 6x4 inch PNG that appears at path only once whole,
// so that a viewer refreshing on change never shows half an image.
func savePNG(p *plot.Plot, path string) error {
	wt, err := p.WriterTo(6*vg.Inch, 4*vg.Inch, "png")
	if err != nil {
		return fmt.Errorf("plot %s: %w", path, err)
	}
	f, err := atomicfile.Create(path, 0o644)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	defer f.Abort()
	if _, err := wt.WriteTo(f); err != nil {
		return fmt.Errorf("plot %s: %w", path, err)
	}
	if err := f.Commit(); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}
