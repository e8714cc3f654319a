package poolsvc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"

	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/pool/stepdir"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/kube"
)

const kubeNamespace = "fleetlearn-pool"

// cluster is a fake API server holding the JobSet and Kueue resources,
// followed by a real kube.Controller. watching gets a signal each time a
// JobSet watch opens: the fake's watches start empty, so a test changes
// objects only once the service's watch is open, or the change is lost.
type cluster struct {
	*fake.FakeDynamicClient
	ctl      *kube.Controller
	watching chan struct{}
	ckptDir  string // the checkpoint volume as the server sees it
}

func newCluster(t *testing.T, clk clock.Clock) *cluster {
	t.Helper()
	client := fake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		kube.JobSetResource: "JobSetList", kube.ResourceFlavorResource: "ResourceFlavorList",
		kube.ClusterQueueResource: "ClusterQueueList", kube.LocalQueueResource: "LocalQueueList"})
	c := &cluster{FakeDynamicClient: client, watching: make(chan struct{}, 16), ckptDir: t.TempDir()}
	client.PrependWatchReactor("jobsets", func(a clienttesting.Action) (bool, watch.Interface, error) {
		wa := a.(clienttesting.WatchActionImpl)
		w, err := client.Tracker().Watch(a.GetResource(), a.GetNamespace(), wa.ListOptions)
		if err == nil {
			select {
			case c.watching <- struct{}{}:
			default:
			}
		}
		return true, w, err
	})
	ctl, err := kube.NewController(client, kube.Config{Namespace: kubeNamespace, Image: "ghcr.io/fleetlearn/trainer:1.4.0",
		CheckpointClaim: "pool-checkpoints", RetryableExitCodes: []int32{143}},
		kube.WithClock(clk), kube.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	c.ctl = ctl
	return c
}

// kubeEnv is an env whose service runs Kubernetes jobs on a fake cluster;
// mod changes the deps after the Kubernetes ones are set.
func kubeEnv(t *testing.T, withCheckpoints bool, mod func(*Deps)) (*env, *cluster) {
	t.Helper()
	var c *cluster
	e := newEnv(t, func(d *Deps) {
		if c == nil {
			c = newCluster(t, d.Clock)
		}
		d.Kube = c.ctl
		if withCheckpoints {
			d.KubeCheckpointDir = c.ckptDir
		}
		if mod != nil {
			mod(d)
		}
	})
	c.waitWatching(t)
	return e, c
}

func (c *cluster) waitWatching(t *testing.T) {
	t.Helper()
	select {
	case <-c.watching:
	case <-time.After(hangFor):
		t.Fatal("the service opened no JobSet watch")
	}
}

func (c *cluster) jobsets() dynamic.ResourceInterface {
	return c.Resource(kube.JobSetResource).Namespace(kubeNamespace)
}

func (c *cluster) get(t *testing.T, name string) *unstructured.Unstructured {
	t.Helper()
	u, err := c.jobsets().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("JobSet %s: %v", name, err)
	}
	return u
}

func (c *cluster) count(t *testing.T) int {
	t.Helper()
	l, err := c.jobsets().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return len(l.Items)
}

