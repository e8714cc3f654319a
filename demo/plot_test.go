package demo

import (
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

// TestPlotPrivacy: the sweep's plot is a PNG of the expected size, for a
// sweep and for a single point.
func TestPlotPrivacy(t *testing.T) {
	for _, pts := range [][]PrivacyPoint{
		{{0.1, 1294, 0.9648}, {0.3, 182.4, 0.9461}, {1, 30.13, 0.8106}},
		{{1, 30.13, 0.8106}},
	} {
		path := filepath.Join(t.TempDir(), "privacy.png")
		if err := plotPrivacy(path, "central", pts, 0.9695, 0.9134); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if b := img.Bounds(); b.Dx() < 400 || b.Dy() < 250 {
			t.Fatalf("plot is %v", b)
		}
	}
}
