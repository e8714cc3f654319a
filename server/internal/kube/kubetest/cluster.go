package kubetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// Guard bounds every wait of this package. It only stops a hung test: on
// a busy machine a healthy control plane does each step in seconds, and
// nothing here asserts on how fast.
const Guard = 120 * time.Second

// Annotations and labels of the fake nodes.
const (
	// KWOKNodeAnnotation marks the nodes KWOK manages; Start runs it with
	// this annotation as its node selector.
	KWOKNodeAnnotation = "kwok.x-k8s.io/node"
	// GPUResource is the NVIDIA device plugin's resource name.
	GPUResource corev1.ResourceName = "nvidia.com/gpu"
	// GPUPresentLabel is what NVIDIA's GPU feature discovery sets on a node
	// with GPUs, and what Kueue flavors for GPUs usually select.
	GPUPresentLabel = "nvidia.com/gpu.present"
)

// Cluster is a running control plane.
type Cluster struct {
	// Config is a client configuration for an administrator
	// (system:masters, by bearer token).
	Config *rest.Config
	// Dynamic is a dynamic client with Config, for JobSets, Kueue's objects
	// and anything else.
	Dynamic dynamic.Interface
	// Clients is a typed client with Config, for core objects.
	Clients kubernetes.Interface
	// Dir holds the control plane's configuration, certificates, data and
	// logs (<component>.log); it is removed when the test ends.
	Dir string

	// components are the started programs' names, in start order.
	components []string
	procs      []*proc
}

// proc is a started component.
type proc struct {
	name string
	done chan struct{}
	err  error
}

// Components are the names of the control plane's programs, in the order
// Start starts them; Logs takes them.
func (c *Cluster) Components() []string { return append([]string(nil), c.components...) }

// logTail is how much of a log Logs returns.
const logTail = 4000

// Logs returns the end of a component's log ("etcd", "kube-apiserver",
// "kube-controller-manager", "kube-scheduler", "jobset", "kueue", "kwok"),
// for failure messages. Start logs every component's end itself when the
// test has failed.
func (c *Cluster) Logs(component string) string {
	b, err := os.ReadFile(filepath.Join(c.Dir, component+".log"))
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > logTail {
		b = b[len(b)-logTail:]
		if i := strings.IndexByte(string(b), '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// bounded is a context for one call or wait of t, bounded by Guard.
func bounded(t testing.TB) (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.Context(), Guard)
}

// AddNode creates a node that KWOK manages, with cpu cores, memoryBytes of
// memory and gpus nvidia.com/gpu as its capacity and allocatable, and
// waits until it is Ready and schedulable. A node with GPUs carries
// GPUPresentLabel=true.
func (c *Cluster) AddNode(t testing.TB, name string, cpu int, memoryBytes int64, gpus int) {
	t.Helper()
	ctx, cancel := bounded(t)
	defer cancel()
	res := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(cpu), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(memoryBytes, resource.BinarySI),
		// The kubelet's default limit.
		corev1.ResourcePods: *resource.NewQuantity(110, resource.DecimalSI),
	}
	labels := map[string]string{
		corev1.LabelHostname: name, corev1.LabelOSStable: "linux", corev1.LabelArchStable: "amd64",
		"type": "kwok",
	}
	if gpus > 0 {
		res[GPUResource] = *resource.NewQuantity(int64(gpus), resource.DecimalSI)
		labels[GPUPresentLabel] = "true"
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels,
			Annotations: map[string]string{KWOKNodeAnnotation: "fake"}},
		Status: corev1.NodeStatus{Capacity: res, Allocatable: res.DeepCopy(), Phase: corev1.NodeRunning},
	}
	if _, err := c.Clients.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("kubetest: add node %s: %v", name, err)
	}
	// KWOK marks it Ready; the node lifecycle controller then lifts the
	// not-ready taint that admission put on it, which keeps pods off.
	c.WaitFor(t, "node "+name+" ready and schedulable", func() (bool, string, error) {
		n, err := c.Clients.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		ready := false
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				ready = cond.Status == corev1.ConditionTrue
			}
		}
		seen := fmt.Sprintf("ready=%t taints=%v", ready, n.Spec.Taints)
		for _, taint := range n.Spec.Taints {
			if taint.Effect == corev1.TaintEffectNoSchedule || taint.Effect == corev1.TaintEffectNoExecute {
				return false, seen, nil
			}
		}
		return ready, seen, nil
	})
}