// setStatus changes a JobSet's suspension, restarts and conditions in one
// update, as the JobSet and Kueue controllers do, so the watch sees one
// event.
func (c *cluster) setStatus(t *testing.T, name string, suspend bool, restarts int32, conds ...metav1.Condition) {
	t.Helper()
	u := c.get(t, name)
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&jobset.JobSetStatus{Restarts: restarts, Conditions: conds})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(u.Object, suspend, "spec", "suspend"); err != nil {
		t.Fatal(err)
	}
	u.Object["status"] = m
	if _, err := c.jobsets().Update(context.Background(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func cond(typ jobset.JobSetConditionType, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: string(typ), Status: metav1.ConditionTrue, Reason: reason, Message: msg,
		LastTransitionTime: metav1.NewTime(t0)}
}

// writeStep commits a rank's checkpoint at step on the volume as a pod's
// script does (step-<N>.tmp renamed into place) and returns the model
// file's path.
func (c *cluster) writeStep(t *testing.T, job string, rank int, step int64, vals ...float32) string {
	t.Helper()
	m, err := model.New(model.Tensor{Name: "w", Shape: []int{len(vals)}, Data: vals})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := model.WriteSafetensors(&b, m); err != nil {
		t.Fatal(err)
	}
	return c.writeStepFile(t, job, rank, step, b.Bytes())
}

func (c *cluster) writeStepFile(t *testing.T, job string, rank int, step int64, data []byte) string {
	t.Helper()
	dir := kube.RankCheckpointDir(c.ckptDir, job, strconv.Itoa(rank))
	tmp := filepath.Join(dir, "step-"+strconv.FormatInt(step, 10)+".tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, stepdir.ModelFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
	final := strings.TrimSuffix(tmp, ".tmp")
	if err := os.Rename(tmp, final); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(final, stepdir.ModelFile)
}

func kubeSpec(id string, ranks uint32) *pb.PoolJobSpec {
	sp := spec(id, ranks)
	sp.Executor = pb.PoolExecutor_POOL_EXECUTOR_KUBERNETES
	return sp
}

// submitKube submits a Kubernetes job and waits until the watch has
// reported its new, suspended JobSet.
func submitKube(t *testing.T, e *env, sp *pb.PoolJobSpec, then *pb.Task) *pb.PoolJob {
	t.Helper()
	e.submit(sp, then)
	return e.waitJob(sp.GetId(), func(j *pb.PoolJob) bool {
		return j.GetState() == queued && strings.Contains(j.GetStateReason(), "Kubernetes: waiting for admission")
	})
}

// A Kubernetes job is recorded at attempt 1 and becomes a JobSet with the
// job's labels; the workers' scheduler never sees it.
func TestKubeSubmitCreatesJobSet(t *testing.T) {
	e, c := kubeEnv(t, true, nil)
	j := e.submit(kubeSpec("kj", 2), nil)
	name := kube.JobSetName("kj", 1)
	if j.GetState() != queued || j.GetAttempt() != 1 || !strings.Contains(j.GetStateReason(), name) {
		t.Fatalf("submitted job %v, want queued at attempt 1 with a reason naming %s", j, name)
	}
	u := c.get(t, name)
	want := map[string]string{kube.LabelJob: "kj", kube.LabelAttempt: "1", kube.LabelTenant: DefaultTenant,
		kube.LabelQueueName: kube.QueueName(DefaultTenant)}
	for k, v := range want {
		if got := u.GetLabels()[k]; got != v {
			t.Errorf("JobSet label %s = %q, want %q", k, got, v)
		}
	}
	if sus, _, _ := unstructured.NestedBool(u.Object, "spec", "suspend"); !sus {
		t.Error("JobSet created unsuspended; Kueue admits it by unsuspending it")
	}
	got := e.waitJob("kj", func(j *pb.PoolJob) bool { return strings.Contains(j.GetStateReason(), "waiting for admission") })
	if got.GetState() != queued || got.GetAttempt() != 1 {
		t.Fatalf("after the watch: %v", got)
	}
	w := e.register("host", &pb.PoolResources{MilliCpu: 8000, MemoryBytes: 8 * gib, Gpus: 4})
	if r := w.beat(); len(r.GetStart()) != 0 {
		t.Fatalf("a worker was leased a Kubernetes job's rank: %v", r.GetStart())
	}
	if ls := e.leases("kj"); len(ls) != 0 {
		t.Fatalf("leases %v", ls)
	}
	if n := c.count(t); n != 1 {
		t.Fatalf("%d JobSets, want 1", n)
	}
}

// The JobSet's status drives the job: admission, restarts, the step every
// rank has committed on the volume, and completion with rank 0's model.
func TestKubeJobFollowsJobSet(t *testing.T) {
	e, c := kubeEnv(t, true, nil)
	then := &pb.Task{Name: "fine-tune", Module: &pb.ModuleRef{Sha256: strings.Repeat("ab", 32)}}
	submitKube(t, e, kubeSpec("kj", 2), then)
	name := kube.JobSetName("kj", 1)

	c.setStatus(t, name, false, 0)
	j := e.waitJob("kj", func(j *pb.PoolJob) bool { return j.GetState() == running })
	if j.GetStartTime() == nil || j.GetCommittedStep() != 0 {
		t.Fatalf("running job %v", j)
	}

	// Only rank 0 has step 10: nothing is committed yet, so the next
	// attempt starts from scratch.
	c.writeStep(t, "kj", 0, 10, 1, 2)
	c.setStatus(t, name, false, 0, retryableFailure)
	j = e.waitJob("kj", func(j *pb.PoolJob) bool { return j.GetAttempt() == 2 })
	if j.GetState() != queued || j.GetRestarts() != 1 || j.GetCommittedStep() != 0 {
		t.Fatalf("with one rank at step 10: %v", j)
	}
	e.wantEvent(t, "kj", "submitted", "restart 1 of 2 from checkpoint step 0")
	name = c.waitReplaced(t, "kj", 2)
	if got := c.resumeFrom(t, name); got != "" {
		t.Fatalf("attempt 2 resumes from %q, want from scratch", got)
	}

	c.setStatus(t, name, false, 0)
	e.waitJob("kj", func(j *pb.PoolJob) bool { return j.GetState() == running })
	c.writeStep(t, "kj", 1, 10, 1, 2)
	c.setStatus(t, name, false, 0, retryableFailure)
	j = e.waitJob("kj", func(j *pb.PoolJob) bool { return j.GetAttempt() == 3 })
	if j.GetState() != queued || j.GetRestarts() != 2 || j.GetCommittedStep() != 10 || j.GetStep() != 10 {
		t.Fatalf("with both ranks at step 10: %v", j)
	}
	e.wantEvent(t, "kj", "submitted", "restart 2 of 2 from checkpoint step 10")
	name = c.waitReplaced(t, "kj", 3)
	if got := c.resumeFrom(t, name); got != "$(FLEETLEARN_CHECKPOINT_DIR)/step-10" {
		t.Fatalf("attempt 3 resumes from %q, want step-10", got)
	}
	c.setStatus(t, name, false, 0)
	e.waitJob("kj", func(j *pb.PoolJob) bool { return j.GetState() == running })

	path := c.writeStep(t, "kj", 0, 100, 3, 4, 5)
	c.writeStep(t, "kj", 1, 100, 9, 9, 9) // rank 1's copy is not the model
	c.setStatus(t, name, false, 2, cond(jobset.JobSetCompleted, "AllJobsCompleted", "jobset completed successfully"))
	j = e.waitJob("kj", func(j *pb.PoolJob) bool { return terminalState(j.GetState()) })
	if j.GetState() != succeeded || j.GetOutputVersion() == "" || j.GetCommittedStep() != 100 || j.GetThenTaskId() != "task-1" ||
		!strings.Contains(j.GetStateReason(), "completed 100 steps on Kubernetes") {
		t.Fatalf("completed job %v", j)
	}

	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	written, err := model.ReadSafetensors(bytes.NewReader(raw), model.WithInputSize(int64(len(raw))))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	e.mu.Lock()
	models, tasks := append([]storedModel(nil), e.models...), append([]*pb.Task(nil), e.tasks...)
	var types []string
	for _, p := range e.events {
		types = append(types, string(p.EventType()))
	}
	e.mu.Unlock()
	if len(models) != 1 {
		t.Fatalf("%d models stored", len(models))
	}
	m := models[0]
	if m.name != "mnist-base" || !reflect.DeepEqual(m.m.Tensors, written.Tensors) || m.m.Lineage.Job != "kj" {
		t.Fatalf("stored model %s %+v, want the tensors of %s %+v", m.name, m.m, path, written.Tensors)
	}
	if got := m.m.Flatten(); !reflect.DeepEqual(got, []float32{3, 4, 5}) {
		t.Fatalf("stored values %v, want rank 0's", got)
	}
	lin := m.lineage
	if lin.GetJobId() != "kj" || lin.GetCheckpoint() != hex.EncodeToString(sum[:]) || lin.GetSteps() != 100 ||
		lin.GetSpecDigest() != j.GetSpecDigest() {
		t.Fatalf("lineage %v, want checkpoint %x", lin, sum)
	}
	if len(tasks) != 1 || tasks[0].GetModel().GetVersion() != j.GetOutputVersion() {
		t.Fatalf("then task %v", tasks)
	}
	if !strings.Contains(strings.Join(types, ","), "model.imported,pool.job") {
		t.Fatalf("audit events %v, want model.imported then the succeeded pool.job", types)
	}
	var ok bool
	for _, ev := range e.poolEvents() {
		if ev.Job == "kj" && ev.State == "succeeded" {
			ok = ev.Model == j.GetOutputVersion() && ev.Kind == "command"
		}
	}
	if !ok {
		t.Fatalf("no succeeded pool.job event with the model: %+v", e.poolEvents())
	}
}

func TestKubeJobSetFailedFailsJob(t *testing.T) {
	e, c := kubeEnv(t, true, nil)
	submitKube(t, e, kubeSpec("kj", 1), nil)
	name := kube.JobSetName("kj", 1)
	c.setStatus(t, name, false, 0)
	e.waitJob("kj", func(j *pb.PoolJob) bool { return j.GetState() == running })
	c.setStatus(t, name, false, 0, cond(jobset.JobSetFailed, "FailJobSetFailurePolicyAction", "applying FailJobSet failure policy action (first failed job: fl-kj-a1-rank-0)"))
	j := e.waitJob("kj", func(j *pb.PoolJob) bool { return terminalState(j.GetState()) })
	if j.GetState() != failed || !strings.Contains(j.GetStateReason(), "Kubernetes: FailJobSetFailurePolicyAction: applying FailJobSet") ||
		j.GetRestarts() != 0 || j.GetAttempt() != 1 || j.GetEndTime() == nil {
		t.Fatalf("job %v", j)
	}
	if d := e.lastEvent("kj", "failed"); !strings.Contains(d, "FailJobSetFailurePolicyAction") {
		t.Fatalf("failed event detail %q", d)
	}
	if n := c.count(t); n != 1 {
		t.Fatalf("%d JobSets; a failed job keeps its last one for inspection", n)
	}
}

// A gang that keeps failing in a retryable way gets max_restarts new
// attempts, then fails saying so.
func TestKubeRestartLimit(t *testing.T) {
	e, c := kubeEnv(t, true, nil)
	submitKube(t, e, kubeSpec("kj", 1), nil)
	for attempt := uint32(1); attempt <= 3; attempt++ {
		name := c.waitReplaced(t, "kj", attempt)
		c.setStatus(t, name, false, 0)
		e.waitJob("kj", func(j *pb.PoolJob) bool { return j.GetState() == running && j.GetAttempt() == attempt })
		c.setStatus(t, name, false, 0, retryableFailure)
		if attempt < 3 {
			e.waitJob("kj", func(j *pb.PoolJob) bool { return j.GetAttempt() == attempt+1 })
		}
	}
	j := e.waitJob("kj", func(j *pb.PoolJob) bool { return terminalState(j.GetState()) })
	if j.GetState() != failed || j.GetRestarts() != 2 || j.GetAttempt() != 3 ||
		!strings.Contains(j.GetStateReason(), "no restarts left (2 of 2 made)") {
		t.Fatalf("job %v", j)
	}
}

// Kueue suspends an admitted JobSet to preempt it: the next attempt
// resumes from the step the ranks committed, without counting a restart.
func TestKubeEvictionResumesFromCheckpoint(t *testing.T) {
	e, c := kubeEnv(t, true, nil)
	submitKube(t, e, kubeSpec("kj", 2), nil)
	name := kube.JobSetName("kj", 1)
	c.setStatus(t, name, false, 0)
	e.waitJob("kj", func(j *pb.PoolJob) bool { return j.GetState() == running })
	c.writeStep(t, "kj", 0, 20, 1)
	c.writeStep(t, "kj", 1, 20, 1)
	c.setStatus(t, name, true, 0, cond(jobset.JobSetSuspended, "SuspendedJobs", "jobset is suspended"))
	j := e.waitJob("kj", func(j *pb.PoolJob) bool { return j.GetAttempt() == 2 })
	if j.GetState() != queued || j.GetRestarts() != 0 || j.GetCommittedStep() != 20 {
		t.Fatalf("evicted job %v", j)
	}
	e.wantEvent(t, "kj", "submitted", "attempt 2 resumes from checkpoint step 20")
	name = c.waitReplaced(t, "kj", 2)
	if got := c.resumeFrom(t, name); got != "$(FLEETLEARN_CHECKPOINT_DIR)/step-20" {
		t.Fatalf("attempt 2 resumes from %q, want step-20", got)
	}
	// Never admitted, a suspended JobSet is just waiting: no new attempt.
	c.setStatus(t, name, true, 0, cond(jobset.JobSetSuspended, "SuspendedJobs", "jobset is suspended"))
	c.setStatus(t, name, false, 0)
	j = e.waitJob("kj", func(j *pb.PoolJob) bool { return j.GetState() == running })
	if j.GetAttempt() != 2 {
		t.Fatalf("attempt %d after a wait in the queue, want 2", j.GetAttempt())
	}
}

// wantEvent fails unless a pool.job event of job in state has a detail
// containing detail.
func (e *env) wantEvent(t *testing.T, job, state, detail string) {
	t.Helper()
	var seen []string
	for _, ev := range e.poolEvents() {
		if ev.Job == job && ev.State == state {
			if strings.Contains(ev.Detail, detail) {
				return
			}
			seen = append(seen, ev.Detail)
		}
	}
	t.Fatalf("no %s pool.job event of %s says %q; those there say %q", state, job, detail, seen)
}

// retryableFailure is the JobSet controller's Failed condition when the
// restart rule matched with no restarts left, which Render's JobSets
// always are.
var retryableFailure = cond(jobset.JobSetFailed, "ReachedMaxRestarts", "jobset failed due to reaching max number of restarts (first failed job: fl-kj-rank-0)")

// waitReplaced waits until the job's JobSets are exactly the attempt's
// and returns its name.
func (c *cluster) waitReplaced(t *testing.T, job string, attempt uint32) string {
	t.Helper()
	want := kube.JobSetName(job, attempt)
	deadline := time.Now().Add(hangFor)
	for {
		l, err := c.jobsets().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, u := range l.Items {
			names = append(names, u.GetName())
		}
		if len(names) == 1 && names[0] == want {
			return want
		}
		if time.Now().After(deadline) {
			t.Fatalf("JobSets %v, want only %s", names, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// resumeFrom is the FLEETLEARN_RESUME_FROM the JobSet's ranks get.
func (c *cluster) resumeFrom(t *testing.T, name string) string {
	t.Helper()
	var js jobset.JobSet
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(c.get(t, name).Object, &js); err != nil {
		t.Fatal(err)
	}
	for _, v := range js.Spec.ReplicatedJobs[0].Template.Spec.Template.Spec.Containers[0].Env {
		if v.Name == "FLEETLEARN_RESUME_FROM" {
			return v.Value
		}
	}
	return ""
}

func TestKubeJobSetDeletedFailsJob(t *testing.T) {
	e, c := kubeEnv(t, true, nil)
	submitKube(t, e, kubeSpec("kj", 1), nil)
	name := kube.JobSetName("kj", 1)
	if err := c.jobsets().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	j := e.waitJob("kj", func(j *pb.PoolJob) bool { return terminalState(j.GetState()) })
	if j.GetState() != failed || !strings.Contains(j.GetStateReason(), name) || !strings.Contains(j.GetStateReason(), "deleted") {
		t.Fatalf("job %v, want failed naming %s", j, name)
	}
}

func TestKubeCancelDeletesJobSet(t *testing.T) {
	e, c := kubeEnv(t, true, nil)
	submitKube(t, e, kubeSpec("kj", 1), nil)
	name := kube.JobSetName("kj", 1)
	c.setStatus(t, name, false, 0)
	e.waitJob("kj", func(j *pb.PoolJob) bool { return j.GetState() == running })
	cl, ctx := e.ops()
	res, err := cl.CancelJob(ctx, &pb.CancelJobRequest{JobId: "kj", Reason: "wrong data"})
	if err != nil {
		t.Fatal(err)
	}
	if j := res.GetJob(); j.GetState() != cancelled || j.GetStateReason() != "cancelled by client: wrong data" {
		t.Fatalf("cancelled job %v", j)
	}
	if _, err := c.jobsets().Get(context.Background(), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("JobSet after cancel: %v, want not found", err)
	}
	// The watch reports in order: once the next job's JobSet is seen, the
	// deletion was too, and it must not have turned the cancel into a
	// failure.
	submitKube(t, e, kubeSpec("next", 1), nil)
	if j := e.job("kj"); j.GetState() != cancelled {
		t.Fatalf("after the deletion was watched: %v", j)
	}
	_, err = cl.CancelJob(ctx, &pb.CancelJobRequest{JobId: "kj"})
	wantCode(t, "cancel again", err, codes.FailedPrecondition)
}

func TestKubeRefusals(t *testing.T) {
	t.Run("no executor", func(t *testing.T) {
		e := newEnv(t, nil)
		cl, ctx := e.ops()
		_, err := cl.SubmitJob(ctx, &pb.SubmitJobRequest{Spec: kubeSpec("kj", 1)})
		wantCode(t, "without Deps.Kube", err, codes.FailedPrecondition)
		if !strings.Contains(status.Convert(err).Message(), "--pool-kubernetes") {
			t.Errorf("message %q does not name --pool-kubernetes", status.Convert(err).Message())
		}
		_, err = cl.GetJob(ctx, &pb.GetJobRequest{JobId: "kj"})
		wantCode(t, "refused job", err, codes.NotFound)
	})
	e, c := kubeEnv(t, true, nil)
	builtin := kubeSpec("builtin", 1)
	builtin.Program = &pb.PoolJobSpec_Builtin{Builtin: &pb.PoolBuiltinTrainer{Arch: []uint32{4, 2}, BatchSize: 8,
		LearningRate: 0.1, Dataset: &pb.PoolDataset{Source: "mnist-train"}}}
	diloco := dilocoSpec("diloco", 2, 3)
	diloco.Executor = pb.PoolExecutor_POOL_EXECUTOR_KUBERNETES
	carbonJob := carbonSpec("carbon", t0.Add(12*time.Hour))
	carbonJob.Executor = pb.PoolExecutor_POOL_EXECUTOR_KUBERNETES
	cl, ctx := e.ops()
	for _, tc := range []struct {
		sp   *pb.PoolJobSpec
		want string
	}{
		{builtin, "command jobs"},
		{diloco, "spec.executor"},
		{carbonJob, "carbon"},
	} {
		_, err := cl.SubmitJob(ctx, &pb.SubmitJobRequest{Spec: tc.sp})
		wantCode(t, tc.sp.GetId(), err, codes.InvalidArgument)
		if msg := status.Convert(err).Message(); !strings.Contains(msg, tc.want) {
			t.Errorf("%s: message %q, want it to mention %q", tc.sp.GetId(), msg, tc.want)
		}
		_, err = cl.GetJob(ctx, &pb.GetJobRequest{JobId: tc.sp.GetId()})
		wantCode(t, "refused "+tc.sp.GetId(), err, codes.NotFound)
	}
	if n := c.count(t); n != 0 {
		t.Fatalf("%d JobSets created for refused jobs", n)
	}
}

// A completed JobSet whose model the server cannot read still succeeds the
// job, saying why no model was stored.
func TestKubeSuccessWithoutModel(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ckpts bool
		write func(t *testing.T, c *cluster)
		want  []string
	}{
		{"no checkpoint dir", false, nil, []string{"no model stored", "--pool-kube-checkpoint-dir"}},
		{"last step missing", true, func(t *testing.T, c *cluster) {
			c.writeStep(t, "kj", 0, 90, 1, 2)
		}, []string{"no model stored", "the last step's checkpoint", "step-100"}},
		{"damaged model", true, func(t *testing.T, c *cluster) {
			c.writeStep(t, "kj", 0, 90, 1, 2)
			c.writeStepFile(t, "kj", 0, 100, []byte("not a safetensors file"))
		}, []string{"no model stored", filepath.Join("step-100", stepdir.ModelFile)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, c := kubeEnv(t, tc.ckpts, nil)
			then := &pb.Task{Name: "fine-tune", Module: &pb.ModuleRef{Sha256: strings.Repeat("ab", 32)}}
			submitKube(t, e, kubeSpec("kj", 1), then)
			if tc.write != nil {
				tc.write(t, c)
			}
			c.setStatus(t, kube.JobSetName("kj", 1), false, 0, cond(jobset.JobSetCompleted, "AllJobsCompleted", ""))
			j := e.waitJob("kj", func(j *pb.PoolJob) bool { return terminalState(j.GetState()) })
			if j.GetState() != succeeded || j.GetOutputVersion() != "" {
				t.Fatalf("job %v", j)
			}
			for _, w := range tc.want {
				if !strings.Contains(j.GetStateReason(), w) {
					t.Errorf("reason %q does not say %q", j.GetStateReason(), w)
				}
			}
			e.mu.Lock()
			defer e.mu.Unlock()
			if len(e.models) != 0 || len(e.tasks) != 0 {
				t.Fatalf("%d models and %d tasks created without a model", len(e.models), len(e.tasks))
			}
		})
	}
}

// A restarted server keeps following a running Kubernetes job: the
// watch's first list brings what changed while it was down, and later
// events still arrive.
func TestKubeJobSurvivesRestart(t *testing.T) {
	e, c := kubeEnv(t, true, nil)
	submitKube(t, e, kubeSpec("kj", 2), nil)
	name := kube.JobSetName("kj", 1)
	c.setStatus(t, name, false, 0)
	e.waitJob("kj", func(j *pb.PoolJob) bool { return j.GetState() == running })

	e.stop()
	c.writeStep(t, "kj", 0, 10, 1)
	c.writeStep(t, "kj", 1, 10, 1)
	c.setStatus(t, name, false, 0, retryableFailure)
	e.start()
	c.waitWatching(t)
	// The watch's first list shows the failure the server missed.
	j := e.waitJob("kj", func(j *pb.PoolJob) bool { return j.GetAttempt() == 2 })
	if j.GetState() != queued || j.GetRestarts() != 1 || j.GetCommittedStep() != 10 {
		t.Fatalf("after the restart: %v", j)
	}
	name = c.waitReplaced(t, "kj", 2)
	c.setStatus(t, name, false, 0)
	e.waitJob("kj", func(j *pb.PoolJob) bool { return j.GetState() == running })

	// A server that stopped after recording attempt 3 but before replacing
	// the JobSet finishes the replacement when it starts.
	e.stop()
	row, err := e.st.PoolJob(context.Background(), "kj")
	if err != nil {
		t.Fatal(err)
	}
	rec := row.Job
	rec.Attempt, rec.State = 3, queued
	if err := e.st.UpdatePoolJob(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	e.start()
	c.waitWatching(t)
	name = c.waitReplaced(t, "kj", 3)
	if got := c.resumeFrom(t, name); got != "$(FLEETLEARN_CHECKPOINT_DIR)/step-10" {
		t.Fatalf("attempt 3 resumes from %q, want step-10", got)
	}
	c.setStatus(t, name, false, 0, cond(jobset.JobSetFailed, "FailJobSetFailurePolicyAction", "rank 1 exited 3"))
	j = e.waitJob("kj", func(j *pb.PoolJob) bool { return terminalState(j.GetState()) })
	if j.GetState() != failed || !strings.Contains(j.GetStateReason(), "rank 1 exited 3") {
		t.Fatalf("after the restart's watch: %v", j)
	}
}

func TestKubeStartFailureFailsJob(t *testing.T) {
	t.Run("foreign object", func(t *testing.T) {
		e, c := kubeEnv(t, true, nil)
		name := kube.JobSetName("kj", 1)
		foreign := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"suspend": true}}}
		foreign.SetAPIVersion(jobset.GroupVersion.String())
		foreign.SetKind("JobSet")
		foreign.SetNamespace(kubeNamespace)
		foreign.SetName(name)
		foreign.SetLabels(map[string]string{kube.LabelJob: "someone-else", kube.LabelAttempt: "1"})
		if _, err := c.jobsets().Create(context.Background(), foreign, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		j := e.submit(kubeSpec("kj", 1), nil)
		if j.GetState() != failed || !strings.Contains(j.GetStateReason(), "creating its JobSet failed") ||
			!strings.Contains(j.GetStateReason(), "not Fleetlearn's") {
			t.Fatalf("job %v", j)
		}
		if got := e.job("kj"); got.GetState() != failed {
			t.Fatalf("stored job %v", got)
		}
		if l := c.get(t, name).GetLabels(); l[kube.LabelJob] != "someone-else" {
			t.Fatalf("the foreign JobSet was changed: labels %v", l)
		}
	})
	t.Run("API error", func(t *testing.T) {
		e, c := kubeEnv(t, true, nil)
		c.PrependReactor("create", "jobsets", func(clienttesting.Action) (bool, runtime.Object, error) {
			return true, nil, errors.New(`admission webhook "jobset.x-k8s.io" denied the request`)
		})
		j := e.submit(kubeSpec("kj", 1), nil)
		if j.GetState() != failed || !strings.Contains(j.GetStateReason(), "creating its JobSet failed") ||
			!strings.Contains(j.GetStateReason(), "denied the request") {
			t.Fatalf("job %v", j)
		}
		if d := e.lastEvent("kj", "failed"); !strings.Contains(d, "creating its JobSet failed") {
			t.Fatalf("failed event detail %q", d)
		}
		if n := c.count(t); n != 0 {
			t.Fatalf("%d JobSets", n)
		}
	})
}

// TestKubeProgressIsPolled: a running JobSet says nothing while its ranks
// checkpoint, so the committed step comes from reading the volume every
// few heartbeat intervals.
func TestKubeProgressIsPolled(t *testing.T) {
	e, c := kubeEnv(t, true, nil)
	submitKube(t, e, kubeSpec("kp", 2), nil)
	c.setStatus(t, kube.JobSetName("kp", 1), false, 0)
	e.waitJob("kp", func(j *pb.PoolJob) bool { return j.GetState() == running })
	c.writeStep(t, "kp", 0, 10, 1, 2)
	c.writeStep(t, "kp", 1, 10, 1, 2)

	every := kubeProgressEvery * hb
	end := time.Now().Add(hangFor)
	for {
		j := e.job("kp")
		if j.GetCommittedStep() == 10 {
			break
		}
		if j.GetCommittedStep() != 0 || time.Now().After(end) {
			t.Fatalf("committed step %d, want 10 from the volume", j.GetCommittedStep())
		}
		// Advance only to a pending deadline: the poll's timer is one of
		// them once it is armed.
		dl := e.clk.Deadlines()
		if len(dl) == 0 {
			goruntime.Gosched()
			continue
		}
		e.clk.Set(slices.MinFunc(dl, time.Time.Compare))
		if e.clk.Now().Sub(t0) > 100*every {
			t.Fatalf("no poll after %s of fake time", e.clk.Now().Sub(t0))
		}
	}
}
