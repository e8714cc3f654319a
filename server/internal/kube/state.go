package kube

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"

	"github.com/fleetlearn/fleetlearn/pool"
)

// maxReason bounds a reason taken from the API server, which holds
// whatever a controller wrote.
const maxReason = 512

// Status is what the job service needs from a JobSet.
type Status struct {
	// State is Queued (suspended, waiting for Kueue), Running, Succeeded
	// or Failed.
	State pool.State
	// Reason says why, from the deciding condition where there is one.
	Reason string
	// Restarts are the JobSet's restarts of the whole gang. The JobSets
	// Render makes never restart (the job service starts a new attempt
	// instead), so for them it stays 0.
	Restarts int32
	// Retryable marks a Failed JobSet whose failure the failure policy
	// would have restarted (reason ReachedMaxRestarts): a rank exited with
	// a retryable code, or its pod was lost. The job service may start
	// the next attempt from the last checkpoint.
	Retryable bool
}

// reachedMaxRestarts is the JobSet controller's Failed reason when its
// restart rule matched with no restarts left.
const reachedMaxRestarts = "ReachedMaxRestarts"

// StateOf maps a JobSet's status onto the pool job's state. Terminal
// conditions win over suspension: a finished JobSet stays finished.
func StateOf(js *jobset.JobSet) Status {
	st := js.Status
	// restartsCountTowardsMax is what max_restarts limits; controllers
	// older than that field only count restarts, which equals it when no
	// rule ignores the limit, as none of ours do.
	s := Status{Restarts: max(st.Restarts, st.RestartsCountTowardsMax, 0)}
	if c := meta.FindStatusCondition(st.Conditions, string(jobset.JobSetCompleted)); c != nil && c.Status == metav1.ConditionTrue {
		s.State, s.Reason = pool.Succeeded, reasonOf(c, "every rank succeeded")
		return s
	}
	if c := meta.FindStatusCondition(st.Conditions, string(jobset.JobSetFailed)); c != nil && c.Status == metav1.ConditionTrue {
		s.State, s.Reason = pool.Failed, reasonOf(c, "the JobSet failed")
		s.Retryable = c.Reason == reachedMaxRestarts
		return s
	}
	if c := meta.FindStatusCondition(st.Conditions, string(jobset.JobSetSuspended)); c != nil && c.Status == metav1.ConditionTrue {
		s.State, s.Reason = pool.Queued, reasonOf(c, "suspended")
		return s
	}
	if js.Spec.Suspend != nil && *js.Spec.Suspend {
		s.State, s.Reason = pool.Queued, "waiting for admission from LocalQueue "+js.Labels[LabelQueueName]
		return s
	}
	s.State, s.Reason = pool.Running, "running"
	if s.Restarts > 0 {
		limit := "?"
		if fp := js.Spec.FailurePolicy; fp != nil {
			limit = fmt.Sprint(fp.MaxRestarts)
		}
		s.Reason = fmt.Sprintf("running after restart %d of at most %s", s.Restarts, limit)
	}
	return s
}

// StateOfUnstructured is StateOf for what a dynamic client or informer
// returns.
func StateOfUnstructured(u *unstructured.Unstructured) (Status, error) {
	if gvk := u.GroupVersionKind(); gvk != jobset.GroupVersion.WithKind("JobSet") {
		return Status{}, fmt.Errorf("kube: state of %s %s: %w", gvk, u.GetName(), ErrNotJobSet)
	}
	var js jobset.JobSet
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &js); err != nil {
		return Status{}, fmt.Errorf("kube: state of JobSet %s: %w", u.GetName(), err)
	}
	return StateOf(&js), nil
}

func reasonOf(c *metav1.Condition, fallback string) string {
	r := strings.TrimSpace(c.Reason + ": " + c.Message)
	r = strings.Trim(r, ": ")
	if r == "" {
		r = fallback
	}
	if len(r) > maxReason {
		r = strings.ToValidUTF8(r[:maxReason], "") + "…"
	}
	return r
}
