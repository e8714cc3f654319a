package kube

import (
	"errors"
	"math"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"

	"github.com/fleetlearn/fleetlearn/pool"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

func TestRenderGoldenCPU(t *testing.T) {
	js, err := Render(cpuJob(), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "jobset-cpu-1rank.yaml", js)
}

func TestRenderGoldenGPU(t *testing.T) {
	js, err := Render(gpuJob(), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "jobset-gpu-4rank.yaml", js)
}

func TestTenantQueuesGolden(t *testing.T) {
	flavors, err := Flavors(testQueueConfig())
	if err != nil {
		t.Fatal(err)
	}
	// GPUs uncapped: the tenant gets the pool's 16.
	cq, lq, err := TenantQueues("research", testTenant(), testQueueConfig())
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "kueue-tenant-research.yaml", flavors[0], flavors[1], cq, lq)
}

func env(t *testing.T, js *jobset.JobSet) map[string]corev1.EnvVar {
	t.Helper()
	out := map[string]corev1.EnvVar{}
	for _, e := range js.Spec.ReplicatedJobs[0].Template.Spec.Template.Spec.Containers[0].Env {
		if _, dup := out[e.Name]; dup {
			t.Errorf("env %s set twice", e.Name)
		}
		out[e.Name] = e
	}
	return out
}

