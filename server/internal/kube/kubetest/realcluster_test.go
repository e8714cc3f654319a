package kubetest_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/pool"
	"github.com/fleetlearn/fleetlearn/pool/stepdir"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/authz"
	"github.com/fleetlearn/fleetlearn/server/internal/kube"
	"github.com/fleetlearn/fleetlearn/server/internal/kube/kubetest"
	"github.com/fleetlearn/fleetlearn/server/internal/poolsvc"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

const (
	namespace = "fleetlearn-pool"
	claim     = "pool-checkpoints"
	tenant    = "research"
	// retryableExit is the rank exit code the executor restarts the gang on.
	retryableExit = 75
)

var workloads = kueue.GroupVersion.WithResource("workloads")

// TestRealCluster runs the job service's Kubernetes executor against a
// whole control plane — kube-apiserver, the controller manager and
// scheduler, the JobSet and Kueue controllers, and KWOK's fake GPU node —
// and checks, at each step, that the job's record, the cluster's objects
// and the audit log say the same thing:
//
//   - admission: a job within the tenant's quota is admitted by Kueue and
//     all its pods run;
//   - gang start: a job that does not fit whole starts none of its pods,
//     though some would fit, and a cancelled job's objects are gone;
//   - restart: a rank that exits with a retryable code restarts the gang as
//     a new attempt whose ranks resume from the step every rank committed;
//   - preemption: a higher-priority job evicts a lower one, which comes
//     back as a new attempt resuming from its last committed step once the
//     higher one has finished (its model is imported);
//   - cancel: every object of the job leaves the cluster.
//
// The ranks run nowhere (KWOK only plays their pods' lifecycle), so the
// test writes their checkpoints on the volume the server reads, and ends
// or crashes their pods through the status the kubelet would write.
func TestRealCluster(t *testing.T) {
	c := kubetest.Start(t)
	ctx := t.Context()
	c.AddNode(t, "gpu-0", 16, 64<<30, 4)
	if _, err := c.Clients.CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.AddVolumeClaim(t, namespace, claim)

	ctl, err := kube.NewController(c.Dynamic, kube.Config{Namespace: namespace, Image: "registry.example.net/fleetlearn/trainer:1",
		CheckpointClaim: claim, RetryableExitCodes: []int32{retryableExit}}, kube.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	tenants := map[string]pool.Tenant{tenant: {Weight: 1}}
	if err := ctl.EnsureQueues(ctx, tenants, kube.QueueConfig{
		Capacity: pool.Resources{MilliCPU: 16000, Memory: 64 << 30, GPUs: 4}}); err != nil {
		t.Fatal(err)
	}
	s := startService(t, ctl, tenants)

	// Admission: two ranks of one GPU each fit the tenant's 4.
	s.submit(t, spec("low", 2, 1, 0))
	s.agree(t, c, "low", running, 1)

	// Gang start: three ranks of one GPU each do not fit the 2 left. Two
	// would; none start.
	s.submit(t, spec("wide", 3, 1, 0))
	c.WaitFor(t, "Kueue to find no quota for wide", func() (bool, string, error) {
		w, err := workloadOf(ctx, c, kube.JobSetName("wide", 1))
		if w == nil || err != nil {
			return false, "no workload yet", err
		}
		cond := findCondition(w, "QuotaReserved")
		return cond != nil && cond.Status == metav1.ConditionFalse, fmt.Sprintf("conditions %v", w.Status.Conditions), nil
	})
	s.agree(t, c, "wide", queued, 1)
	s.cancel(t, "wide")
	s.agree(t, c, "wide", cancelled, 1)

	// Restart from a checkpoint: both ranks committed step 10, then rank 1
	// crashed with a retryable code.
	s.writeStep(t, "low", 0, 10)
	s.writeStep(t, "low", 1, 10)
	c.FailPod(t, namespace, podOf(t, c, "low", 1, 1).Name, retryableExit)
	j := s.agree(t, c, "low", running, 2)
	if j.GetRestarts() != 1 || j.GetCommittedStep() != 10 {
		t.Fatalf("after the crash: %v; want 1 restart from step 10", j)
	}
	s.wantResume(t, c, "low", 2, 10)
	s.wantEvent(t, "low", "submitted", "restart 1 of 2 from checkpoint step 10")

	// Preemption: step 20 is committed when a job of priority 10 that needs
	// all 4 GPUs arrives. Kueue evicts low, whose next attempt waits to
	// resume from step 20.
	s.writeStep(t, "low", 0, 20)
	s.writeStep(t, "low", 1, 20)
	s.submit(t, spec("urgent", 2, 2, 10))
	s.agree(t, c, "urgent", running, 1)
	j = s.agree(t, c, "low", queued, 3)
	if j.GetRestarts() != 1 || j.GetCommittedStep() != 20 {
		t.Fatalf("after the eviction: %v; want still 1 restart, committed step 20", j)
	}
	s.wantResume(t, c, "low", 3, 20)
	s.wantEvent(t, "low", "submitted", "evicted by Kueue")
	if _, err := c.Dynamic.Resource(kube.PriorityClassResource).Get(ctx, kube.PriorityClassName(10), metav1.GetOptions{}); err != nil {
		t.Fatalf("priority class of urgent: %v", err)
	}

	// urgent finishes: its ranks commit the last step and exit 0. Its model
	// is imported and low is admitted again, from step 20.
	s.writeStep(t, "urgent", 0, 100)
	s.writeStep(t, "urgent", 1, 100)
	for r := range 2 {
		c.SucceedPod(t, namespace, podOf(t, c, "urgent", 1, r).Name)
	}
	j = s.agree(t, c, "urgent", succeeded, 1)
	if j.GetOutputVersion() == "" || !strings.Contains(j.GetStateReason(), "completed 100 steps") {
		t.Fatalf("urgent: %v; want a model", j)
	}
	s.agree(t, c, "low", running, 3)

	// Cancel: the JobSet, its Jobs, pods and Kueue workload go.
	s.cancel(t, "low")
	s.agree(t, c, "low", cancelled, 3)

	if err := s.log.VerifyIndex(ctx); err != nil {
		t.Fatalf("audit log: %v", err)
	}
}

var (
	queued    = pb.PoolJobState_POOL_JOB_STATE_QUEUED
	running   = pb.PoolJobState_POOL_JOB_STATE_RUNNING
	succeeded = pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED
	cancelled = pb.PoolJobState_POOL_JOB_STATE_CANCELLED
)

// auditStates are the pool.job event states of the record's.
var auditStates = map[pb.PoolJobState]string{queued: "submitted", running: "running", succeeded: "succeeded", cancelled: "cancelled"}

func spec(id string, ranks uint32, gpus int64, priority int32) *pb.PoolJobSpec {
	return &pb.PoolJobSpec{Id: id, Tenant: tenant, Priority: priority, Ranks: ranks,
		PerRank:     &pb.PoolResources{MilliCpu: 1000, MemoryBytes: 1 << 30, Gpus: gpus},
		MaxRestarts: 2, CheckpointInterval: 10, TotalSteps: 100, OutputModel: "llm-" + id,
		Executor: pb.PoolExecutor_POOL_EXECUTOR_KUBERNETES,
		Program:  &pb.PoolJobSpec_Command{Command: &pb.PoolCommand{Argv: []string{"python3", "train.py"}}}}
}

// service is the job service as the server runs it: a SQLite store, a
// signed audit log, the Kubernetes executor and the gRPC API with its
// authorization, all real.
type service struct {
	client  apiv1.PoolServiceClient
	token   string
	log     *audit.Log
	ckpt    string // the checkpoint volume as the server mounts it
	mu      sync.Mutex
	models  []string
	entries []audit.PoolJob
}

func startService(t *testing.T, ctl *kube.Controller, tenants map[string]pool.Tenant) *service {
	t.Helper()
	ctx := t.Context()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "fleetlearn.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	lg, err := audit.Open(ctx, filepath.Join(dir, "audit"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lg.Close() })
	s := &service{log: lg, ckpt: filepath.Join(dir, "volume")}
	svc, err := poolsvc.New(poolsvc.Deps{Store: st, CheckpointDir: filepath.Join(dir, "pool", "checkpoints"),
		Log: slog.New(slog.DiscardHandler), Tenants: tenants, Kube: ctl, KubeCheckpointDir: s.ckpt,
		Audit: func(ctx context.Context, ps ...audit.Payload) error {
			evs := make([]audit.Event, len(ps))
			for i, p := range ps {
				if evs[i], err = audit.NewEvent(audit.Service("pool"), p); err != nil {
					return err
				}
			}
			_, err := lg.AppendBatch(context.WithoutCancel(ctx), evs)
			return err
		},
		StoreModel: func(_ context.Context, name string, m *model.Model, lin *pb.PoolLineage) (*pb.Model, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.models = append(s.models, name)
			v := m.HashHex()
			return &pb.Model{Ref: &pb.ModelRef{Version: v, Sha256: v}, Name: name, Source: pb.ModelSource_MODEL_SOURCE_POOL, Lineage: lin}, nil
		},
		CreateTask: func(context.Context, *pb.Task) (*pb.Task, error) {
			return nil, fmt.Errorf("no task was asked for")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	issuer, err := identity.NewAPIIssuer(key)
	if err != nil {
		t.Fatal(err)
	}
	ver, err := identity.NewAPIVerifier([]ed25519.PublicKey{issuer.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	az, err := authz.New(ver, identity.DefaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(az.AuthenticateUnary, az.AuthorizeUnary),
		grpc.ChainStreamInterceptor(az.AuthenticateStream, az.AuthorizeStream))
	svc.Register(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Stop()
		svc.Shutdown()
		conn.Close()
	})
	if s.token, _, err = issuer.Mint("ml-platform", []identity.Role{identity.RoleOperator}, time.Hour); err != nil {
		t.Fatal(err)
	}
	s.client = apiv1.NewPoolServiceClient(conn)
	return s
}

func (s *service) ctx(t *testing.T) context.Context {
	return metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+s.token)
}

func (s *service) submit(t *testing.T, sp *pb.PoolJobSpec) {
	t.Helper()
	if _, err := s.client.SubmitJob(s.ctx(t), &pb.SubmitJobRequest{Spec: sp}); err != nil {
		t.Fatalf("submit %s: %v", sp.GetId(), err)
	}
}

func (s *service) cancel(t *testing.T, id string) {
	t.Helper()
	if _, err := s.client.CancelJob(s.ctx(t), &pb.CancelJobRequest{JobId: id, Reason: "test"}); err != nil {
		t.Fatalf("cancel %s: %v", id, err)
	}
}

func (s *service) job(t *testing.T, id string) *pb.PoolJob {
	t.Helper()
	res, err := s.client.GetJob(s.ctx(t), &pb.GetJobRequest{JobId: id})
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return res.GetJob()
}

// writeStep commits a rank's checkpoint on the volume as its script does:
// step-<N>.tmp, then renamed into place.
func (s *service) writeStep(t *testing.T, job string, rank int, step int64) {
	t.Helper()
	m, err := model.New(model.Tensor{Name: "w", Shape: []int{2}, Data: []float32{float32(step), float32(rank)}})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := model.WriteSafetensors(&b, m); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(kube.RankCheckpointDir(s.ckpt, job, strconv.Itoa(rank)), "step-"+strconv.FormatInt(step, 10)+".tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, stepdir.ModelFile), b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, strings.TrimSuffix(tmp, ".tmp")); err != nil {
		t.Fatal(err)
	}
}

// poolEvents are the log's pool.job events of job, in order.
func (s *service) poolEvents(t *testing.T, job string) []audit.PoolJob {
	t.Helper()
	var out []audit.PoolJob
	for e, err := range s.log.Entries(t.Context(), 0, s.log.Size()) {
		if err != nil {
			t.Fatalf("audit log: %v", err)
		}
		ev, err := e.Event()
		if err != nil {
			t.Fatalf("audit entry %d: %v", e.Index, err)
		}
		if ev.Type != audit.TypePoolJob {
			continue
		}
		p, err := ev.DecodePayload()
		if err != nil {
			t.Fatalf("audit entry %d: %v", e.Index, err)
		}
		if pj, ok := p.(audit.PoolJob); ok && pj.Job == job {
			out = append(out, pj)
		}
	}
	return out
}

func (s *service) wantEvent(t *testing.T, job, state, detail string) {
	t.Helper()
	var seen []string
	for _, p := range s.poolEvents(t, job) {
		if p.State == state && strings.Contains(p.Detail, detail) {
			return
		}
		seen = append(seen, p.State+": "+p.Detail)
	}
	t.Fatalf("no %s pool.job event of %s says %q; the log has %q", state, job, detail, seen)
}

// agree waits until the job's record is in state at attempt, the cluster
// holds exactly what that means, and the log's last pool.job event of the
// job records that state and reason; it returns the record.
//
// In the cluster: the attempt's JobSet is the job's only one (none once
// cancelled); it is suspended while the job is queued; every rank has a
// Running pod while it runs and none has a pod otherwise, and a cancelled
// job has no Jobs, pods or Kueue workloads left.
func (s *service) agree(t *testing.T, c *kubetest.Cluster, id string, state pb.PoolJobState, attempt uint32) *pb.PoolJob {
	t.Helper()
	ctx := t.Context()
	var j *pb.PoolJob
	var agreed string
	defer func() {
		if agreed != "" {
			t.Logf("%s: %s", id, agreed)
		}
	}()
	c.WaitFor(t, fmt.Sprintf("%s %s at attempt %d in the server, the cluster and the log", id, state, attempt), func() (bool, string, error) {
		j = s.job(t, id)
		seen := fmt.Sprintf("server: %s attempt %d (%q)", j.GetState(), j.GetAttempt(), j.GetStateReason())
		if j.GetState() != state || j.GetAttempt() != attempt {
			return false, seen, nil
		}
		sets, err := c.Dynamic.Resource(kube.JobSetResource).Namespace(namespace).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelJob + "=" + id})
		if err != nil {
			return false, seen, err
		}
		var names []string
		suspended := false
		for _, u := range sets.Items {
			names = append(names, u.GetName())
			suspended, _, _ = unstructured.NestedBool(u.Object, "spec", "suspend")
		}
		seen += fmt.Sprintf("; JobSets %v (suspended %v)", names, suspended)
		want := []string{kube.JobSetName(id, attempt)}
		if state == cancelled {
			want = nil
		}
		if !slices.Equal(names, want) || (state == queued) != (len(names) == 1 && suspended) {
			return false, seen, nil
		}
		pods := c.Pods(t, namespace, kube.LabelJob+"="+id)
		runningPods := 0
		for _, p := range pods {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				runningPods++
			}
		}
		seen += fmt.Sprintf("; %d pods, %d running", len(pods), runningPods)
		switch state {
		case running:
			if runningPods != int(j.GetSpec().GetRanks()) {
				return false, seen, nil
			}
		case queued, cancelled:
			if len(pods) != 0 {
				return false, seen, nil
			}
		}
		if state == cancelled {
			jobs, err := c.Clients.BatchV1().Jobs(namespace).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelJob + "=" + id})
			if err != nil {
				return false, seen, err
			}
			w, err := workloadOf(ctx, c, kube.JobSetName(id, attempt))
			if err != nil {
				return false, seen, err
			}
			seen += fmt.Sprintf("; %d Jobs, workload %v", len(jobs.Items), w != nil)
			if len(jobs.Items) != 0 || w != nil {
				return false, seen, nil
			}
		}
		evs := s.poolEvents(t, id)
		if len(evs) == 0 {
			return false, seen + "; no pool.job event", nil
		}
		last := evs[len(evs)-1]
		seen += fmt.Sprintf("; log: %s %q", last.State, last.Detail)
		if last.State != auditStates[state] || last.Detail != j.GetStateReason() {
			return false, seen, nil
		}
		agreed = seen
		return true, seen, nil
	})
	return j
}

