package detect

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// ErrNoNvidiaSMI reports a machine without nvidia-smi on PATH: no NVIDIA
// GPUs to offer.
var ErrNoNvidiaSMI = errors.New("nvidia-smi not found")

const (
	// smiTimeout bounds a query when ctx has no sooner deadline: a wedged
	// driver makes nvidia-smi hang, and the agent must still come up.
	smiTimeout = 30 * time.Second
	// smiOutputLimit bounds what is read from nvidia-smi: a few hundred
	// bytes a GPU is the real figure.
	smiOutputLimit = 64 << 10
	// maxGPUs is more than any machine holds; more lines is garbage.
	maxGPUs = 256
)

// GPUQuery is the nvidia-smi argument list whose output ParseNvidiaSMI
// reads.
var GPUQuery = []string{"--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"}

// NvidiaGPUs lists the GPUs through nvidia-smi (smi, or the one on PATH
// when smi is ""). It wraps ErrNoNvidiaSMI where there is none.
func NvidiaGPUs(ctx context.Context, smi string) ([]GPU, error) {
	out, err := RunNvidiaSMI(ctx, smi, GPUQuery...)
	if err != nil {
		return nil, err
	}
	return ParseNvidiaSMI(out)
}

// RunNvidiaSMI runs nvidia-smi with args and returns its standard output,
// bounded in size and in time.
func RunNvidiaSMI(ctx context.Context, smi string, args ...string) ([]byte, error) {
	if smi == "" {
		p, err := exec.LookPath("nvidia-smi")
		if err != nil {
			return nil, fmt.Errorf("gpu query: %w", ErrNoNvidiaSMI)
		}
		smi = p
	}
	ctx, cancel := context.WithTimeout(ctx, smiTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, smi, args...)
	stdout := &boundedBuffer{limit: smiOutputLimit}
	stderr := &boundedBuffer{limit: 4 << 10}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// A child that inherited the pipes must not keep Wait waiting.
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("gpu query: %s: %w", smi, ctx.Err())
	}
	if stdout.over {
		return nil, fmt.Errorf("gpu query: %s wrote more than %d bytes", smi, smiOutputLimit)
	}
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = strings.TrimSpace(stdout.String())
		}
		return nil, fmt.Errorf("gpu query: %s: %w: %s", smi, err, truncate([]byte(msg)))
	}
	return stdout.buf.Bytes(), nil
}

// boundedBuffer keeps the first limit bytes. A write past the limit fails,
// which closes the pipe: a child that floods it dies of SIGPIPE instead of
// running on until the timeout.
type boundedBuffer struct {
	buf   bytes.Buffer // not embedded: io.Copy would use its ReadFrom, unbounded
	limit int
	over  bool
}

var errOverflow = errors.New("output over its bound")

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if room := b.limit - b.buf.Len(); len(p) > room {
		b.over = true
		b.buf.Write(p[:max(room, 0)])
		return max(room, 0), errOverflow
	}
	return b.buf.Write(p)
}

func (b *boundedBuffer) String() string { return b.buf.String() }

// ParseNvidiaSMI reads the CSV that GPUQuery asks for: one GPU a line,
// "index, uuid, name, memory.total (MiB)".
func ParseNvidiaSMI(out []byte) ([]GPU, error) {
	var gpus []GPU
	seen := map[string]bool{}
	for i, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if len(gpus) == maxGPUs {
			return nil, fmt.Errorf("parse nvidia-smi: more than %d GPUs", maxGPUs)
		}
		g, err := parseGPULine(line)
		if err != nil {
			return nil, fmt.Errorf("parse nvidia-smi: line %d: %w", i+1, err)
		}
		if seen[g.UUID] {
			return nil, fmt.Errorf("parse nvidia-smi: line %d: duplicate uuid %q", i+1, g.UUID)
		}
		seen[g.UUID] = true
		gpus = append(gpus, g)
	}
	return gpus, nil
}

func parseGPULine(line string) (GPU, error) {
	// A name may hold a comma; the fields around it cannot.
	f := strings.SplitN(line, ",", 3)
	if len(f) == 3 {
		if i := strings.LastIndexByte(f[2], ','); i >= 0 {
			f = append(f[:2], f[2][:i], f[2][i+1:])
		}
	}
	if len(f) != 4 {
		return GPU{}, fmt.Errorf("want 4 fields, got %d in %q", len(f), truncate([]byte(line)))
	}
	for i := range f {
		f[i] = strings.TrimSpace(f[i])
	}
	idx, err := strconv.Atoi(f[0])
	if err != nil || idx < 0 || idx >= maxGPUs {
		return GPU{}, fmt.Errorf("bad index %q", truncate([]byte(f[0])))
	}
	uuid := f[1]
	if !strings.HasPrefix(uuid, "GPU-") || len(uuid) > 64 || !printable(uuid) {
		return GPU{}, fmt.Errorf("bad uuid %q", truncate([]byte(uuid)))
	}
	name := f[2]
	if name == "" || len(name) > 128 || !printable(name) {
		return GPU{}, fmt.Errorf("bad name %q", truncate([]byte(name)))
	}
	mib, err := strconv.ParseUint(f[3], 10, 32)
	if err != nil {
		return GPU{}, fmt.Errorf("bad memory.total %q (MiB)", truncate([]byte(f[3])))
	}
	return GPU{Index: idx, UUID: uuid, Name: name, MemoryBytes: mib << 20}, nil
}

func printable(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r == '\uFFFD' {
			return false
		}
	}
	return true
}