func TestRenderGangAndTorchrunEnv(t *testing.T) {
	js, err := Render(gpuJob(), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	if js.Spec.Suspend == nil || !*js.Spec.Suspend {
		t.Fatal("JobSet not suspended; Kueue must admit it")
	}
	if got := js.Labels[LabelQueueName]; got != "fl-research" {
		t.Fatalf("queue label %q, want fl-research", got)
	}
	if got := js.Labels[LabelPriorityClass]; got != "fl-priority-10" {
		t.Fatalf("priority class label %q, want fl-priority-10", got)
	}
	job := js.Spec.ReplicatedJobs[0].Template.Spec
	if *job.Parallelism != 4 || *job.Completions != 4 || *job.BackoffLimit != 0 {
		t.Fatalf("parallelism %d completions %d backoff %d; want 4, 4, 0", *job.Parallelism, *job.Completions, *job.BackoffLimit)
	}
	e := env(t, js)
	if e["WORLD_SIZE"].Value != "4" || e["MASTER_PORT"].Value != "29500" {
		t.Fatalf("WORLD_SIZE %q MASTER_PORT %q", e["WORLD_SIZE"].Value, e["MASTER_PORT"].Value)
	}
	// Rank 0 is pod 0 of job 0 of the only replicated job; its hostname
	// under the JobSet's subdomain is what the headless service serves.
	wantMaster := js.Name + "-rank-0-0." + js.Spec.Network.Subdomain
	if e["MASTER_ADDR"].Value != wantMaster || !*js.Spec.Network.EnableDNSHostnames {
		t.Fatalf("MASTER_ADDR %q, want %q with DNS hostnames on", e["MASTER_ADDR"].Value, wantMaster)
	}
	if e["RANK"].ValueFrom == nil || !strings.Contains(e["RANK"].ValueFrom.FieldRef.FieldPath, "job-completion-index") {
		t.Fatalf("RANK not from the completion index: %+v", e["RANK"])
	}
	if got := e["FLEETLEARN_RESUME_FROM"].Value; got != "$(FLEETLEARN_CHECKPOINT_DIR)/step-2000" {
		t.Fatalf("resume from %q", got)
	}
	res := job.Template.Spec.Containers[0].Resources
	if g := res.Limits[GPUResource]; g.Value() != 2 {
		t.Fatalf("GPU limit %s, want 2", g.String())
	}
	if c := res.Requests[corev1.ResourceCPU]; c.MilliValue() != 8000 {
		t.Fatalf("CPU request %s, want 8", c.String())
	}
	fp := js.Spec.FailurePolicy
	if fp.MaxRestarts != 0 || len(fp.Rules) != 2 || fp.Rules[0].Action != jobset.FailJobSet || fp.Rules[1].Action != jobset.RestartJobSet {
		t.Fatalf("failure policy %+v", fp)
	}
	codes := job.PodFailurePolicy.Rules[0].OnExitCodes.Values
	if want := []int32{0, 137, 143}; len(codes) != 3 || codes[0] != want[0] || codes[1] != want[1] || codes[2] != want[2] {
		t.Fatalf("NotIn exit codes %v, want %v (sorted: the Job API requires it)", codes, want)
	}

	cpu, err := Render(cpuJob(), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := env(t, cpu)["FLEETLEARN_RESUME_FROM"]; ok {
		t.Fatal("fresh start sets FLEETLEARN_RESUME_FROM")
	}
	if _, ok := cpu.Spec.ReplicatedJobs[0].Template.Spec.Template.Spec.Containers[0].Resources.Limits[GPUResource]; ok {
		t.Fatal("CPU job asks for GPUs")
	}
}

func TestRenderEscapesDollar(t *testing.T) {
	js, err := Render(cpuJob(), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	c := js.Spec.ReplicatedJobs[0].Template.Spec.Template.Spec.Containers[0]
	if c.Command[3] != "$$(HOME)" {
		t.Fatalf("argv %q: $(HOME) would be expanded by the kubelet", c.Command)
	}
	if v := env(t, js)["DATA"].Value; v != "/data/$$mnist" {
		t.Fatalf("DATA %q", v)
	}
}

// TestNamesBounded renders the longest ids and attempts and checks every
// name and label the API server and the JobSet webhook check.
func TestNamesBounded(t *testing.T) {
	long := strings.Repeat("a", 30) + "-" + strings.Repeat("b", 32)
	for _, id := range []string{"x", long, long[:len(long)-1] + "c", strings.Repeat("9", 63)} {
		job := gpuJob()
		job.Spec.Id, job.Spec.Tenant, job.Spec.Ranks, job.Attempt = id, id, pool.MaxRanks, 4294967295
		js, err := Render(job, testConfig())
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		pod := js.Name + "-rank-0-1023-abcde"
		for _, errs := range [][]string{validation.IsDNS1035Label(js.Name), validation.IsDNS1035Label(pod),
			validation.IsDNS1123Subdomain(env(t, js)["MASTER_ADDR"].Value)} {
			if len(errs) > 0 {
				t.Errorf("id %s: %v", id, errs)
			}
		}
		for k, v := range js.Labels {
			if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
				t.Errorf("label %s=%q: %v", k, v, errs)
			}
		}
	}
	a, b := JobSetName(long, 1), JobSetName(long[:len(long)-1]+"c", 1)
	if a == b {
		t.Fatalf("distinct long ids share JobSet name %s", a)
	}
}

func TestRenderRefuses(t *testing.T) {
	cases := map[string]struct {
		edit func(*pb.PoolJob, *Config)
		want error
	}{
		"builtin": {func(j *pb.PoolJob, _ *Config) {
			j.Spec.Program = &pb.PoolJobSpec_Builtin{Builtin: &pb.PoolBuiltinTrainer{}}
		}, ErrUnsupportedProgram},
		"no program":     {func(j *pb.PoolJob, _ *Config) { j.Spec.Program = nil }, ErrUnsupportedProgram},
		"reserved env":   {func(j *pb.PoolJob, _ *Config) { j.Spec.GetCommand().Env["MASTER_ADDR"] = "evil" }, ErrInvalidJob},
		"bad env name":   {func(j *pb.PoolJob, _ *Config) { j.Spec.GetCommand().Env["A=B"] = "x" }, ErrInvalidJob},
		"empty argv":     {func(j *pb.PoolJob, _ *Config) { j.Spec.GetCommand().Argv = nil }, ErrInvalidJob},
		"too many ranks": {func(j *pb.PoolJob, _ *Config) { j.Spec.Ranks = pool.MaxRanks + 1 }, ErrInvalidJob},
		"attempt 0":      {func(j *pb.PoolJob, _ *Config) { j.Attempt = 0 }, ErrInvalidJob},
		"step past end":  {func(j *pb.PoolJob, _ *Config) { j.CommittedStep = 101 }, ErrInvalidJob},
		"bad id":         {func(j *pb.PoolJob, _ *Config) { j.Spec.Id = "Bad_ID" }, ErrInvalidJob},
		"no spec":        {func(j *pb.PoolJob, _ *Config) { j.Spec = nil }, ErrInvalidJob},
		"no claim":       {func(_ *pb.PoolJob, c *Config) { c.CheckpointClaim = "" }, ErrInvalidConfig},
		"exit code 0":    {func(_ *pb.PoolJob, c *Config) { c.RetryableExitCodes = []int32{0} }, ErrInvalidConfig},
		"bad namespace":  {func(_ *pb.PoolJob, c *Config) { c.Namespace = "Pool" }, ErrInvalidConfig},
		"no image":       {func(_ *pb.PoolJob, c *Config) { c.Image = "" }, ErrInvalidConfig},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			job, cfg := cpuJob(), testConfig()
			tc.edit(job, &cfg)
			if _, err := Render(job, cfg); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestTenantQueuesRefuse(t *testing.T) {
	qc := testQueueConfig()
	qc.Capacity.Memory = 0
	if _, _, err := TenantQueues("research", pool.Tenant{Weight: 1}, qc); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("uncapped memory without capacity: %v", err)
	}
	for _, w := range []float64{0, -1, 0.0001, 2e6} {
		if _, _, err := TenantQueues("research", pool.Tenant{Weight: w}, testQueueConfig()); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("weight %v: %v", w, err)
		}
	}
	qc = testQueueConfig()
	qc.GPUFlavor = qc.CPUFlavor + ""
	qc.CPUFlavor = "gpu"
	if _, err := Flavors(qc); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("one flavor for both: %v", err)
	}
}

func TestPriorityClassNames(t *testing.T) {
	for p, want := range map[int32]string{1: "fl-priority-1", -5: "fl-priority-m5", math.MinInt32: "fl-priority-m2147483648"} {
		pc := PriorityClass(p)
		if pc.Name != want || pc.Value != p {
			t.Errorf("priority %d: class %s with value %d, want %s", p, pc.Name, pc.Value, want)
		}
		if errs := validation.IsDNS1123Subdomain(pc.Name); len(errs) > 0 {
			t.Errorf("priority %d: %s is not a DNS subdomain: %v", p, pc.Name, errs)
		}
	}
	js, err := Render(cpuJob(), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	if l, ok := js.Labels[LabelPriorityClass]; ok {
		t.Fatalf("a priority-0 job names class %q; it should take Kueue's default", l)
	}
}
