package kube

import (
	"fmt"
	"maps"
	"math"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/fleetlearn/fleetlearn/pool"
)

// Default flavor names, matching deploy/kubernetes/pool.
const (
	DefaultCPUFlavor = "default"
	DefaultGPUFlavor = "gpu"
	// maxWeight keeps a weight's millis within Kueue's quantity range with
	// room to spare.
	maxWeight = 1e6
)

// QueueConfig is how tenants map onto Kueue in one cluster.
type QueueConfig struct {
	// Namespace is where the pool's JobSets and LocalQueues live; each
	// ClusterQueue admits only from it.
	Namespace string
	// Cohort lets tenants' ClusterQueues borrow unused quota from each
	// other, shared by fair-share weight; empty gives each its own pool.
	Cohort string
	// CPUFlavor covers CPU and memory; empty is DefaultCPUFlavor.
	CPUFlavor string
	// GPUFlavor covers nvidia.com/gpu; empty is DefaultGPUFlavor.
	GPUFlavor string
	// GPUNodeLabels steer pods that take GPU quota to GPU nodes.
	GPUNodeLabels map[string]string
	// Capacity is the pool's whole size. A ClusterQueue needs a quota in
	// every dimension, so a tenant dimension pool leaves uncapped (zero)
	// gets this; a zero capacity there is an error.
	Capacity pool.Resources
}

func (q QueueConfig) withDefaults() QueueConfig {
	if q.CPUFlavor == "" {
		q.CPUFlavor = DefaultCPUFlavor
	}
	if q.GPUFlavor == "" {
		q.GPUFlavor = DefaultGPUFlavor
	}
	return q
}

func (q QueueConfig) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("kube: queue config: %s: %w", fmt.Sprintf(format, a...), ErrInvalidConfig)
	}
	if errs := validation.IsDNS1123Label(q.Namespace); len(errs) > 0 {
		return bad("namespace %.64q: %s", q.Namespace, strings.Join(errs, "; "))
	}
	for what, n := range map[string]string{"cohort": q.Cohort, "CPU flavor": q.CPUFlavor, "GPU flavor": q.GPUFlavor} {
		if n == "" && what == "cohort" {
			continue
		}
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			return bad("%s %.64q: %s", what, n, strings.Join(errs, "; "))
		}
	}
	if q.CPUFlavor == q.GPUFlavor {
		return bad("CPU and GPU flavors are both %q; name two flavors", q.CPUFlavor)
	}
	if len(q.GPUNodeLabels) > 8 {
		return bad("%d GPU node labels, at most 8", len(q.GPUNodeLabels))
	}
	for k, v := range q.GPUNodeLabels {
		if errs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(errs) > 0 {
			return bad("GPU node label %.64q=%.64q: %s", k, v, strings.Join(errs, "; "))
		}
	}
	if q.Capacity.MilliCPU < 0 || q.Capacity.Memory < 0 || q.Capacity.GPUs < 0 {
		return bad("capacity %s is negative", q.Capacity)
	}
	return nil
}

// Flavors are the cluster's two ResourceFlavors: one for CPU and memory on
// any node, one for GPUs on the nodes GPUNodeLabels select.
func Flavors(qc QueueConfig) ([]*kueue.ResourceFlavor, error) {
	qc = qc.withDefaults()
	if err := qc.validate(); err != nil {
		return nil, err
	}
	tm := metav1.TypeMeta{APIVersion: kueue.GroupVersion.String(), Kind: "ResourceFlavor"}
	return []*kueue.ResourceFlavor{
		{TypeMeta: tm, ObjectMeta: metav1.ObjectMeta{Name: qc.CPUFlavor}},
		{TypeMeta: tm, ObjectMeta: metav1.ObjectMeta{Name: qc.GPUFlavor},
			Spec: kueue.ResourceFlavorSpec{NodeLabels: maps.Clone(qc.GPUNodeLabels)}},
	}, nil
}

