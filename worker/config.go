package worker

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/fleetlearn/fleetlearn/internal/clock"
	poolspec "github.com/fleetlearn/fleetlearn/pool"
)

// Config is how an Agent joins a pool.
type Config struct {
	// Server is the pool server's gRPC address, HOST:PORT.
	Server string
	// CAPEM is the server's CA certificate (its tls/ca.crt); nil trusts
	// the system roots.
	CAPEM []byte
	// Token is a pool-worker API token.
	Token string
	// Insecure connects without TLS, to a server run with --grpc-insecure.
	Insecure bool
	// Name is the host name shown to operators; os.Hostname when empty.
	Name string
	// Zone is the grid region or cloud location the worker runs in, named
	// as the server's carbon forecast names it; carbon-aware jobs run only
	// in the zone planned for them. Empty declares none.
	Zone string
	// Capacity is what the worker offers. Zero MilliCPU or MemoryBytes are
	// detected (detect.Detect: affinity, cgroup limits, nvidia-smi); with
	// both set nothing is detected and GPUModels are the GPUs offered.
	Capacity Capacity
	// WorkDir (absolute or relative; made absolute) holds one directory
	// per rank: its lease file, working and checkpoint directories.
	WorkDir string
	// DataRoot holds the data directories that "dir:NAME" datasets name.
	DataRoot string
	// RankCommand runs a built-in trainer rank; the agent appends
	// "--lease FILE". Default: this executable with the hidden "rank"
	// command, which must call RunRank.
	RankCommand []string
	// Logger receives the agent's own log; slog.Default when nil.
	Logger *slog.Logger
	// Clock paces heartbeats' back-off, log flushes and metering.
	Clock clock.Clock
}

// Capacity is what a worker offers to jobs.
type Capacity struct {
	MilliCPU    int64
	MemoryBytes int64
	GPUModels   []string
}

func (c *Config) check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("worker: config: "+format+": %w", append(a, ErrConfig)...)
	}
	switch {
	case c.Server == "" || strings.ContainsAny(c.Server, " \t\r\n/"):
		return bad("server address %q: want HOST:PORT, the server's gRPC address (port 7070 by default)", c.Server)
	case c.Token == "":
		return bad("no token: mint a pool-worker token on the server host with 'fleetlearn token mint --data-dir DIR --subject NAME --role pool-worker'")
	case c.Insecure && len(c.CAPEM) > 0:
		return bad("a CA certificate and an insecure connection together")
	case c.WorkDir == "":
		return bad("no work directory")
	case c.Capacity.MilliCPU < 0 || c.Capacity.MemoryBytes < 0:
		return bad("negative capacity")
	case len(c.Capacity.GPUModels) > 64:
		return bad("%d GPUs, at most 64", len(c.Capacity.GPUModels))
	}
	if c.Zone != "" {
		if err := poolspec.CheckZone(c.Zone); err != nil {
			return bad("zone %.64q: %v", c.Zone, err)
		}
	}
	if len(c.RankCommand) > 0 && c.RankCommand[0] == "" {
		return bad("rank command with an empty program")
	}
	var err error
	if c.WorkDir, err = filepath.Abs(c.WorkDir); err != nil {
		return bad("work directory: %v", err)
	}
	if c.DataRoot != "" {
		if c.DataRoot, err = filepath.Abs(c.DataRoot); err != nil {
			return bad("data root: %v", err)
		}
	}
	return nil
}
