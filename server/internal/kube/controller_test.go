package kube

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	"github.com/fleetlearn/fleetlearn/pool"
)

// hangGuard only stops a hung test; events normally arrive in
// milliseconds.
const hangGuard = 60 * time.Second

// fakeCluster is a fake dynamic client that knows the JobSet and Kueue
// resources, and signals on watching each time a JobSet watch is open, so
// a test can delete objects knowing the deletion is seen.
type fakeCluster struct {
	*fake.FakeDynamicClient
	watching chan struct{}
}

func newFakeCluster(t *testing.T) *fakeCluster {
	t.Helper()
	client := fake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		JobSetResource: "JobSetList", ResourceFlavorResource: "ResourceFlavorList",
		ClusterQueueResource: "ClusterQueueList", LocalQueueResource: "LocalQueueList"})
	fc := &fakeCluster{FakeDynamicClient: client, watching: make(chan struct{}, 16)}
	client.PrependWatchReactor("jobsets", func(a clienttesting.Action) (bool, watch.Interface, error) {
		wa := a.(clienttesting.WatchActionImpl)
		w, err := client.Tracker().Watch(a.GetResource(), a.GetNamespace(), wa.ListOptions)
		if err == nil {
			select {
			case fc.watching <- struct{}{}:
			default:
			}
		}
		return true, w, err
	})
	return fc
}

func (fc *fakeCluster) jobsets() dynamic.ResourceInterface {
	return fc.Resource(JobSetResource).Namespace(testConfig().Namespace)
}

func (fc *fakeCluster) waitWatching(t *testing.T) {
	t.Helper()
	select {
	case <-fc.watching:
	case <-time.After(hangGuard):
		t.Fatal("no JobSet watch opened")
	}
}

// mutate changes a stored JobSet in one update, so the watch sees one
// event.
func (fc *fakeCluster) mutate(t *testing.T, name string, f func(u *unstructured.Unstructured)) {
	t.Helper()
	ctx := context.Background()
	u, err := fc.jobsets().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f(u)
	if _, err := fc.jobsets().Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func setStatus(t *testing.T, u *unstructured.Unstructured, suspend bool, st jobset.JobSetStatus) {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&st)
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(u.Object, suspend, "spec", "suspend"); err != nil {
		t.Fatal(err)
	}
	u.Object["status"] = m
}

func condTrue(typ jobset.JobSetConditionType, reason string) metav1.Condition {
	return metav1.Condition{Type: string(typ), Status: metav1.ConditionTrue, Reason: reason, LastTransitionTime: metav1.Unix(1_700_000_000, 0)}
}

// rawJobSet is a JobSet with the given name and labels and an empty spec.
func rawJobSet(name string, labels map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"suspend": true}}}
	u.SetAPIVersion(jobset.GroupVersion.String())
	u.SetKind("JobSet")
	u.SetNamespace(testConfig().Namespace)
	u.SetName(name)
	u.SetLabels(labels)
	return u
}

type sinkEvent struct {
	kind    string // state, gone or synced
	jobID   string
	attempt uint32
	st      Status
}

type recSink struct{ ch chan sinkEvent }

func newRecSink() *recSink { return &recSink{ch: make(chan sinkEvent, 256)} }

func (s *recSink) JobSetState(jobID string, attempt uint32, st Status) {
	s.ch <- sinkEvent{kind: "state", jobID: jobID, attempt: attempt, st: st}
}
func (s *recSink) JobSetGone(jobID string, attempt uint32) {
	s.ch <- sinkEvent{kind: "gone", jobID: jobID, attempt: attempt}
}
func (s *recSink) JobSetsSynced() { s.ch <- sinkEvent{kind: "synced"} }

func (s *recSink) next(t *testing.T) sinkEvent {
	t.Helper()
	select {
	case e := <-s.ch:
		return e
	case <-time.After(hangGuard):
		t.Fatal("no sink event")
		return sinkEvent{}
	}
}

