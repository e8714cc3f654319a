package poolsvc

import (
	"math"
	"strings"
	"time"

	"github.com/fleetlearn/fleetlearn/pool"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Bounds on a job's program.
const (
	maxArchLayers = 16
	maxLayerWidth = 1 << 16
	maxParams     = 100_000_000
	maxBatch      = 1 << 16
	maxArgs       = 256
	maxArgBytes   = 4096
	maxArgvBytes  = 64 << 10
	maxEnv        = 128
	maxEnvKey     = 256
	maxEnvValue   = 4096
)

// reservedEnv are the variables the worker sets for every rank.
var reservedEnv = map[string]bool{"RANK": true, "WORLD_SIZE": true, "LOCAL_RANK": true, "LOCAL_WORLD_SIZE": true,
	"GROUP_RANK": true, "GROUP_WORLD_SIZE": true, "MASTER_ADDR": true, "MASTER_PORT": true,
	"TORCHELASTIC_RESTART_COUNT": true, "PATH": true, "HOME": true, "LANG": true}

// specOf converts and validates the wire spec.
func specOf(in *pb.PoolJobSpec, now time.Time) (pool.Spec, error) {
	r := in.GetPerRank()
	sp := pool.Spec{ID: in.GetId(), Tenant: in.GetTenant(), Priority: int(in.GetPriority()), Ranks: int(min(in.GetRanks(), pool.MaxRanks+1)),
		PerRank:     pool.Resources{MilliCPU: r.GetMilliCpu(), Memory: r.GetMemoryBytes(), GPUs: r.GetGpus()},
		MaxRestarts: int(min(in.GetMaxRestarts(), pool.MaxRestarts+1)), CheckpointInterval: in.GetCheckpointInterval(),
		TotalSteps: in.GetTotalSteps(), OutputModel: in.GetOutputModel()}
	if in.GetDeadline() != nil {
		if err := in.GetDeadline().CheckValid(); err != nil {
			return pool.Spec{}, invalidf("spec.deadline: %v", err)
		}
		sp.Deadline = in.GetDeadline().AsTime()
	}
	if err := sp.Validate(now); err != nil {
		return pool.Spec{}, invalidf("spec: %v", err)
	}
	return sp, nil
}

// checkProgram bounds what each rank runs.
func checkProgram(in *pb.PoolJobSpec) error {
	switch {
	case in.GetBuiltin() != nil:
		return checkBuiltin(in.GetBuiltin(), in)
	case in.GetCommand() != nil:
		return checkCommand(in.GetCommand())
	}
	return invalidf("spec: set the program: builtin (the worker's trainer) or command (argv to run)")
}

func checkBuiltin(b *pb.PoolBuiltinTrainer, in *pb.PoolJobSpec) error {
	arch := b.GetArch()
	// A registered model brings its own layout, an MLP's or a language
	// model's (which no list of widths describes), so arch may be left out.
	ownLayout := len(arch) == 0 && b.GetInitModel() != ""
	if !ownLayout && (len(arch) < 2 || len(arch) > maxArchLayers) {
		return invalidf("spec.builtin.arch: %d layers; want 2 to %d widths, input first", len(arch), maxArchLayers)
	}
	var params int64
	for i, w := range arch {
		if w < 1 || w > maxLayerWidth {
			return invalidf("spec.builtin.arch[%d]: width %d outside [1, %d]", i, w, maxLayerWidth)
		}
		if i > 0 {
			params += int64(arch[i-1])*int64(w) + int64(w)
		}
	}
	if params > maxParams {
		return invalidf("spec.builtin.arch: %d parameters, at most %d", params, maxParams)
	}
	if b.GetBatchSize() < 1 || b.GetBatchSize() > maxBatch {
		return invalidf("spec.builtin.batch_size %d outside [1, %d]", b.GetBatchSize(), maxBatch)
	}
	if lr := b.GetLearningRate(); math.IsNaN(lr) || lr <= 0 || lr > 10 {
		return invalidf("spec.builtin.learning_rate %v: want a number in (0, 10]", lr)
	}
	se := b.GetSyncEvery()
	switch {
	case se < 0:
		return invalidf("spec.builtin.sync_every %d is negative", se)
	case in.GetRanks() > 1 && se == 0:
		return invalidf("spec.builtin.sync_every: a job of %d ranks must average its ranks; set it to a divisor of checkpoint_interval", in.GetRanks())
	case se > 0 && in.GetCheckpointInterval()%se != 0:
		return invalidf("spec.builtin.sync_every %d does not divide checkpoint_interval %d", se, in.GetCheckpointInterval())
	}
	ds := b.GetDataset()
	if err := checkSource(ds.GetSource()); err != nil {
		return err
	}
	if ds.GetFirst() < 0 || ds.GetCount() < 0 || ds.GetFirst() > 1<<40 || ds.GetCount() > 1<<40 {
		return invalidf("spec.builtin.dataset: first %d and count %d must be in [0, 2^40]", ds.GetFirst(), ds.GetCount())
	}
	if s := ds.GetSha256(); s != "" && !isHex64(s) {
		return invalidf("spec.builtin.dataset.sha256: want 64 lowercase hex digits, or empty")
	}
	if m := b.GetInitModel(); m != "" && !isHex64(m) {
		return invalidf("spec.builtin.init_model: want a model version (64 lowercase hex digits), or empty")
	}
	return nil
}

func checkSource(src string) error {
	switch src {
	case "mnist-train", "mnist-test":
		return nil
	}
	name, ok := strings.CutPrefix(src, "dir:")
	if !ok || name == "" || len(name) > 255 || name == "." || name == ".." || strings.ContainsFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.')
	}) {
		return invalidf("spec.builtin.dataset.source %.80q: want mnist-train, mnist-test or dir:NAME (NAME of letters, digits, '-', '_', '.')", src)
	}
	return nil
}

