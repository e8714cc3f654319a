package kube

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/fleetlearn/fleetlearn/pool"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

var update = flag.Bool("update", false, "rewrite testdata/*.yaml from the current rendering")

const gib = 1 << 30

func testConfig() Config {
	return Config{Namespace: "fleetlearn-pool", Image: "ghcr.io/fleetlearn/trainer:1.4.0", CheckpointClaim: "pool-checkpoints",
		RetryableExitCodes: []int32{143, 137}}
}

func testQueueConfig() QueueConfig {
	return QueueConfig{Namespace: "fleetlearn-pool", Cohort: "fleetlearn",
		GPUNodeLabels: map[string]string{"nvidia.com/gpu.present": "true"},
		Capacity:      pool.Resources{MilliCPU: 256_000, Memory: 1024 * gib, GPUs: 16}}
}

// testTenant leaves GPUs uncapped, so its ClusterQueue gets the pool's 16.
func testTenant() pool.Tenant {
	return pool.Tenant{Weight: 2.5, Quota: pool.Resources{MilliCPU: 64_000, Memory: 256 * gib}}
}

// cpuJob is a one-rank CPU job on its first attempt.
func cpuJob() *pb.PoolJob {
	return &pb.PoolJob{Attempt: 1, SubmitTime: timestamppb.New(mustTime("2026-05-01T10:00:00Z")), Spec: &pb.PoolJobSpec{
		Id: "mnist-cpu", Tenant: "research", Ranks: 1, MaxRestarts: 2, CheckpointInterval: 10, TotalSteps: 100, OutputModel: "mnist",
		PerRank: &pb.PoolResources{MilliCpu: 500, MemoryBytes: 512 << 20},
		Program: &pb.PoolJobSpec_Command{Command: &pb.PoolCommand{
			Argv: []string{"python3", "train.py", "--tag", "$(HOME)"},
			Env:  map[string]string{"PYTHONUNBUFFERED": "1", "DATA": "/data/$mnist"}}}}}
}

// gpuJob is a four-rank GPU job on its third attempt, resuming at step 2000.
func gpuJob() *pb.PoolJob {
	return &pb.PoolJob{Attempt: 3, CommittedStep: 2000, SubmitTime: timestamppb.New(mustTime("2026-05-01T10:00:00Z")), Spec: &pb.PoolJobSpec{
		Id: "llm-pretrain", Tenant: "research", Priority: 10, Ranks: 4, MaxRestarts: 5, CheckpointInterval: 500, TotalSteps: 10_000,
		OutputModel: "llm", PerRank: &pb.PoolResources{MilliCpu: 8000, MemoryBytes: 64 * gib, Gpus: 2},
		Program: &pb.PoolJobSpec_Command{Command: &pb.PoolCommand{Argv: []string{"torchrun-entry", "--config", "llm.yaml"}}}}}
}

// checkGolden compares the YAML of objs with testdata/name, or rewrites it
// with -update.
func checkGolden(t *testing.T, name string, objs ...runtime.Object) []map[string]any {
	t.Helper()
	var buf bytes.Buffer
	var maps []map[string]any
	for i, o := range objs {
		m, err := ToUnstructured(o)
		if err != nil {
			t.Fatal(err)
		}
		maps = append(maps, m)
		b, err := yaml.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			buf.WriteString("---\n")
		}
		buf.Write(b)
	}
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to write it)", err, t.Name())
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("%s differs from the rendering; if the change is intended run go test -update.\ngot:\n%s", path, buf.String())
	}
	return maps
}

func mustTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}