// AddVolumeClaim creates a ReadWriteMany PersistentVolumeClaim in ns bound
// to a PersistentVolume of its own, and waits until the claim is Bound, so
// that pods mounting it can be scheduled. Nothing is mounted: KWOK's pods
// run nowhere.
func (c *Cluster) AddVolumeClaim(t testing.TB, ns, name string) {
	t.Helper()
	ctx, cancel := bounded(t)
	defer cancel()
	size := resource.MustParse("1Gi")
	pvName := ns + "-" + name
	empty := ""
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              empty,
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: "/kubetest/" + pvName}},
			// Reserved for the claim, so no other claim takes it.
			ClaimRef: &corev1.ObjectReference{APIVersion: "v1", Kind: "PersistentVolumeClaim", Namespace: ns, Name: name},
		},
	}
	if _, err := c.Clients.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatalf("kubetest: add volume claim %s/%s: create volume: %v", ns, name, err)
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
			// No storage class: the volume above, not a provisioner.
			StorageClassName: &empty,
			VolumeName:       pvName,
		},
	}
	if _, err := c.Clients.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("kubetest: add volume claim %s/%s: %v", ns, name, err)
	}
	c.WaitFor(t, "claim "+ns+"/"+name+" bound", func() (bool, string, error) {
		got, err := c.Clients.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		return got.Status.Phase == corev1.ClaimBound, "phase " + string(got.Status.Phase), nil
	})
}

// Pods lists the pods in ns that match the label selector ("" for all).
func (c *Cluster) Pods(t testing.TB, ns, selector string) []corev1.Pod {
	t.Helper()
	ctx, cancel := bounded(t)
	defer cancel()
	l, err := c.Clients.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatalf("kubetest: list pods in %s (%q): %v", ns, selector, err)
	}
	return l.Items
}

// FailPod makes a running pod look as a crashed process leaves it: its
// containers terminated with exitCode and the pod Failed, written through
// the status subresource as the kubelet would. KWOK then leaves it alone
// (none of the stages Start gives it matches a Failed pod), and the Job
// controller applies the Job's pod failure policy to the exit code.
func (c *Cluster) FailPod(t testing.TB, ns, name string, exitCode int32) {
	t.Helper()
	c.endPod(t, ns, name, exitCode, corev1.PodFailed, "Error")
}

// SucceedPod makes a running pod look as a process that exited 0 leaves
// it: Succeeded, its containers Completed. The Job controller counts its
// completion index as done.
func (c *Cluster) SucceedPod(t testing.TB, ns, name string) {
	t.Helper()
	c.endPod(t, ns, name, 0, corev1.PodSucceeded, "Completed")
}

func (c *Cluster) endPod(t testing.TB, ns, name string, exitCode int32, phase corev1.PodPhase, reason string) {
	t.Helper()
	ctx, cancel := bounded(t)
	defer cancel()
	pods := c.Clients.CoreV1().Pods(ns)
	for {
		pod, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("kubetest: end pod %s/%s: %v", ns, name, err)
		}
		if pod.Status.Phase != corev1.PodRunning {
			t.Fatalf("kubetest: end pod %s/%s: it is %s, not Running", ns, name, pod.Status.Phase)
		}
		now := metav1.Now()
		for i := range pod.Status.ContainerStatuses {
			cs := &pod.Status.ContainerStatuses[i]
			started := now
			if cs.State.Running != nil {
				started = cs.State.Running.StartedAt
			}
			cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: exitCode, Reason: reason, StartedAt: started, FinishedAt: now}}
			cs.Ready, cs.Started = false, ptr.To(false)
		}
		pod.Status.Phase = phase
		for i := range pod.Status.Conditions {
			cond := &pod.Status.Conditions[i]
			if cond.Type == corev1.PodReady || cond.Type == corev1.ContainersReady {
				cond.Status, cond.LastTransitionTime, cond.Reason = corev1.ConditionFalse, now, "Pod"+string(phase)
			}
		}
		_, err = pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		if err == nil {
			return
		}
		// KWOK or a controller wrote the pod in between: read it again.
		if !apierrors.IsConflict(err) {
			t.Fatalf("kubetest: end pod %s/%s: update status: %v", ns, name, err)
		}
	}
}

// WaitFor polls cond every 100 ms until it reports done, returns an
// error, a component exits or Guard passes, and then fails t with what
// cond saw last. When t fails, Start's cleanup logs the end of every
// component's log.
func (c *Cluster) WaitFor(t testing.TB, what string, cond func() (done bool, seen string, err error)) {
	t.Helper()
	deadline := time.Now().Add(Guard)
	for {
		for _, p := range c.procs {
			select {
			case <-p.done:
				t.Fatalf("kubetest: waiting for %s: %s exited (%v):\n%s", what, p.name, p.err, c.Logs(p.name))
			default:
			}
		}
		done, seen, err := cond()
		switch {
		case done:
			return
		case err != nil:
			t.Fatalf("kubetest: waiting for %s: %v (last seen: %s)", what, err, seen)
		case time.Now().After(deadline):
			t.Fatalf("kubetest: waiting for %s: not there after %v; last seen: %s", what, Guard, seen)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