func checkCommand(c *pb.PoolCommand) error {
	argv := c.GetArgv()
	if len(argv) == 0 || len(argv) > maxArgs || argv[0] == "" {
		return invalidf("spec.command.argv: %d arguments; want a program and at most %d arguments", len(argv), maxArgs-1)
	}
	total := 0
	for i, a := range argv {
		total += len(a)
		if err := checkText("spec.command.argv["+itoa(i)+"]", a, maxArgBytes); err != nil {
			return err
		}
	}
	if total > maxArgvBytes {
		return invalidf("spec.command.argv: %d bytes, at most %d", total, maxArgvBytes)
	}
	if len(c.GetEnv()) > maxEnv {
		return invalidf("spec.command.env: %d variables, at most %d", len(c.GetEnv()), maxEnv)
	}
	for k, v := range c.GetEnv() {
		if !envName(k) || len(k) > maxEnvKey {
			return invalidf("spec.command.env: name %.64q: want [A-Za-z_][A-Za-z0-9_]* of at most %d bytes", k, maxEnvKey)
		}
		if reservedEnv[k] || strings.HasPrefix(k, "FLEETLEARN_") {
			return invalidf("spec.command.env: %s is set by the worker for every rank; choose another name", k)
		}
		if err := checkText("spec.command.env["+k+"]", v, maxEnvValue); err != nil {
			return err
		}
	}
	return nil
}

func envName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// checkThenTask checks the shape of a task to create on success; the task
// service validates it in full then.
func checkThenTask(t *pb.Task) error {
	if t == nil {
		return nil
	}
	if t.GetModel().GetVersion() != "" || t.GetModel().GetSha256() != "" {
		return invalidf("then_task.model: leave it empty; the job's output model becomes the task's base model")
	}
	if n := t.GetName(); n == "" || len(n) > 128 || strings.ContainsFunc(n, func(r rune) bool { return r < 0x21 || r == 0x7f }) {
		return invalidf("then_task.name %.64q: want a name of at most 128 printable bytes", n)
	}
	if !isHex64(t.GetModule().GetSha256()) {
		return invalidf("then_task.module.sha256: want the registered module's SHA-256 (64 lowercase hex digits)")
	}
	if t.GetId() != "" {
		return invalidf("then_task.id: leave it empty; the server assigns task ids")
	}
	return nil
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}
