package cli

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

func submitRequest(t *testing.T, args ...string) (*pb.SubmitJobRequest, error) {
	t.Helper()
	var f submitFlags
	cmd := &cobra.Command{Use: "submit"}
	f.bind(cmd)
	if err := cmd.ParseFlags(args); err != nil {
		t.Fatal(err)
	}
	return f.request(cmd, cmd.Flags().Args())
}

func TestPoolSubmitFlags(t *testing.T) {
	req, err := submitRequest(t, "--output-model", "base", "--steps", "600", "--ranks", "2", "--cpu", "0.5",
		"--memory", "512MiB", "--dataset", "mnist-train:100:6000", "--arch", "mlp:784,64,10")
	if err != nil {
		t.Fatal(err)
	}
	s := req.GetSpec()
	b := s.GetBuiltin()
	switch {
	case s.GetPerRank().GetMilliCpu() != 500 || s.GetPerRank().GetMemoryBytes() != 512<<20:
		t.Errorf("per rank %v", s.GetPerRank())
	case b.GetDataset().GetSource() != "mnist-train" || b.GetDataset().GetFirst() != 100 || b.GetDataset().GetCount() != 6000:
		t.Errorf("dataset %v", b.GetDataset())
	case len(b.GetArch()) != 3 || b.GetArch()[1] != 64:
		t.Errorf("arch %v", b.GetArch())
	case b.GetSyncEvery() != s.GetCheckpointInterval():
		t.Errorf("sync every %d, want the checkpoint interval %d with 2 ranks", b.GetSyncEvery(), s.GetCheckpointInterval())
	}

	req, err = submitRequest(t, "--output-model", "lm", "--steps", "10", "--env", "A=1", "--", "python3", "train.py")
	if err != nil {
		t.Fatal(err)
	}
	if c := req.GetSpec().GetCommand(); strings.Join(c.GetArgv(), " ") != "python3 train.py" || c.GetEnv()["A"] != "1" {
		t.Errorf("command %v", c)
	}

	req, err = submitRequest(t, "--output-model", "base", "--steps", "10", "--deadline", "24h",
		"--carbon-duration", "2h", "--carbon-watts", "300")
	if err != nil {
		t.Fatal(err)
	}
	if c := req.GetSpec().GetCarbon(); c.GetExpectedDuration().AsDuration() != 2*time.Hour || c.GetExpectedPowerWatts() != 300 || req.GetSpec().GetDeadline() == nil {
		t.Errorf("carbon %v, deadline %v", c, req.GetSpec().GetDeadline())
	}

	req, err = submitRequest(t, "--output-model", "base", "--steps", "300", "--islands", "3", "--inner-steps", "50",
		"--quorum", "2", "--grace", "10s", "--int8")
	if err != nil {
		t.Fatal(err)
	}
	if s, d := req.GetSpec(), req.GetSpec().GetDiloco(); d.GetIslands() != 3 || d.GetInnerSteps() != 50 || d.GetQuorum() != 2 ||
		d.GetGrace().AsDuration() != 10*time.Second || !d.GetInt8() || d.GetOuterMomentum() != 0.9 || s.GetRanks() != 1 ||
		s.GetCheckpointInterval() != 50 || s.GetBuiltin().GetSyncEvery() != 0 {
		t.Errorf("diloco spec %v", s)
	}

	// A registered model brings its layout: the default --arch is not sent
	// with it, an explicit one is.
	req, err = submitRequest(t, "--output-model", "gocode", "--steps", "100", "--init-model", "gocode-init", "--dataset", "dir:public")
	if err != nil {
		t.Fatal(err)
	}
	if b := req.GetSpec().GetBuiltin(); len(b.GetArch()) != 0 || b.GetInitModel() != "gocode-init" {
		t.Errorf("init model job: arch %v, init model %q", b.GetArch(), b.GetInitModel())
	}
	req, err = submitRequest(t, "--output-model", "base", "--steps", "100", "--init-model", "base", "--arch", "mlp:784,64,10")
	if err != nil {
		t.Fatal(err)
	}
	if b := req.GetSpec().GetBuiltin(); len(b.GetArch()) != 3 {
		t.Errorf("init model job with --arch: arch %v", b.GetArch())
	}

	req, err = submitRequest(t, "--output-model", "lm", "--steps", "10", "--executor", "kubernetes", "--", "python3", "train.py")
	if err != nil {
		t.Fatal(err)
	}
	if req.GetSpec().GetExecutor() != pb.PoolExecutor_POOL_EXECUTOR_KUBERNETES {
		t.Errorf("executor %v", req.GetSpec().GetExecutor())
	}

	for name, args := range map[string][]string{
		"kubernetes builtin":      {"--output-model", "x", "--steps", "100", "--executor", "kubernetes"},
		"bad executor":            {"--output-model", "x", "--steps", "100", "--executor", "slurm", "--", "true"},
		"islands without H":       {"--output-model", "x", "--steps", "100", "--islands", "3"},
		"islands with ranks":      {"--output-model", "x", "--steps", "100", "--islands", "3", "--inner-steps", "10", "--ranks", "2"},
		"islands with checkpoint": {"--output-model", "x", "--steps", "100", "--islands", "3", "--inner-steps", "10", "--checkpoint-every", "20"},
		"H without islands":       {"--output-model", "x", "--steps", "100", "--inner-steps", "10"},
		"islands with command":    {"--output-model", "x", "--steps", "100", "--islands", "3", "--", "true"},
		"carbon without deadline": {"--output-model", "x", "--steps", "1", "--carbon-duration", "1h", "--carbon-watts", "10"},
		"carbon without watts":    {"--output-model", "x", "--steps", "1", "--deadline", "2h", "--carbon-duration", "1h"},
		"no steps":                {"--output-model", "x"},
		"bad memory":              {"--output-model", "x", "--steps", "1", "--memory", "lots"},
		"bad dataset":             {"--output-model", "x", "--steps", "1", "--dataset", "mnist-train:-1"},
		"arch with command":       {"--output-model", "x", "--steps", "1", "--arch", "mlp:2,2", "--", "true"},
		"env without cmd":         {"--output-model", "x", "--steps", "1", "--env", "A=1"},
		"bad env":                 {"--output-model", "x", "--steps", "1", "--env", "=1", "--", "true"},
		"bad deadline":            {"--output-model", "x", "--steps", "1", "--deadline", "soon"},
		"zero cpu":                {"--output-model", "x", "--steps", "1", "--cpu", "0"},
	} {
		if _, err := submitRequest(t, args...); !errors.Is(err, ErrUsage) {
			t.Errorf("%s: %v, want a usage error", name, err)
		}
	}
}

