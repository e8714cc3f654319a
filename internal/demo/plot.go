package demo

import (
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
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
	return p.Save(6*vg.Inch, 4*vg.Inch, path)
}
