package kube

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/fake"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"

	"github.com/fleetlearn/fleetlearn/pool"
)

var jobsets = jobset.GroupVersion.WithResource("jobsets")

// TestStateThroughDynamicClient creates the rendered JobSet with a
// client-go dynamic client, writes the statuses the JobSet controller
// writes, reads each back and maps it.
func TestStateThroughDynamicClient(t *testing.T) {
	ctx := context.Background()
	client := fake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{jobsets: "JobSetList"})
	js, err := Render(gpuJob(), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	// Render's JobSets never restart; one that does was made by another
	// hand, with restarts of its own.
	js.Spec.FailurePolicy.MaxRestarts = 5
	m, err := ToUnstructured(js)
	if err != nil {
		t.Fatal(err)
	}
	res := client.Resource(jobsets).Namespace(js.Namespace)
	if _, err := res.Create(ctx, &unstructured.Unstructured{Object: m}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cond := func(typ jobset.JobSetConditionType, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: string(typ), Status: metav1.ConditionTrue, Reason: reason, Message: msg, LastTransitionTime: metav1.Unix(1_700_000_000, 0)}
	}
	steps := []struct {
		name      string
		unsuspend bool
		status    jobset.JobSetStatus
		want      pool.State
		restarts  int32
		reason    string
		retryable bool
	}{
		{"created", false, jobset.JobSetStatus{}, pool.Queued, 0, "LocalQueue fl-research", false},
		{"admitted", true, jobset.JobSetStatus{}, pool.Running, 0, "running", false},
		{"restarted", true, jobset.JobSetStatus{Restarts: 2, RestartsCountTowardsMax: 2}, pool.Running, 2, "restart 2 of at most 5", false},
		{"preempted", false, jobset.JobSetStatus{Restarts: 2, Conditions: []metav1.Condition{cond(jobset.JobSetSuspended, "SuspendedJobs", "jobset is suspended")}}, pool.Queued, 2, "SuspendedJobs", false},
		{"exit 1", true, jobset.JobSetStatus{Restarts: 2, Conditions: []metav1.Condition{cond(jobset.JobSetFailed, "FailurePolicyRuleMatched", "rule nonRetryableExit matched job fl-llm-pretrain-a3-rank-0")}}, pool.Failed, 2, "nonRetryableExit", false},
		{"limit", true, jobset.JobSetStatus{Restarts: 5, Conditions: []metav1.Condition{cond(jobset.JobSetFailed, "ReachedMaxRestarts", "jobset failed due to reaching max number of restarts")}}, pool.Failed, 5, "ReachedMaxRestarts", true},
		{"done", true, jobset.JobSetStatus{Restarts: 1, Conditions: []metav1.Condition{cond(jobset.JobSetCompleted, "AllJobsCompleted", "jobset completed successfully")}}, pool.Succeeded, 1, "AllJobsCompleted", false},
		{"old controller", true, jobset.JobSetStatus{Restarts: 3}, pool.Running, 3, "restart 3", false},
	}
	for _, st := range steps {
		got, err := res.Get(ctx, js.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := unstructured.SetNestedField(got.Object, !st.unsuspend, "spec", "suspend"); err != nil {
			t.Fatal(err)
		}
		if got, err = res.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		status, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&st.status)
		if err != nil {
			t.Fatal(err)
		}
		got.Object["status"] = status
		if _, err := res.UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		back, err := res.Get(ctx, js.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s, err := StateOfUnstructured(back)
		if err != nil {
			t.Fatal(err)
		}
		if s.State != st.want || s.Restarts != st.restarts || !strings.Contains(s.Reason, st.reason) || s.Retryable != st.retryable {
			t.Errorf("%s: got %v (%q, %d restarts, retryable %v), want %v with %q, %d restarts, retryable %v",
				st.name, s.State, s.Reason, s.Restarts, s.Retryable, st.want, st.reason, st.restarts, st.retryable)
		}
	}
}

func TestStateOfRefusesOtherKinds(t *testing.T) {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("batch/v1")
	u.SetKind("Job")
	if _, err := StateOfUnstructured(u); err == nil {
		t.Fatal("a Job mapped as a JobSet")
	}
}

func TestStateReasonBounded(t *testing.T) {
	js := &jobset.JobSet{Status: jobset.JobSetStatus{Conditions: []metav1.Condition{{Type: string(jobset.JobSetFailed),
		Status: metav1.ConditionTrue, Reason: "X", Message: strings.Repeat("é", 10_000)}}}}
	s := StateOf(js)
	if s.State != pool.Failed || len(s.Reason) > maxReason+len("…") {
		t.Fatalf("state %v, reason of %d bytes", s.State, len(s.Reason))
	}
}