// TenantQueues are a tenant's ClusterQueue (its quota and fair-share
// weight) and the LocalQueue its JobSets name.
func TenantQueues(name string, t pool.Tenant, qc QueueConfig) (*kueue.ClusterQueue, *kueue.LocalQueue, error) {
	qc = qc.withDefaults()
	if err := qc.validate(); err != nil {
		return nil, nil, err
	}
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return nil, nil, fmt.Errorf("kube: tenant %.64q: %s: %w", name, strings.Join(errs, "; "), ErrInvalidConfig)
	}
	if !(t.Weight > 0) || t.Weight > maxWeight || math.Round(t.Weight*1000) < 1 {
		return nil, nil, fmt.Errorf("kube: tenant %s: weight %v outside [0.001, %v]: %w", name, t.Weight, float64(maxWeight), ErrInvalidConfig)
	}
	quota := func(what string, v, capacity int64) (int64, error) {
		switch {
		case v < 0:
			return 0, fmt.Errorf("kube: tenant %s: %s quota %d is negative: %w", name, what, v, ErrInvalidConfig)
		case v > 0:
			return v, nil
		case capacity > 0:
			return capacity, nil
		}
		return 0, fmt.Errorf("kube: tenant %s: %s is uncapped and the queue config has no %s capacity; set one of them: %w", name, what, what, ErrInvalidConfig)
	}
	cpu, err := quota("CPU", t.Quota.MilliCPU, qc.Capacity.MilliCPU)
	if err != nil {
		return nil, nil, err
	}
	mem, err := quota("memory", t.Quota.Memory, qc.Capacity.Memory)
	if err != nil {
		return nil, nil, err
	}
	// GPUs may be 0 for a CPU-only cluster: GPU jobs then never fit.
	gpus := t.Quota.GPUs
	if gpus == 0 {
		gpus = qc.Capacity.GPUs
	}
	if gpus < 0 {
		return nil, nil, fmt.Errorf("kube: tenant %s: GPU quota %d is negative: %w", name, gpus, ErrInvalidConfig)
	}
	qname := QueueName(name)
	labels := map[string]string{LabelTenant: name}
	weight := resource.NewMilliQuantity(int64(math.Round(t.Weight*1000)), resource.DecimalSI)
	cq := &kueue.ClusterQueue{
		TypeMeta:   metav1.TypeMeta{APIVersion: kueue.GroupVersion.String(), Kind: "ClusterQueue"},
		ObjectMeta: metav1.ObjectMeta{Name: qname, Labels: labels},
		Spec: kueue.ClusterQueueSpec{
			CohortName: kueue.CohortReference(qc.Cohort),
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{
				corev1.LabelMetadataName: qc.Namespace}},
			QueueingStrategy: kueue.BestEffortFIFO,
			ResourceGroups: []kueue.ResourceGroup{
				{
					CoveredResources: []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory},
					Flavors: []kueue.FlavorQuotas{{Name: kueue.ResourceFlavorReference(qc.CPUFlavor), Resources: []kueue.ResourceQuota{
						{Name: corev1.ResourceCPU, NominalQuota: *resource.NewMilliQuantity(cpu, resource.DecimalSI)},
						{Name: corev1.ResourceMemory, NominalQuota: *resource.NewQuantity(mem, resource.BinarySI)},
					}}},
				},
				{
					CoveredResources: []corev1.ResourceName{GPUResource},
					Flavors: []kueue.FlavorQuotas{{Name: kueue.ResourceFlavorReference(qc.GPUFlavor), Resources: []kueue.ResourceQuota{
						{Name: GPUResource, NominalQuota: *resource.NewQuantity(gpus, resource.DecimalSI)},
					}}},
				},
			},
			// Pool priorities preempt lower ones, as the pool scheduler does.
			Preemption:  &kueue.ClusterQueuePreemption{WithinClusterQueue: kueue.PreemptionPolicyLowerPriority},
			FairSharing: &kueue.FairSharing{Weight: weight},
		},
	}
	lq := &kueue.LocalQueue{
		TypeMeta:   metav1.TypeMeta{APIVersion: kueue.GroupVersion.String(), Kind: "LocalQueue"},
		ObjectMeta: metav1.ObjectMeta{Name: qname, Namespace: qc.Namespace, Labels: labels},
		Spec:       kueue.LocalQueueSpec{ClusterQueue: kueue.ClusterQueueReference(qname)},
	}
	return cq, lq, nil
}

// PriorityClass is the Kueue WorkloadPriorityClass of a pool priority:
// jobs with a higher one are admitted first and, where a ClusterQueue
// preempts LowerPriority, evict lower ones.
func PriorityClass(priority int32) *kueue.WorkloadPriorityClass {
	return &kueue.WorkloadPriorityClass{
		TypeMeta:    metav1.TypeMeta{APIVersion: kueue.GroupVersion.String(), Kind: "WorkloadPriorityClass"},
		ObjectMeta:  metav1.ObjectMeta{Name: PriorityClassName(priority)},
		Value:       priority,
		Description: fmt.Sprintf("Fleetlearn pool priority %d", priority),
	}
}
