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

	smi     string
	clk     clock.Clock
	gpuOK   bool
	last    gpuReading // summed over GPUs
	lastAt  time.Time
	gpuJ    float64
	gpuBusy float64 // GPU-seconds at full utilization
}

// gpuReading is one nvidia-smi reading, summed over the machine's GPUs:
// power in watts, and utilization as a number of fully busy GPUs (two GPUs
// at 40% read 0.8).
type gpuReading struct {
	watts, busy float64
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
		if g, err := readGPUs(smi); err == nil {
			e.gpuOK, e.last, e.lastAt = true, g, clk.Now()
		}
	}
	return e
}

// gpuSeconds is the GPUs' busy time so far (utilization × seconds, summed
// over GPUs), and whether nvidia-smi measures it.
func (e *energy) gpuSeconds() (float64, bool) { return e.gpuBusy, e.gpuOK }

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
		if g, err := readGPUs(e.smi); err == nil {
			// The trapezoid between two readings.
			dt := now.Sub(e.lastAt).Seconds()
			e.gpuJ += (e.last.watts + g.watts) / 2 * dt
			e.gpuBusy += (e.last.busy + g.busy) / 2 * dt
			e.last, e.lastAt = g, now
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

// GPUQuery is what the meter asks nvidia-smi at every sample: each GPU's
// power draw (W) and utilization (%), one GPU a line, as its documented
// CSV output gives them ("71.23, 87").
var GPUQuery = []string{"--query-gpu=power.draw,utilization.gpu", "--format=csv,noheader,nounits"}

// readGPUs is the GPUs' power and utilization now, summed over GPUs.
func readGPUs(smi string) (gpuReading, error) {
	ctx, cancel := context.WithTimeout(context.Background(), gpuPowerTimeout)
	defer cancel()
	out, err := detect.RunNvidiaSMI(ctx, smi, GPUQuery...)
	if err != nil {
		return gpuReading{}, err
	}
	return parseGPUReading(out)
}

// parseGPUReading sums nvidia-smi's power.draw, utilization.gpu lines; a
// GPU that reports "[N/A]" or anything out of range makes the whole
// reading unusable rather than low.
func parseGPUReading(out []byte) (gpuReading, error) {
	var sum gpuReading
	n := 0
	for line := range strings.SplitSeq(string(out), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		p, u, ok := strings.Cut(line, ",")
		w, err1 := strconv.ParseFloat(strings.TrimSpace(p), 64)
		pct, err2 := strconv.ParseFloat(strings.TrimSpace(u), 64)
		if !ok || err1 != nil || err2 != nil || !(w >= 0 && w <= 1e5) || !(pct >= 0 && pct <= 100) {
			return gpuReading{}, fmt.Errorf("parse power.draw, utilization.gpu: bad line %.32q", line)
		}
		sum.watts += w
		sum.busy += pct / 100
		n++
	}
	if n == 0 {
		return gpuReading{}, fmt.Errorf("parse power.draw, utilization.gpu: no GPUs")
	}
	return sum, nil
}
