package pool

import (
	"fmt"
	"math"
	"time"
)

// Budget caps a tenant's metered use over a rolling window. A zero limit
// leaves that resource uncapped.
type Budget struct {
	CPUSeconds float64
	GPUSeconds float64
	// Window is the rolling period the limits apply to: usage metered in
	// (now-Window, now] counts. Rolling rather than calendar windows, so a
	// tenant cannot spend two periods' budget across a boundary. Zero
	// disables the budget.
	Window time.Duration
}

// Reading is a meter sample for one job: resource-seconds consumed since
// the job's previous reading, at time At.
type Reading struct {
	At         time.Time
	CPUSeconds float64
	GPUSeconds float64
}

type meter struct {
	at       time.Time
	cpu, gpu float64
}

// ledger keeps one tenant's readings for its window.
type ledger struct{ readings []meter }

func (l *ledger) add(r Reading) {
	l.readings = append(l.readings, meter{r.At, r.CPUSeconds, r.GPUSeconds})
}

// used sums the window ending at now, dropping readings that have aged
// out: they can never count again because time does not go back.
func (l *ledger) used(now time.Time, window time.Duration) (cpu, gpu float64) {
	from := now.Add(-window)
	keep := l.readings[:0]
	for _, m := range l.readings {
		if m.at.After(from) {
			keep = append(keep, m)
			if !m.at.After(now) {
				cpu += m.cpu
				gpu += m.gpu
			}
		}
	}
	l.readings = keep
	return cpu, gpu
}

func (r Reading) check() error {
	for _, v := range []float64{r.CPUSeconds, r.GPUSeconds} {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > 1e15 {
			return fmt.Errorf("value %v: %w", v, ErrBadReading)
		}
	}
	if r.At.IsZero() {
		return fmt.Errorf("no time: %w", ErrBadReading)
	}
	return nil
}

// overBudget returns the hold reason, or "" when the tenant is within its
// budget.
func overBudget(tenant string, b Budget, l *ledger, now time.Time) string {
	if b.Window <= 0 || l == nil {
		return ""
	}
	cpu, gpu := l.used(now, b.Window)
	period := fmt.Sprintf("%s ending %s", b.Window, now.UTC().Format(time.RFC3339))
	switch {
	case b.GPUSeconds > 0 && gpu >= b.GPUSeconds:
		return fmt.Sprintf("over budget: tenant %s used %.0f of %.0f GPU-seconds in period %s", tenant, gpu, b.GPUSeconds, period)
	case b.CPUSeconds > 0 && cpu >= b.CPUSeconds:
		return fmt.Sprintf("over budget: tenant %s used %.0f of %.0f CPU-seconds in period %s", tenant, cpu, b.CPUSeconds, period)
	}
	return ""
}