// expectState takes the next event, which must be the attempt's state.
func (s *recSink) expectState(t *testing.T, jobID string, attempt uint32, state pool.State, reason string) Status {
	t.Helper()
	e := s.next(t)
	if e.kind != "state" || e.jobID != jobID || e.attempt != attempt || e.st.State != state || !strings.Contains(e.st.Reason, reason) {
		t.Fatalf("got %+v, want state %s for %s attempt %d with reason containing %q", e, state, jobID, attempt, reason)
	}
	return e.st
}

func (s *recSink) expect(t *testing.T, kind, jobID string, attempt uint32) {
	t.Helper()
	if e := s.next(t); e.kind != kind || e.jobID != jobID || e.attempt != attempt {
		t.Fatalf("got %+v, want %s %s attempt %d", e, kind, jobID, attempt)
	}
}

// syncBuffer collects log output written from Watch's goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func newTestController(t *testing.T, fc *fakeCluster, opts ...ControllerOption) (*Controller, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	opts = append([]ControllerOption{WithLogger(slog.New(slog.NewTextHandler(logs, nil)))}, opts...)
	c, err := NewController(fc, testConfig(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c, logs
}

// startWatch runs Watch until the test ends and checks it returns nil.
func startWatch(t *testing.T, c *Controller, sink Sink) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Watch(ctx, sink) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-errc:
				if err != nil {
					t.Errorf("Watch: %v", err)
				}
			case <-time.After(hangGuard):
				t.Error("Watch did not return after its context ended")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func TestNewControllerRefusesBadSettings(t *testing.T) {
	fc := newFakeCluster(t)
	if _, err := NewController(nil, testConfig()); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("nil client: %v", err)
	}
	bad := testConfig()
	bad.Namespace = "Not_A_Namespace"
	if _, err := NewController(fc, bad); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("bad namespace: %v", err)
	}
	if _, err := NewController(fc, testConfig(), WithResync(100*time.Millisecond)); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "at least 1s") {
		t.Errorf("resync 100ms: %v", err)
	}
}

