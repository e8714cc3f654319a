package meter

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/smallfile"
	"github.com/fleetlearn/fleetlearn/worker/internal/detect"
)

// raplZone is one RAPL package counter.
type raplZone struct {
	path     string // energy_uj
	maxRange uint64 // max_energy_range_uj: the counter wraps to 0 past it
	last     uint64
}

// energy accumulates machine-wide energy counters between samples.
type energy struct {
	zones []*raplZone
	uj    float64 // RAPL µJ so far

	smi       string
	clk       clock.Clock
	gpuOK     bool
	lastPower float64 // W, summed over GPUs
	lastAt    time.Time
	gpuJ      float64
}

// newEnergy finds the RAPL package zones under powercap (top-level
// "intel-rapl:N" only: the sub-zones, core and uncore and dram, are parts
// of a package and would count twice) and probes nvidia-smi's power draw.
func newEnergy(powercap, smi string, clk clock.Clock) *energy {
	e := &energy{smi: smi, clk: clk}
	if powercap != "" {
		paths, _ := filepath.Glob(filepath.Join(powercap, "intel-rapl:*"))
		for _, p := range paths {
			if strings.Count(filepath.Base(p), ":") != 1 {
				continue
			}
			z := &raplZone{path: filepath.Join(p, "energy_uj")}
			mr, err1 := readUint(filepath.Join(p, "max_energy_range_uj"))
			v, err2 := readUint(z.path) // readable by root only on most kernels
			if err1 != nil || err2 != nil || mr == 0 {
				continue
			}
			z.maxRange, z.last = mr, v
			e.zones = append(e.zones, z)
		}
	}
	if smi != "" {
		if w, err := gpuPower(smi); err == nil {
			e.gpuOK, e.lastPower, e.lastAt = true, w, clk.Now()
		}
	}
	return e
}

// sample adds the energy since the last sample and returns the total and
// its sources. Sampling at an interval well under a counter's wrap period
// (minutes at full load) is what makes the wraparound correction exact.
func (e *energy) sample() (float64, string) {
	var src []string
	for _, z := range e.zones {
		v, err := readUint(z.path)
		if err != nil {
			continue
		}
		e.uj += float64(wrapDelta(z.last, v, z.maxRange))
		z.last = v
	}
	if len(e.zones) > 0 {
		src = append(src, "rapl")
	}
	if e.gpuOK {
		now := e.clk.Now()
		if w, err := gpuPower(e.smi); err == nil {
			// The trapezoid between two readings of the power.
			e.gpuJ += (e.lastPower + w) / 2 * now.Sub(e.lastAt).Seconds()
			e.lastPower, e.lastAt = w, now
		}
		src = append(src, "nvidia-smi")
	}
	return e.uj/1e6 + e.gpuJ, joinSources(src)
}

// wrapDelta is the counter's advance from last to now, across one wrap.
func wrapDelta(last, now, maxRange uint64) uint64 {
	if now >= last {
		return now - last
	}
	if last > maxRange {
		return now // a counter past its declared range: trust only now
	}
	return maxRange - last + now
}

func readUint(path string) (uint64, error) {
	b, err := smallfile.Read(path, 64)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// gpuPowerTimeout bounds one power query: a sample must not stall the
// meter behind a wedged driver.
const gpuPowerTimeout = 5 * time.Second

// gpuPower is the power drawn by all GPUs now, in watts.
func gpuPower(smi string) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), gpuPowerTimeout)
	defer cancel()
	out, err := detect.RunNvidiaSMI(ctx, smi, "--query-gpu=power.draw", "--format=csv,noheader,nounits")
	if err != nil {
		return 0, err
	}
	return parsePowerDraw(out)
}

// parsePowerDraw sums nvidia-smi's power.draw lines (watts); a GPU that
// reports "[N/A]" makes the whole reading unusable rather than low.
func parsePowerDraw(out []byte) (float64, error) {
	var sum float64
	n := 0
	for line := range strings.SplitSeq(string(out), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		w, err := strconv.ParseFloat(line, 64)
		if err != nil || w < 0 || w > 1e5 {
			return 0, fmt.Errorf("parse power.draw: bad value %.32q", line)
		}
		sum += w
		n++
	}
	if n == 0 {
		return 0, fmt.Errorf("parse power.draw: no GPUs")
	}
	return sum, nil
}