// wantResume checks that every rank pod of the attempt resumes from step.
func (s *service) wantResume(t *testing.T, c *kubetest.Cluster, id string, attempt uint32, step int64) {
	t.Helper()
	u, err := c.Dynamic.Resource(kube.JobSetResource).Namespace(namespace).Get(t.Context(), kube.JobSetName(id, attempt), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var js jobset.JobSet
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &js); err != nil {
		t.Fatal(err)
	}
	want := "$(FLEETLEARN_CHECKPOINT_DIR)/step-" + strconv.FormatInt(step, 10)
	for _, v := range js.Spec.ReplicatedJobs[0].Template.Spec.Template.Spec.Containers[0].Env {
		if v.Name == "FLEETLEARN_RESUME_FROM" {
			if v.Value != want {
				t.Fatalf("%s resumes from %q, want %q", js.Name, v.Value, want)
			}
			return
		}
	}
	t.Fatalf("%s resumes from nothing, want %q", js.Name, want)
}

// podOf is the running pod of one rank of one attempt.
func podOf(t *testing.T, c *kubetest.Cluster, id string, attempt uint32, rank int) corev1.Pod {
	t.Helper()
	sel := fmt.Sprintf("%s=%s,%s=%d,%s=%d", kube.LabelJob, id, kube.LabelAttempt, attempt, "batch.kubernetes.io/job-completion-index", rank)
	var got []corev1.Pod
	c.WaitFor(t, "the pod of "+sel, func() (bool, string, error) {
		got = got[:0]
		for _, p := range c.Pods(t, namespace, sel) {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				got = append(got, p)
			}
		}
		return len(got) == 1, fmt.Sprintf("%d running", len(got)), nil
	})
	return got[0]
}

// workloadOf is Kueue's workload for the JobSet named, or nil.
func workloadOf(ctx context.Context, c *kubetest.Cluster, jobSet string) (*kueue.Workload, error) {
	l, err := c.Dynamic.Resource(workloads).Namespace(namespace).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for _, u := range l.Items {
		for _, o := range u.GetOwnerReferences() {
			if o.Kind == "JobSet" && o.Name == jobSet {
				var w kueue.Workload
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &w); err != nil {
					return nil, err
				}
				return &w, nil
			}
		}
	}
	return nil, nil
}

func findCondition(w *kueue.Workload, typ string) *metav1.Condition {
	for i := range w.Status.Conditions {
		if w.Status.Conditions[i].Type == typ {
			return &w.Status.Conditions[i]
		}
	}
	return nil
}
