package servercmd

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/bytesize"
	"github.com/fleetlearn/fleetlearn/pool"
)

const poolTenantHelp = "add a compute pool tenant: `NAME=WEIGHT[,cpu-seconds=N][,gpu-seconds=N][,window=DUR]" +
	"[,quota-cpu=CORES][,quota-memory=BYTES][,quota-gpus=N]` (budgets over a rolling window; memory may end in " +
	"KiB, MiB, GiB or TiB); repeatable; without one, a single tenant \"default\" of weight 1"

// parsePoolTenants reads --pool-tenant values; nil when none were given.
func parsePoolTenants(vals []string) (map[string]pool.Tenant, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	out := map[string]pool.Tenant{}
	for _, v := range vals {
		name, t, err := parsePoolTenant(v)
		if err != nil {
			return nil, usage("--pool-tenant %q: %v", v, err)
		}
		if _, dup := out[name]; dup {
			return nil, usage("--pool-tenant: tenant %s given twice", name)
		}
		out[name] = t
	}
	return out, nil
}

func parsePoolTenant(v string) (string, pool.Tenant, error) {
	var t pool.Tenant
	name, rest, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return "", t, errf("want NAME=WEIGHT, then optional key=value settings")
	}
	parts := strings.Split(rest, ",")
	w, err := strconv.ParseFloat(parts[0], 64)
	if err != nil || !(w > 0) || math.IsInf(w, 0) {
		return "", t, errf("weight %q: want a positive number", parts[0])
	}
	t.Weight = w
	seen := map[string]bool{}
	for _, p := range parts[1:] {
		k, val, ok := strings.Cut(p, "=")
		if !ok || seen[k] {
			return "", t, errf("setting %q: want key=value, each key once", p)
		}
		seen[k] = true
		switch k {
		case "cpu-seconds", "gpu-seconds":
			f, err := strconv.ParseFloat(val, 64)
			if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
				return "", t, errf("%s %q: want a non-negative number", k, val)
			}
			if k == "cpu-seconds" {
				t.Budget.CPUSeconds = f
			} else {
				t.Budget.GPUSeconds = f
			}
		case "window":
			d, err := time.ParseDuration(val)
			if err != nil || d <= 0 {
				return "", t, errf("window %q: want a positive duration such as 24h", val)
			}
			t.Budget.Window = d
		case "quota-cpu", "quota-memory", "quota-gpus":
			if err := parseResource(strings.TrimPrefix(k, "quota-"), val, &t.Quota); err != nil {
				return "", t, errf("%s %q: %v", k, val, err)
			}
		default:
			return "", t, errf("unknown setting %q: want cpu-seconds, gpu-seconds, window, quota-cpu, quota-memory or quota-gpus", k)
		}
	}
	if (t.Budget.CPUSeconds > 0 || t.Budget.GPUSeconds > 0) != (t.Budget.Window > 0) {
		return "", t, errf("a budget needs both a limit (cpu-seconds or gpu-seconds) and a window")
	}
	return name, t, nil
}

// parseResource sets dimension k (cpu in cores, memory in bytes, gpus) of r.
func parseResource(k, val string, r *pool.Resources) error {
	switch k {
	case "cpu":
		f, err := strconv.ParseFloat(val, 64)
		if err != nil || f < 0 || f > 1<<30 || math.IsNaN(f) {
			return fmt.Errorf("want a number of cores")
		}
		r.MilliCPU = int64(math.Round(f * 1000))
	case "memory":
		n, err := bytesize.Parse(val)
		if err != nil {
			return err
		}
		r.Memory = n
	case "gpus":
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("want a non-negative integer")
		}
		r.GPUs = n
	default:
		return fmt.Errorf("unknown resource; want cpu, memory or gpus")
	}
	return nil
}

// parseCapacity reads cpu=CORES,memory=BYTES,gpus=N, each at most once.
func parseCapacity(v string) (pool.Resources, error) {
	var r pool.Resources
	if v == "" {
		return r, nil
	}
	seen := map[string]bool{}
	for _, p := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(p, "=")
		if !ok || seen[k] {
			return r, fmt.Errorf("--pool-kube-capacity %q: want cpu=CORES,memory=BYTES,gpus=N, each key once", v)
		}
		seen[k] = true
		if err := parseResource(k, val, &r); err != nil {
			return r, fmt.Errorf("--pool-kube-capacity: %s %q: %w", k, val, err)
		}
	}
	return r, nil
}

type tenantError string

func (e tenantError) Error() string { return string(e) }

func errf(format string, a ...any) error {
	if len(a) == 0 {
		return tenantError(format)
	}
	return tenantError(fmt.Sprintf(format, a...))
}