func TestParseDataset(t *testing.T) {
	for in, want := range map[string]string{
		"mnist-test":          "mnist-test 0 0",
		"dir:shop-a":          "dir:shop-a 0 0",
		"dir:shop-a:10:20":    "dir:shop-a 10 20",
		"mnist-train:5000":    "mnist-train 5000 0",
		"mnist-train:0:60000": "mnist-train 0 60000",
	} {
		d, err := parseDataset(in)
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if got := strings.Join([]string{d.GetSource(), itoa(d.GetFirst()), itoa(d.GetCount())}, " "); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
	for _, in := range []string{"mnist-train:x", "mnist-train:1:0", "mnist-train:1:-5"} {
		if _, err := parseDataset(in); err == nil {
			t.Errorf("%s accepted", in)
		}
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

func TestLineage(t *testing.T) {
	at := func(s int64) *timestamppb.Timestamp { return timestamppb.New(time.Unix(s, 0)) }
	hex := func(c byte) string { return strings.Repeat(string(c), 64) }
	root := &pb.Model{Ref: &pb.ModelRef{Version: hex('a')}, Name: "base", Source: pb.ModelSource_MODEL_SOURCE_POOL, CreateTime: at(1),
		Lineage: &pb.PoolLineage{JobId: "pretrain-1", SpecDigest: hex('1'), DataSha256: hex('2'), Checkpoint: hex('3'), Steps: 600,
			Usage: &pb.PoolUsage{CpuSeconds: 12.5}}}
	r1 := &pb.Model{Ref: &pb.ModelRef{Version: hex('b'), ParentVersion: hex('a')}, Name: "ft", TaskId: "t-1", Round: 1, CreateTime: at(2),
		Source: pb.ModelSource_MODEL_SOURCE_FEDERATED}
	r2 := &pb.Model{Ref: &pb.ModelRef{Version: hex('c'), ParentVersion: hex('b')}, Name: "ft", TaskId: "t-1", Round: 2, CreateTime: at(3),
		Source: pb.ModelSource_MODEL_SOURCE_FEDERATED}
	// A cycle a hostile or broken registry might serve must not hang.
	loopA := &pb.Model{Ref: &pb.ModelRef{Version: hex('d'), ParentVersion: hex('e')}, Name: "x", CreateTime: at(4)}
	loopB := &pb.Model{Ref: &pb.ModelRef{Version: hex('e'), ParentVersion: hex('d')}, Name: "x", CreateTime: at(5)}
	all := []*pb.Model{r2, r1, root, loopA, loopB}

	l, err := lineageOf(hex('a'), all)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.chain) != 1 || len(l.descendants) != 2 {
		t.Fatalf("chain %d, descendants %d", len(l.chain), len(l.descendants))
	}
	var out bytes.Buffer
	if err := l.print(&out, modelLabels(all)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"pool job pretrain-1: 600 steps", "12.5 CPU-s", "model base@1", "federated task t-1: 2 rounds (1–2), newest model ft@2"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("lineage lacks %q:\n%s", want, out.String())
		}
	}

	l, err = lineageOf(hex('c'), all)
	if err != nil || len(l.chain) != 3 || l.chain[0] != root || len(l.descendants) != 0 {
		t.Fatalf("from the newest: %v, chain %d", err, len(l.chain))
	}
	if l, err = lineageOf(hex('d'), all); err != nil || len(l.chain) != 2 {
		t.Fatalf("cycle: %v", err)
	}
	if _, err := lineageOf(hex('f'), all); err == nil {
		t.Fatal("an unknown version has a lineage")
	}
}
