package runner

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Bounds on the job-declared environment. A spec comes from a job owner the
// worker does not trust; these keep it from pushing the exec call past
// ARG_MAX or smuggling in control characters.
const (
	MaxEnvVars       = 256
	MaxEnvNameBytes  = 128
	MaxEnvValueBytes = 32 << 10
	MaxEnvTotalBytes = 256 << 10
)

// inherited are the only worker variables a rank sees: enough to find
// interpreters and write caches, nothing that could carry the worker's
// credentials.
var inherited = []string{"PATH", "HOME", "LANG"}

// Variables the runner sets. A job may not override them, since a wrong
// RANK or checkpoint path would corrupt the job's own training state.
const (
	EnvCheckpointDir   = "FLEETLEARN_CHECKPOINT_DIR"
	EnvResumeFrom      = "FLEETLEARN_RESUME_FROM"
	EnvSteps           = "FLEETLEARN_STEPS"
	EnvCheckpointEvery = "FLEETLEARN_CHECKPOINT_EVERY"
)

// reservedPrefixes cover torchrun's own families as well as ours, so that a
// job cannot half-configure torch.distributed behind the runner's back.
var reservedPrefixes = []string{"FLEETLEARN_", "TORCHELASTIC_", "MASTER_"}

var reservedNames = []string{
	"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
	"GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
}

// validateJobEnv checks the job's declared variables against the bounds and
// the reserved names.
func validateJobEnv(env map[string]string) error {
	if len(env) > MaxEnvVars {
		return fmt.Errorf("runner: env: %d variables, limit %d: %w", len(env), MaxEnvVars, ErrInvalidEnv)
	}
	total := 0
	for k, v := range env {
		if err := validEnvName(k); err != nil {
			return fmt.Errorf("runner: env: %w", err)
		}
		if isReserved(k) {
			return fmt.Errorf("runner: env: %s is set by the runner: %w", k, ErrInvalidEnv)
		}
		if len(v) > MaxEnvValueBytes {
			return fmt.Errorf("runner: env: %s: value of %d bytes, limit %d: %w", k, len(v), MaxEnvValueBytes, ErrInvalidEnv)
		}
		if strings.ContainsRune(v, 0) {
			return fmt.Errorf("runner: env: %s: value contains NUL: %w", k, ErrInvalidEnv)
		}
		total += len(k) + len(v) + 2
	}
	if total > MaxEnvTotalBytes {
		return fmt.Errorf("runner: env: %d bytes in all, limit %d: %w", total, MaxEnvTotalBytes, ErrInvalidEnv)
	}
	return nil
}

// validEnvName accepts POSIX portable names: [A-Za-z_][A-Za-z0-9_]*.
func validEnvName(k string) error {
	if k == "" || len(k) > MaxEnvNameBytes {
		return fmt.Errorf("name %q: length %d outside 1..%d: %w", k, len(k), MaxEnvNameBytes, ErrInvalidEnv)
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		ok := c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9'
		if !ok {
			return fmt.Errorf("name %q: byte %d (%q) not allowed: %w", k, i, c, ErrInvalidEnv)
		}
	}
	return nil
}

func isReserved(k string) bool {
	if slices.Contains(reservedNames, k) {
		return true
	}
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}

// buildEnv assembles a rank's environment: inherited basics, then the job's
// variables (which may replace the basics), then the runner's own, which
// nothing overrides. The result is sorted so a rank's environment is
// reproducible from its spec.
func buildEnv(s *Spec) []string {
	vars := make(map[string]string)
	for _, k := range inherited {
		if v, ok := os.LookupEnv(k); ok {
			vars[k] = v
		}
	}
	for k, v := range s.Env {
		vars[k] = v
	}
	t := s.Topology
	itoa := strconv.Itoa
	runID := s.RunID
	if runID == "" {
		runID = "none"
	}
	for k, v := range map[string]string{
		"RANK":                       itoa(t.Rank),
		"WORLD_SIZE":                 itoa(t.WorldSize),
		"LOCAL_RANK":                 itoa(t.LocalRank),
		"LOCAL_WORLD_SIZE":           itoa(t.LocalWorldSize),
		"GROUP_RANK":                 itoa(t.GroupRank),
		"GROUP_WORLD_SIZE":           itoa(t.GroupWorldSize),
		"ROLE_RANK":                  itoa(t.Rank),
		"ROLE_WORLD_SIZE":            itoa(t.WorldSize),
		"ROLE_NAME":                  "default",
		"MASTER_ADDR":                t.MasterAddr,
		"MASTER_PORT":                itoa(t.MasterPort),
		"TORCHELASTIC_RESTART_COUNT": itoa(s.RestartCount),
		"TORCHELASTIC_MAX_RESTARTS":  itoa(s.MaxRestarts),
		"TORCHELASTIC_RUN_ID":        runID,
		EnvCheckpointDir:             s.CheckpointDir,
		EnvSteps:                     strconv.FormatInt(s.Steps, 10),
		EnvCheckpointEvery:           strconv.FormatInt(s.CheckpointEvery, 10),
	} {
		vars[k] = v
	}
	if s.ResumeFrom != "" {
		vars[EnvResumeFrom] = s.ResumeFrom
	}
	out := make([]string, 0, len(vars))
	for k, v := range vars {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}
