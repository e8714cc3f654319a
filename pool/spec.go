package pool

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"time"
)

// Bounds on a Spec. They are generous for real training jobs and small
// enough that no arithmetic on them (ranks × resources, steps) can overflow
// an int64.
const (
	MaxNameLen          = 63
	MaxRanks            = 1024
	MaxMilliCPUPerRank  = 512_000       // 512 cores
	MaxMemoryPerRank    = 4 << 40       // 4 TiB
	MaxGPUsPerRank      = 16            // one large host
	MaxRestarts         = 100           // beyond this a job is broken, not unlucky
	MaxTotalSteps       = 1_000_000_000 // a billion optimizer steps
	MinPriority         = -1000
	MaxPriority         = 1000
	MaxDeadlineHorizon  = 366 * 24 * time.Hour
	minMemoryPerRankMiB = 1
)

// Resources is an amount of CPU (millicores), memory (bytes) and GPUs, per
// rank or per worker.
type Resources struct {
	MilliCPU int64
	Memory   int64
	GPUs     int64
}

func (r Resources) add(o Resources) Resources {
	return Resources{r.MilliCPU + o.MilliCPU, r.Memory + o.Memory, r.GPUs + o.GPUs}
}

func (r Resources) sub(o Resources) Resources {
	return Resources{r.MilliCPU - o.MilliCPU, r.Memory - o.Memory, r.GPUs - o.GPUs}
}

func (r Resources) times(n int64) Resources {
	return Resources{r.MilliCPU * n, r.Memory * n, r.GPUs * n}
}

// fits reports whether r fits within avail in every dimension.
func (r Resources) fits(avail Resources) bool {
	return r.MilliCPU <= avail.MilliCPU && r.Memory <= avail.Memory && r.GPUs <= avail.GPUs
}

func (r Resources) nonNegative() bool { return r.MilliCPU >= 0 && r.Memory >= 0 && r.GPUs >= 0 }

func (r Resources) isZero() bool { return r == Resources{} }

func minRes(a, b Resources) Resources {
	return Resources{min(a.MilliCPU, b.MilliCPU), min(a.Memory, b.Memory), min(a.GPUs, b.GPUs)}
}

func (r Resources) String() string {
	return fmt.Sprintf("%dm CPU, %d B, %d GPU", r.MilliCPU, r.Memory, r.GPUs)
}

// Spec is what a client asks for: a gang of identical ranks that train for
// TotalSteps, committing a checkpoint every CheckpointInterval steps.
type Spec struct {
	ID       string
	Tenant   string
	Priority int // higher runs first and may preempt lower at a checkpoint
	Ranks    int // gang size: all start together or none do
	PerRank  Resources
	// MaxRestarts bounds restarts after worker loss or crashes; preemption
	// by the scheduler is not the job's fault and does not count.
	MaxRestarts        int
	CheckpointInterval int64
	TotalSteps         int64
	OutputModel        string
	// Deadline, if set, fails the job when it has not succeeded by then.
	Deadline time.Time
	// NotBefore, if set, keeps the job queued until then (a carbon-aware
	// start); it takes no reservation while it waits.
	NotBefore time.Time
	// Zone, if set, places the job only on workers of that zone.
	Zone string
}

// MaxZoneLen bounds a zone name, as pool/carbon bounds a forecast's.
const MaxZoneLen = 128

// CheckZone allows the names pool/carbon allows in forecasts: 1 to
// MaxZoneLen bytes of letters, digits and - _ . : /.
func CheckZone(z string) error {
	if z == "" || len(z) > MaxZoneLen {
		return fmt.Errorf("zone name length %d outside [1, %d]", len(z), MaxZoneLen)
	}
	for i := 0; i < len(z); i++ {
		c := z[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':' || c == '/') {
			return fmt.Errorf("zone name: byte %#x at %d is not a letter, digit or one of - _ . : /", c, i)
		}
	}
	return nil
}

