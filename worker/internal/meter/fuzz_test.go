package meter

import (
	"math"
	"testing"

	"github.com/fleetlearn/fleetlearn/internal/seeds"
)

// FuzzParseGPUReading: whatever nvidia-smi prints, the reading is refused
// or is finite, non-negative and within the bounds per GPU line, and the
// error stays short.
func FuzzParseGPUReading(f *testing.F) {
	seeds.AddTo(f, "gpureading", "*.csv")
	f.Fuzz(func(t *testing.T, out []byte) {
		g, err := parseGPUReading(out)
		if err != nil {
			if len(err.Error()) > 512 {
				t.Fatalf("error of %d bytes", len(err.Error()))
			}
			return
		}
		lines := 0
		for _, b := range out {
			if b == '\n' {
				lines++
			}
		}
		lines++
		if math.IsNaN(g.watts) || math.IsNaN(g.busy) || g.watts < 0 || g.busy < 0 ||
			g.watts > 1e5*float64(lines) || g.busy > float64(lines) {
			t.Fatalf("reading %+v from %d lines", g, lines)
		}
	})
}
