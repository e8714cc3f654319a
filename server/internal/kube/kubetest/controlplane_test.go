package kubetest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/fleetlearn/fleetlearn/pool"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/kube"
)

// TestControlPlane runs a rendered pool job through the whole control
// plane: Kueue admits its suspended JobSet from the tenant's LocalQueue,
// the Job controller and the scheduler put both ranks on the KWOK GPU
// node, a rank that exits with a retryable code restarts the gang and,
// with no restart left, fails the JobSet, and deleting the JobSet removes
// its pods.
func TestControlPlane(t *testing.T) {
	began := time.Now()
	c := Start(t)
	t.Logf("control plane up in %v", time.Since(began).Round(time.Millisecond))
	ctx := t.Context()

	const (
		node      = "gpu-node-0"
		ns        = "fleetlearn-pool"
		claim     = "pool-checkpoints"
		retryable = 143
	)
	c.AddNode(t, node, 8, 32<<30, 4)
	if _, err := c.Clients.CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
	c.AddVolumeClaim(t, ns, claim)

	// One tenant's queues, quota as large as the node, GPUs on the nodes
	// that say they have them.
	qc := kube.QueueConfig{Namespace: ns, GPUNodeLabels: map[string]string{GPUPresentLabel: "true"},
		Capacity: pool.Resources{MilliCPU: 8000, Memory: 32 << 30, GPUs: 4}}
	flavors, err := kube.Flavors(qc)
	if err != nil {
		t.Fatal(err)
	}
	cq, lq, err := kube.TenantQueues("research", pool.Tenant{Weight: 1}, qc)
	if err != nil {
		t.Fatal(err)
	}
	if cq.Spec.Preemption == nil || cq.Spec.Preemption.WithinClusterQueue != "LowerPriority" {
		t.Fatalf("ClusterQueue preemption %+v, want withinClusterQueue LowerPriority", cq.Spec.Preemption)
	}
	create(t, c, kube.ResourceFlavorResource, flavors[0])
	create(t, c, kube.ResourceFlavorResource, flavors[1])
	create(t, c, kube.ClusterQueueResource, cq)
	create(t, c, kube.LocalQueueResource, lq)

	job := &pb.PoolJob{Attempt: 1, SubmitTime: timestamppb.Now(), Spec: &pb.PoolJobSpec{
		Id: "cp-train", Tenant: "research", Ranks: 2, MaxRestarts: 2, CheckpointInterval: 10, TotalSteps: 100,
		OutputModel: "cp", PerRank: &pb.PoolResources{MilliCpu: 2000, MemoryBytes: 4 << 30, Gpus: 1},
		Program: &pb.PoolJobSpec_Command{Command: &pb.PoolCommand{Argv: []string{"train"}}}}}
	js, err := kube.Render(job, kube.Config{Namespace: ns, Image: "registry.example.net/fleetlearn/trainer:1",
		CheckpointClaim: claim, RetryableExitCodes: []int32{retryable}})
	if err != nil {
		t.Fatal(err)
	}
	if !*js.Spec.Suspend || js.Labels[kube.LabelQueueName] != lq.Name {
		t.Fatalf("rendered JobSet: suspend %v, queue %q; want suspended, queue %q", *js.Spec.Suspend, js.Labels[kube.LabelQueueName], lq.Name)
	}
	// Render's JobSets leave restarts to the job service (maxRestarts 0);
	// one restart inside the JobSet shows both of its reactions to a
	// retryable exit: a restart of the gang, then, with none left, failure.
	js.Spec.FailurePolicy.MaxRestarts = 1
	create(t, c, kube.JobSetResource, js)
	jobsets := c.Dynamic.Resource(kube.JobSetResource).Namespace(ns)

	// Admission: Kueue clears spec.suspend.
	c.WaitFor(t, "Kueue to admit JobSet "+js.Name, func() (bool, string, error) {
		u, err := jobsets.Get(ctx, js.Name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		suspended, _, _ := unstructured.NestedBool(u.Object, "spec", "suspend")
		return !suspended, fmt.Sprintf("suspend=%t", suspended), nil
	})
	t.Logf("admitted at %v", time.Since(began).Round(time.Millisecond))

	selector := kube.LabelJob + "=" + job.Spec.Id
	first := runningPods(t, c, ns, selector, 2, node)
	t.Logf("both ranks Running on %s at %v", node, time.Since(began).Round(time.Millisecond))
	// Kueue admitted the ranks to the GPU flavor, whose node labels it
	// put on the pods.
	for _, p := range first {
		if got := p.Spec.NodeSelector[GPUPresentLabel]; got != "true" {
			t.Errorf("pod %s: node selector %v, want %s=true from the GPU flavor", p.Name, p.Spec.NodeSelector, GPUPresentLabel)
		}
	}

	// A rank exits with a retryable code: its Job fails (backoff limit 0)
	// and the JobSet recreates the whole gang.
	c.FailPod(t, ns, first[0].Name, retryable)
	c.WaitFor(t, "JobSet "+js.Name+" to restart", func() (bool, string, error) {
		st, err := status(ctx, c, ns, js.Name)
		return err == nil && st.Restarts == 1, fmt.Sprintf("%+v", st), err
	})
	again := runningPods(t, c, ns, selector+",jobset.sigs.k8s.io/restart-attempt=1", 2, node)
	for _, p := range again {
		for _, old := range first {
			if p.UID == old.UID {
				t.Errorf("pod %s survived the restart", p.Name)
			}
		}
	}
	t.Logf("gang restarted at %v", time.Since(began).Round(time.Millisecond))

	// Again, with no restart left: the JobSet fails, and the job service
	// would read the failure as retryable.
	c.FailPod(t, ns, again[1].Name, retryable)
	c.WaitFor(t, "JobSet "+js.Name+" to fail", func() (bool, string, error) {
		st, err := status(ctx, c, ns, js.Name)
		return err == nil && st.State == pool.Failed, fmt.Sprintf("%+v", st), err
	})
	if st, err := status(ctx, c, ns, js.Name); err != nil || !st.Retryable {
		t.Errorf("JobSet after the second retryable exit: %+v (%v), want Failed and retryable", st, err)
	}
	t.Logf("JobSet failed at %v", time.Since(began).Round(time.Millisecond))

	// Deleting the JobSet takes its Jobs and pods with it (garbage
	// collector, then KWOK's pod-delete stage).
	if err := jobsets.Delete(ctx, js.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete JobSet: %v", err)
	}
	c.WaitFor(t, "the pods of "+js.Name+" gone", func() (bool, string, error) {
		pods := c.Pods(t, ns, selector)
		var names []string
		for _, p := range pods {
			names = append(names, p.Name+" "+string(p.Status.Phase))
		}
		return len(pods) == 0, strings.Join(names, ", "), nil
	})
	if _, err := jobsets.Get(ctx, js.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("JobSet after delete: %v, want NotFound", err)
	}
	t.Logf("done in %v", time.Since(began).Round(time.Millisecond))
}

// create sends a typed object through the dynamic client, as Fleetlearn's
// controller does.
func create(t *testing.T, c *Cluster, gvr schema.GroupVersionResource, o runtime.Object) {
	t.Helper()
	m, err := kube.ToUnstructured(o)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: m}
	var r dynamic.ResourceInterface = c.Dynamic.Resource(gvr)
	if ns := u.GetNamespace(); ns != "" {
		r = c.Dynamic.Resource(gvr).Namespace(ns)
	}
	if _, err := r.Create(t.Context(), u, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
		t.Fatalf("create %s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

// runningPods waits until exactly n pods match selector, every one Running
// on node, and returns them.
func runningPods(t *testing.T, c *Cluster, ns, selector string, n int, node string) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	c.WaitFor(t, fmt.Sprintf("%d pods %s Running on %s", n, selector, node), func() (bool, string, error) {
		pods = c.Pods(t, ns, selector)
		var seen []string
		ok := len(pods) == n
		for _, p := range pods {
			seen = append(seen, fmt.Sprintf("%s %s on %q", p.Name, p.Status.Phase, p.Spec.NodeName))
			ok = ok && p.Status.Phase == corev1.PodRunning && p.Spec.NodeName == node && p.DeletionTimestamp == nil
		}
		return ok, strings.Join(seen, ", "), nil
	})
	return pods
}

// status is the JobSet's state as the job service reads it.
func status(ctx context.Context, c *Cluster, ns, name string) (kube.Status, error) {
	u, err := c.Dynamic.Resource(kube.JobSetResource).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return kube.Status{}, err
	}
	return kube.StateOfUnstructured(u)
}