// Validate checks every field against its bound; submitted is when the
// server accepted the spec, which the deadline must follow.
func (s Spec) Validate(submitted time.Time) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("pool: spec %.64q: %s: %w", s.ID, fmt.Sprintf(format, a...), ErrInvalidSpec)
	}
	for _, f := range []struct{ name, v string }{{"id", s.ID}, {"tenant", s.Tenant}, {"output model", s.OutputModel}} {
		if err := checkName(f.v); err != nil {
			return bad("%s: %v", f.name, err)
		}
	}
	switch {
	case s.Priority < MinPriority || s.Priority > MaxPriority:
		return bad("priority %d outside [%d, %d]", s.Priority, MinPriority, MaxPriority)
	case s.Ranks < 1 || s.Ranks > MaxRanks:
		return bad("ranks %d outside [1, %d]", s.Ranks, MaxRanks)
	case s.PerRank.MilliCPU < 1 || s.PerRank.MilliCPU > MaxMilliCPUPerRank:
		return bad("CPU %dm per rank outside [1, %d]", s.PerRank.MilliCPU, MaxMilliCPUPerRank)
	case s.PerRank.Memory < minMemoryPerRankMiB<<20 || s.PerRank.Memory > MaxMemoryPerRank:
		return bad("memory %d B per rank outside [1 MiB, 4 TiB]", s.PerRank.Memory)
	case s.PerRank.GPUs < 0 || s.PerRank.GPUs > MaxGPUsPerRank:
		return bad("GPUs %d per rank outside [0, %d]", s.PerRank.GPUs, MaxGPUsPerRank)
	case s.MaxRestarts < 0 || s.MaxRestarts > MaxRestarts:
		return bad("max restarts %d outside [0, %d]", s.MaxRestarts, MaxRestarts)
	case s.TotalSteps < 1 || s.TotalSteps > MaxTotalSteps:
		return bad("total steps %d outside [1, %d]", s.TotalSteps, MaxTotalSteps)
	case s.CheckpointInterval < 1 || s.CheckpointInterval > s.TotalSteps:
		return bad("checkpoint interval %d outside [1, total steps]", s.CheckpointInterval)
	}
	if !s.Deadline.IsZero() {
		if !s.Deadline.After(submitted) {
			return bad("deadline %s not after submission %s", s.Deadline.UTC().Format(time.RFC3339), submitted.UTC().Format(time.RFC3339))
		}
		if s.Deadline.Sub(submitted) > MaxDeadlineHorizon {
			return bad("deadline more than %s ahead", MaxDeadlineHorizon)
		}
	}
	if !s.NotBefore.IsZero() {
		if s.NotBefore.Before(submitted.Add(-MaxDeadlineHorizon)) || s.NotBefore.Sub(submitted) > MaxDeadlineHorizon {
			return bad("not-before %s more than %s from submission", s.NotBefore.UTC().Format(time.RFC3339), MaxDeadlineHorizon)
		}
		if !s.Deadline.IsZero() && !s.NotBefore.Before(s.Deadline) {
			return bad("not-before %s is not before the deadline", s.NotBefore.UTC().Format(time.RFC3339))
		}
	}
	if s.Zone != "" {
		if err := CheckZone(s.Zone); err != nil {
			return bad("%v", err)
		}
	}
	return nil
}

// checkName allows DNS-label-like names: they end up in object names,
// metric labels and log lines, where anything richer needs escaping.
func checkName(v string) error {
	if len(v) == 0 || len(v) > MaxNameLen {
		return fmt.Errorf("length %d outside [1, %d]", len(v), MaxNameLen)
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("byte %#x at %d not in [a-z0-9-]", c, i)
		}
	}
	if v[0] == '-' || v[len(v)-1] == '-' {
		return fmt.Errorf("%q starts or ends with '-'", v)
	}
	return nil
}

// specDomain separates spec digests from every other sha256 in Fleetlearn
// and versions the encoding.
const specDomain = "fleetlearn/pool/spec/v1"

// Digest is the hex sha256 of the spec's canonical encoding: fields in a
// fixed order, strings length-prefixed, integers big-endian, the deadline
// in UTC nanoseconds (0 when unset). Model lineage records it, so two specs
// digest alike exactly when they ask for the same work. NotBefore and Zone
// say where and when, not what, so they are left out, and digests of specs
// from before they existed still hold.
func (s Spec) Digest() string {
	h := sha256.New()
	var b [8]byte
	str := func(v string) {
		binary.BigEndian.PutUint64(b[:], uint64(len(v)))
		h.Write(b[:])
		h.Write([]byte(v))
	}
	num := func(v int64) {
		binary.BigEndian.PutUint64(b[:], uint64(v))
		h.Write(b[:])
	}
	str(specDomain)
	str(s.ID)
	str(s.Tenant)
	num(int64(s.Priority))
	num(int64(s.Ranks))
	num(s.PerRank.MilliCPU)
	num(s.PerRank.Memory)
	num(s.PerRank.GPUs)
	num(int64(s.MaxRestarts))
	num(s.CheckpointInterval)
	num(s.TotalSteps)
	str(s.OutputModel)
	var dl int64
	if !s.Deadline.IsZero() {
		dl = s.Deadline.UTC().UnixNano()
	}
	num(dl)
	return hex.EncodeToString(h.Sum(nil))
}

// total is the gang's whole demand.
func (s Spec) total() Resources { return s.PerRank.times(int64(s.Ranks)) }