func TestStartIsIdempotent(t *testing.T) {
	ctx := context.Background()
	fc := newFakeCluster(t)
	c, _ := newTestController(t, fc)
	for i := range 2 {
		if err := c.Start(ctx, gpuJob()); err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
	}
	l, err := fc.jobsets().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 1 || l.Items[0].GetName() != JobSetName("llm-pretrain", 3) {
		t.Fatalf("JobSets after two starts: %d", len(l.Items))
	}
	js, err := Render(gpuJob(), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	want, err := ToUnstructured(js)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Items[0].Object["spec"]; !reflect.DeepEqual(got, want["spec"]) {
		t.Errorf("stored spec differs from the rendering:\n%v\n%v", got, want["spec"])
	}
	// The next attempt is a JobSet of its own.
	next := gpuJob()
	next.Attempt = 4
	if err := c.Start(ctx, next); err != nil {
		t.Fatal(err)
	}
	if _, err := fc.jobsets().Get(ctx, JobSetName("llm-pretrain", 4), metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	bad := gpuJob()
	bad.Attempt = 0
	if err := c.Start(ctx, bad); !errors.Is(err, ErrInvalidJob) {
		t.Errorf("attempt 0: %v", err)
	}
}

func TestStartRefusesForeignJobSet(t *testing.T) {
	ctx := context.Background()
	name := JobSetName("mnist-cpu", 1)
	for _, tc := range []struct {
		what   string
		labels map[string]string
	}{
		{"unlabelled", nil},
		{"another job", map[string]string{LabelJob: "other", LabelAttempt: "1"}},
		{"another attempt", map[string]string{LabelJob: "mnist-cpu", LabelAttempt: "2"}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			fc := newFakeCluster(t)
			c, _ := newTestController(t, fc)
			if _, err := fc.jobsets().Create(ctx, rawJobSet(name, tc.labels), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			err := c.Start(ctx, cpuJob())
			if !errors.Is(err, ErrForeignObject) || !strings.Contains(err.Error(), name) {
				t.Fatalf("start over a foreign JobSet: %v", err)
			}
			// Stop leaves it alone too.
			if err := c.Stop(ctx, "mnist-cpu", 1); !errors.Is(err, ErrForeignObject) {
				t.Fatalf("stop of a foreign JobSet: %v", err)
			}
			if _, err := fc.jobsets().Get(ctx, name, metav1.GetOptions{}); err != nil {
				t.Fatalf("foreign JobSet: %v", err)
			}
		})
	}
	t.Run("terminating", func(t *testing.T) {
		fc := newFakeCluster(t)
		c, _ := newTestController(t, fc)
		u := rawJobSet(name, map[string]string{LabelJob: "mnist-cpu", LabelAttempt: "1"})
		now := metav1.Unix(1_700_000_000, 0)
		u.SetDeletionTimestamp(&now)
		if _, err := fc.jobsets().Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx, cpuJob()); !errors.Is(err, ErrTerminating) {
			t.Fatalf("start over a terminating JobSet: %v", err)
		}
	})
}

func TestStopTwice(t *testing.T) {
	ctx := context.Background()
	fc := newFakeCluster(t)
	c, _ := newTestController(t, fc)
	if err := c.Start(ctx, cpuJob()); err != nil {
		t.Fatal(err)
	}
	fc.ClearActions()
	for i := range 2 {
		if err := c.Stop(ctx, "mnist-cpu", 1); err != nil {
			t.Fatalf("stop %d: %v", i, err)
		}
	}
	if _, err := fc.jobsets().Get(ctx, JobSetName("mnist-cpu", 1), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("JobSet after stop: %v", err)
	}
	deletes := 0
	for _, a := range fc.Actions() {
		if d, ok := a.(clienttesting.DeleteActionImpl); ok {
			deletes++
			if p := d.DeleteOptions.PropagationPolicy; p == nil || *p != metav1.DeletePropagationBackground {
				t.Errorf("delete propagation %v, want Background", p)
			}
		}
	}
	if deletes != 1 {
		t.Errorf("%d deletes for two stops, want 1", deletes)
	}
	if err := c.Stop(ctx, "", 1); !errors.Is(err, ErrInvalidJob) {
		t.Errorf("empty id: %v", err)
	}
	if err := c.Stop(ctx, "mnist-cpu", 0); !errors.Is(err, ErrInvalidJob) {
		t.Errorf("attempt 0: %v", err)
	}
}

func TestEnsureQueues(t *testing.T) {
	ctx := context.Background()
	fc := newFakeCluster(t)
	c, _ := newTestController(t, fc)
	tenants := map[string]pool.Tenant{"research": testTenant(), "ops": {Weight: 1}}
	qc := testQueueConfig()
	if err := c.EnsureQueues(ctx, tenants, qc); err != nil {
		t.Fatal(err)
	}
	type key struct {
		res      schema.GroupVersionResource
		ns, name string
	}
	want := map[key]runtime.Object{}
	flavors, err := Flavors(qc)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range flavors {
		want[key{ResourceFlavorResource, "", f.Name}] = f
	}
	for name, tn := range tenants {
		cq, lq, err := TenantQueues(name, tn, qc)
		if err != nil {
			t.Fatal(err)
		}
		want[key{ClusterQueueResource, "", cq.Name}] = cq
		want[key{LocalQueueResource, lq.Namespace, lq.Name}] = lq
	}
	check := func(when string) {
		t.Helper()
		for k, obj := range want {
			m, err := ToUnstructured(obj)
			if err != nil {
				t.Fatal(err)
			}
			var res dynamic.ResourceInterface = fc.Resource(k.res)
			if k.ns != "" {
				res = fc.Resource(k.res).Namespace(k.ns)
			}
			got, err := res.Get(ctx, k.name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("%s: %s %s: %v", when, k.res.Resource, k.name, err)
			}
			if !reflect.DeepEqual(got.Object["spec"], m["spec"]) {
				t.Errorf("%s: %s %s spec\n got %v\nwant %v", when, k.res.Resource, k.name, got.Object["spec"], m["spec"])
			}
			for lk, lv := range obj.(metav1.Object).GetLabels() {
				if got.GetLabels()[lk] != lv {
					t.Errorf("%s: %s %s label %s=%q, want %q", when, k.res.Resource, k.name, lk, got.GetLabels()[lk], lv)
				}
			}
		}
	}
	check("first")
	writes := func() (n int) {
		for _, a := range fc.Actions() {
			if v := a.GetVerb(); v != "get" {
				n++
			}
		}
		return n
	}

	fc.ClearActions()
	if err := c.EnsureQueues(ctx, tenants, qc); err != nil {
		t.Fatal(err)
	}
	check("second")
	if n := writes(); n != 0 {
		t.Errorf("second EnsureQueues wrote %d times, want 0: %v", n, fc.Actions())
	}

	// A label and status someone else wrote survive an update.
	cqs := fc.Resource(ClusterQueueResource)
	cq, err := cqs.Get(ctx, QueueName("research"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	labels := cq.GetLabels()
	labels["team"] = "ml"
	cq.SetLabels(labels)
	cq.Object["status"] = map[string]any{"pendingWorkloads": int64(3)}
	if _, err := cqs.Update(ctx, cq, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	research := testTenant()
	research.Quota.MilliCPU = 32_000
	tenants["research"] = research
	cqWant, _, err := TenantQueues("research", research, qc)
	if err != nil {
		t.Fatal(err)
	}
	want[key{ClusterQueueResource, "", cqWant.Name}] = cqWant
	fc.ClearActions()
	if err := c.EnsureQueues(ctx, tenants, qc); err != nil {
		t.Fatal(err)
	}
	check("changed quota")
	if n := writes(); n != 1 {
		t.Errorf("quota change wrote %d times, want 1 (the ClusterQueue): %v", n, fc.Actions())
	}
	cq, err = cqs.Get(ctx, QueueName("research"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if q, _, _ := unstructured.NestedSlice(cq.Object, "spec", "resourceGroups"); len(q) == 0 ||
		!strings.Contains(stringOf(q[0]), "nominalQuota:32") {
		t.Errorf("ClusterQueue resource groups after the change: %v", q)
	}
	if cq.GetLabels()["team"] != "ml" || cq.Object["status"] == nil {
		t.Errorf("update dropped what others wrote: labels %v, status %v", cq.GetLabels(), cq.Object["status"])
	}
}

func stringOf(v any) string {
	var b strings.Builder
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				b.WriteString(k + ":")
				walk(e)
				b.WriteString(" ")
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		case string:
			b.WriteString(x)
		}
	}
	walk(v)
	return b.String()
}

func TestEnsureQueuesRefuses(t *testing.T) {
	ctx := context.Background()
	fc := newFakeCluster(t)
	c, _ := newTestController(t, fc)
	tenants := map[string]pool.Tenant{"ops": {Weight: 1}}

	other := testQueueConfig()
	other.Namespace = "elsewhere"
	if err := c.EnsureQueues(ctx, tenants, other); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "never admit") {
		t.Errorf("queue namespace differs: %v", err)
	}
	if err := c.EnsureQueues(ctx, map[string]pool.Tenant{"ops": {Weight: 0}}, testQueueConfig()); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("weight 0: %v", err)
	}
	if len(fc.Actions()) != 0 {
		t.Errorf("refused settings still wrote: %v", fc.Actions())
	}

	foreign := &unstructured.Unstructured{}
	foreign.SetAPIVersion("kueue.x-k8s.io/v1beta2")
	foreign.SetKind("ClusterQueue")
	foreign.SetName(QueueName("ops"))
	foreign.SetLabels(map[string]string{LabelTenant: "someone-else"})
	if _, err := fc.Resource(ClusterQueueResource).Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.EnsureQueues(ctx, tenants, testQueueConfig()); !errors.Is(err, ErrForeignObject) || !strings.Contains(err.Error(), "someone-else") {
		t.Errorf("foreign ClusterQueue: %v", err)
	}
	got, err := fc.Resource(ClusterQueueResource).Get(ctx, QueueName("ops"), metav1.GetOptions{})
	if err != nil || got.Object["spec"] != nil {
		t.Errorf("foreign ClusterQueue was changed: %v %v", got, err)
	}
}

func TestWatchReportsTransitions(t *testing.T) {
	ctx := context.Background()
	fc := newFakeCluster(t)
	c, _ := newTestController(t, fc)
	// Made before the watch: reported from the first list.
	if err := c.Start(ctx, cpuJob()); err != nil {
		t.Fatal(err)
	}
	sink := newRecSink()
	stop := startWatch(t, c, sink)
	sink.expectState(t, "mnist-cpu", 1, pool.Queued, "LocalQueue fl-research")
	sink.expect(t, "synced", "", 0)
	fc.waitWatching(t)

	cpu := JobSetName("mnist-cpu", 1)
	fc.mutate(t, cpu, func(u *unstructured.Unstructured) { setStatus(t, u, false, jobset.JobSetStatus{}) })
	sink.expectState(t, "mnist-cpu", 1, pool.Running, "running")
	// Neither an unrelated change nor the same status again is reported.
	fc.mutate(t, cpu, func(u *unstructured.Unstructured) { u.SetAnnotations(map[string]string{"note": "x"}) })
	fc.mutate(t, cpu, func(u *unstructured.Unstructured) { setStatus(t, u, false, jobset.JobSetStatus{}) })
	fc.mutate(t, cpu, func(u *unstructured.Unstructured) { setStatus(t, u, false, jobset.JobSetStatus{Restarts: 1}) })
	if st := sink.expectState(t, "mnist-cpu", 1, pool.Running, "restart 1 of at most 0"); st.Restarts != 1 {
		t.Errorf("restarts %d, want 1", st.Restarts)
	}
	fc.mutate(t, cpu, func(u *unstructured.Unstructured) {
		setStatus(t, u, false, jobset.JobSetStatus{Restarts: 1, Conditions: []metav1.Condition{condTrue(jobset.JobSetCompleted, "AllJobsCompleted")}})
	})
	sink.expectState(t, "mnist-cpu", 1, pool.Succeeded, "AllJobsCompleted")

	// Made while watching.
	if err := c.Start(ctx, gpuJob()); err != nil {
		t.Fatal(err)
	}
	gpu := JobSetName("llm-pretrain", 3)
	sink.expectState(t, "llm-pretrain", 3, pool.Queued, "LocalQueue")
	fc.mutate(t, gpu, func(u *unstructured.Unstructured) { setStatus(t, u, false, jobset.JobSetStatus{}) })
	sink.expectState(t, "llm-pretrain", 3, pool.Running, "running")
	fc.mutate(t, gpu, func(u *unstructured.Unstructured) {
		setStatus(t, u, false, jobset.JobSetStatus{Conditions: []metav1.Condition{condTrue(jobset.JobSetFailed, "FailurePolicyRuleMatched")}})
	})
	sink.expectState(t, "llm-pretrain", 3, pool.Failed, "FailurePolicyRuleMatched")

	if err := c.Stop(ctx, "mnist-cpu", 1); err != nil {
		t.Fatal(err)
	}
	sink.expect(t, "gone", "mnist-cpu", 1)
	if err := c.Stop(ctx, "llm-pretrain", 3); err != nil {
		t.Fatal(err)
	}
	sink.expect(t, "gone", "llm-pretrain", 3)

	// Once Watch has returned no call can come, so an empty sink now
	// means no change was reported twice.
	stop()
	select {
	case e := <-sink.ch:
		t.Errorf("unexpected event %+v", e)
	default:
	}
}

func TestWatchIgnoresForeignAndMalformed(t *testing.T) {
	ctx := context.Background()
	fc := newFakeCluster(t)
	c, logs := newTestController(t, fc)
	bad := func(suffix string) []*unstructured.Unstructured {
		badStatus := rawJobSet(JobSetName("bad-status"+suffix, 1), map[string]string{LabelJob: "bad-status" + suffix, LabelAttempt: "1"})
		badStatus.Object["status"] = map[string]any{"restarts": "many"}
		return []*unstructured.Unstructured{
			rawJobSet("someone-else"+suffix, map[string]string{"app": "other"}),
			rawJobSet(JobSetName("no-job"+suffix, 1), map[string]string{LabelAttempt: "1"}),
			rawJobSet(JobSetName("no-attempt"+suffix, 1), map[string]string{LabelJob: "no-attempt" + suffix}),
			rawJobSet(JobSetName("bad-attempt"+suffix, 1), map[string]string{LabelJob: "bad-attempt" + suffix, LabelAttempt: "x"}),
			rawJobSet(JobSetName("zero"+suffix, 0), map[string]string{LabelJob: "zero" + suffix, LabelAttempt: "0"}),
			rawJobSet("fl-renamed"+suffix, map[string]string{LabelJob: "renamed" + suffix, LabelAttempt: "1"}),
			badStatus,
		}
	}
	for _, u := range bad("") {
		if _, err := fc.jobsets().Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Start(ctx, cpuJob()); err != nil {
		t.Fatal(err)
	}
	sink := newRecSink()
	stop := startWatch(t, c, sink)
	sink.expectState(t, "mnist-cpu", 1, pool.Queued, "LocalQueue")
	sink.expect(t, "synced", "", 0)
	fc.waitWatching(t)

	// The same while watching; the next event must be the good JobSet's.
	for _, u := range bad("-later") {
		if _, err := fc.jobsets().Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Start(ctx, gpuJob()); err != nil {
		t.Fatal(err)
	}
	sink.expectState(t, "llm-pretrain", 3, pool.Queued, "LocalQueue")

	// Deleting a foreign JobSet reports nothing; one that names an
	// attempt is gone even though its status never parsed.
	if err := fc.jobsets().Delete(ctx, "someone-else", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := fc.jobsets().Delete(ctx, JobSetName("bad-status", 1), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sink.expect(t, "gone", "bad-status", 1)
	stop()
	select {
	case e := <-sink.ch:
		t.Errorf("unexpected event %+v", e)
	default:
	}
	out := logs.String()
	for _, reason := range []string{"no fleetlearn.io/pool-job label", "no fleetlearn.io/attempt label",
		`fleetlearn.io/attempt label \"x\" is not an attempt number`, `label \"0\" is not an attempt number`,
		"whose JobSet is fl-renamed-a1", "state of JobSet fl-bad-status-a1", "state of JobSet fl-bad-status-later-a1"} {
		if !strings.Contains(out, reason) {
			t.Errorf("log lacks %q:\n%s", reason, out)
		}
	}
}

// TestWatchRelistsAfterFailure breaks the first watch: Watch waits its
// backoff on the injected clock, lists again and reports what changed
// while it was not watching, a deletion included.
func TestWatchRelistsAfterFailure(t *testing.T) {
	ctx := context.Background()
	fc := newFakeCluster(t)
	var watches atomic.Int32
	fc.PrependWatchReactor("jobsets", func(clienttesting.Action) (bool, watch.Interface, error) {
		if watches.Add(1) == 1 {
			return true, nil, apierrors.NewServiceUnavailable("etcd is down")
		}
		return false, nil, nil
	})
	clk := clock.NewFake(mustTime("2026-05-01T10:00:00Z"))
	c, logs := newTestController(t, fc, WithClock(clk))
	if err := c.Start(ctx, cpuJob()); err != nil {
		t.Fatal(err)
	}
	sink := newRecSink()
	startWatch(t, c, sink)
	sink.expectState(t, "mnist-cpu", 1, pool.Queued, "LocalQueue")
	sink.expect(t, "synced", "", 0)

	guard := time.After(hangGuard)
	for clk.Pending() == 0 {
		select {
		case <-clk.Changed():
		case <-guard:
			t.Fatal("Watch never waited to retry")
		}
	}
	if err := fc.jobsets().Delete(ctx, JobSetName("mnist-cpu", 1), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx, gpuJob()); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute)
	sink.expectState(t, "llm-pretrain", 3, pool.Queued, "LocalQueue")
	sink.expect(t, "gone", "mnist-cpu", 1)
	fc.waitWatching(t)
	if !strings.Contains(logs.String(), "etcd is down") {
		t.Errorf("watch failure not logged:\n%s", logs.String())
	}
}

func TestWatchFailsWhenFirstListFails(t *testing.T) {
	fc := newFakeCluster(t)
	fc.PrependReactor("list", "jobsets", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(JobSetResource.GroupResource(), "", errors.New("no role"))
	})
	c, _ := newTestController(t, fc)
	err := c.Watch(context.Background(), newRecSink())
	if err == nil || !strings.Contains(err.Error(), "install the JobSet CRD") || !apierrors.IsForbidden(err) {
		t.Fatalf("Watch with a failing list: %v", err)
	}
}
