package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/fleetlearn/fleetlearn/internal/backoff"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/pool"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Resources the controller reads and writes. The server's RBAC needs
// create, delete, get, list and watch on jobsets; create, get and update on
// the Kueue objects (deploy/kubernetes/pool-executor/rbac.yaml, checked
// against this code by the deploy tests).
var (
	JobSetResource         = jobset.GroupVersion.WithResource("jobsets")
	ResourceFlavorResource = kueue.GroupVersion.WithResource("resourceflavors")
	ClusterQueueResource   = kueue.GroupVersion.WithResource("clusterqueues")
	LocalQueueResource     = kueue.GroupVersion.WithResource("localqueues")
	// PriorityClassResource holds the WorkloadPriorityClasses of the pool
	// priorities jobs use (cluster-scoped).
	PriorityClassResource = kueue.GroupVersion.WithResource("workloadpriorityclasses")
)

var (
	// ErrForeignObject reports an object that holds the name Fleetlearn
	// needs but whose labels say it belongs to something else.
	ErrForeignObject = errors.New("object exists and is not Fleetlearn's")
	// ErrTerminating reports a JobSet of the same attempt that is still
	// being deleted.
	ErrTerminating = errors.New("JobSet is being deleted")
)

// JobSetSelector selects the JobSets Render makes: every one carries the
// job and attempt labels.
var JobSetSelector = LabelJob + "," + LabelAttempt

// fieldManager names Fleetlearn in the objects' managedFields.
const fieldManager = "fleetlearn-server"

// writeTries bounds the retries of a write that raced another writer
// (create after a delete, update after a conflicting update).
const writeTries = 3

// maxLogged bounds a string from the API server in a log line.
const maxLogged = 256

// Controller creates, deletes and watches the JobSets of pool job attempts
// and the Kueue queues of tenants in one namespace.
type Controller struct {
	dyn    dynamic.Interface
	cfg    Config
	log    *slog.Logger
	clock  clock.Clock
	resync time.Duration
}

// ControllerOption changes a Controller's defaults.
type ControllerOption func(*Controller)

// WithLogger sets where the controller reports objects it ignores and
// interrupted watches; the default is slog.Default().
func WithLogger(l *slog.Logger) ControllerOption {
	return func(c *Controller) { c.log = l }
}

// WithClock sets the clock for Watch's retry backoff and resync period;
// the default is the system clock.
func WithClock(c clock.Clock) ControllerOption {
	return func(ctl *Controller) { ctl.clock = c }
}

// WithResync makes Watch list every JobSet again each d, in case a watch
// event was lost (0, the default, never). A list reports only what
// differs from what was last reported.
func WithResync(d time.Duration) ControllerOption {
	return func(c *Controller) { c.resync = d }
}

// NewController checks cfg and returns a controller for its namespace.
func NewController(dyn dynamic.Interface, cfg Config, opts ...ControllerOption) (*Controller, error) {
	if dyn == nil {
		return nil, fmt.Errorf("kube: new controller: no dynamic client: %w", ErrInvalidConfig)
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Controller{dyn: dyn, cfg: cfg}
	for _, o := range opts {
		o(c)
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	c.clock = clock.Or(c.clock)
	// A list per second or more often would load the API server for
	// nothing a watch does not already give.
	if c.resync != 0 && c.resync < time.Second {
		return nil, fmt.Errorf("kube: new controller: resync %v: want 0 (off) or at least 1s: %w", c.resync, ErrInvalidConfig)
	}
	return c, nil
}

// Namespace is where the controller's JobSets and LocalQueues live.
func (c *Controller) Namespace() string { return c.cfg.Namespace }

func (c *Controller) jobsets() dynamic.ResourceInterface {
	return c.dyn.Resource(JobSetResource).Namespace(c.cfg.Namespace)
}

// Start creates the JobSet of the job's current attempt. It is idempotent:
// a JobSet of the same job and attempt already there is success.
func (c *Controller) Start(ctx context.Context, job *pb.PoolJob) error {
	js, err := Render(job, c.cfg)
	if err != nil {
		return fmt.Errorf("kube: start: %w", err)
	}
	id, attempt := job.GetSpec().GetId(), job.GetAttempt()
	if p := job.GetSpec().GetPriority(); p != 0 {
		// Kueue refuses a workload naming a class that does not exist.
		pc, err := ToUnstructured(PriorityClass(p))
		if err != nil {
			return fmt.Errorf("kube: start %s attempt %d: %w", id, attempt, err)
		}
		if err := c.ensure(ctx, PriorityClassResource, "", &unstructured.Unstructured{Object: pc}, ""); err != nil {
			return fmt.Errorf("kube: start %s attempt %d: priority %d: %w", id, attempt, p, err)
		}
	}
	obj, err := ToUnstructured(js)
	if err != nil {
		return fmt.Errorf("kube: start %s attempt %d: %w", id, attempt, err)
	}
	res := c.jobsets()
	for range writeTries {
		_, err := res.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{FieldManager: fieldManager})
		if err == nil {
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("kube: start %s attempt %d: create JobSet %s/%s: %w", id, attempt, c.cfg.Namespace, js.Name, err)
		}
		got, err := res.Get(ctx, js.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue // deleted since the create; create again
		}
		if err != nil {
			return fmt.Errorf("kube: start %s attempt %d: read existing JobSet %s/%s: %w", id, attempt, c.cfg.Namespace, js.Name, err)
		}
		if err := ownsJobSet(got, id, attempt); err != nil {
			return fmt.Errorf("kube: start %s attempt %d: %w", id, attempt, err)
		}
		if got.GetDeletionTimestamp() != nil {
			return fmt.Errorf("kube: start %s attempt %d: JobSet %s/%s: %w; start it again once it is gone", id, attempt, c.cfg.Namespace, js.Name, ErrTerminating)
		}
		return nil
	}
	return fmt.Errorf("kube: start %s attempt %d: JobSet %s/%s was deleted %d times while being created; is another server stopping it?", id, attempt, c.cfg.Namespace, js.Name, writeTries)
}

// Stop deletes the JobSet of one attempt and, in the background, its Jobs
// and pods. A JobSet that is not there is success; one with the attempt's
// name that is not the attempt's is left alone.
func (c *Controller) Stop(ctx context.Context, jobID string, attempt uint32) error {
	if errs := validation.IsValidLabelValue(jobID); jobID == "" || len(errs) > 0 {
		return fmt.Errorf("kube: stop %.64q: not a pool job id: %w", jobID, ErrInvalidJob)
	}
	if attempt < 1 {
		return fmt.Errorf("kube: stop %s: attempt 0; attempts count from 1: %w", jobID, ErrInvalidJob)
	}
	name := JobSetName(jobID, attempt)
	res := c.jobsets()
	for range writeTries {
		got, err := res.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("kube: stop %s attempt %d: read JobSet %s/%s: %w", jobID, attempt, c.cfg.Namespace, name, err)
		}
		if err := ownsJobSet(got, jobID, attempt); err != nil {
			return fmt.Errorf("kube: stop %s attempt %d: %w", jobID, attempt, err)
		}
		background := metav1.DeletePropagationBackground
		opts := metav1.DeleteOptions{PropagationPolicy: &background}
		// The UID precondition keeps a JobSet recreated since the read,
		// possibly someone else's, from being deleted unchecked.
		if uid := got.GetUID(); uid != "" {
			opts.Preconditions = &metav1.Preconditions{UID: &uid}
		}
		err = res.Delete(ctx, name, opts)
		switch {
		case err == nil, apierrors.IsNotFound(err):
			return nil
		case apierrors.IsConflict(err):
			continue
		}
		return fmt.Errorf("kube: stop %s attempt %d: delete JobSet %s/%s: %w", jobID, attempt, c.cfg.Namespace, name, err)
	}
	return fmt.Errorf("kube: stop %s attempt %d: JobSet %s/%s was replaced %d times while being deleted; is another server starting it?", jobID, attempt, c.cfg.Namespace, name, writeTries)
}

// ownsJobSet checks that u carries the labels Render gives the attempt.
func ownsJobSet(u *unstructured.Unstructured, jobID string, attempt uint32) error {
	l := u.GetLabels()
	if l[LabelJob] == jobID && l[LabelAttempt] == strconv.FormatUint(uint64(attempt), 10) {
		return nil
	}
	return fmt.Errorf("JobSet %s/%s has labels %s=%.64q, %s=%.16q, not this job's attempt; delete it or move it out of the namespace: %w",
		u.GetNamespace(), u.GetName(), LabelJob, l[LabelJob], LabelAttempt, l[LabelAttempt], ErrForeignObject)
}

// EnsureQueues creates or updates the flavors and every tenant's
// ClusterQueue and LocalQueue, so they match what Flavors and TenantQueues
// render. Every object is rendered before any is written: bad settings
// write nothing. Tenants no longer listed keep their queues.
func (c *Controller) EnsureQueues(ctx context.Context, tenants map[string]pool.Tenant, qc QueueConfig) error {
	if qc.Namespace == "" {
		qc.Namespace = c.cfg.Namespace
	}
	if qc.Namespace != c.cfg.Namespace {
		return fmt.Errorf("kube: ensure queues: queue namespace %.64q is not the JobSets' namespace %q; their ClusterQueues would never admit them: %w",
			qc.Namespace, c.cfg.Namespace, ErrInvalidConfig)
	}
	if len(tenants) == 0 {
		return fmt.Errorf("kube: ensure queues: no tenants; configure at least one: %w", ErrInvalidConfig)
	}
	type want struct {
		res    schema.GroupVersionResource
		ns     string
		obj    runtime.Object
		tenant string // the owning tenant; empty for flavors, which tenants share
	}
	flavors, err := Flavors(qc)
	if err != nil {
		return fmt.Errorf("kube: ensure queues: %w", err)
	}
	var all []want
	for _, f := range flavors {
		all = append(all, want{res: ResourceFlavorResource, obj: f})
	}
	for _, name := range slices.Sorted(maps.Keys(tenants)) {
		cq, lq, err := TenantQueues(name, tenants[name], qc)
		if err != nil {
			return fmt.Errorf("kube: ensure queues: %w", err)
		}
		all = append(all, want{res: ClusterQueueResource, obj: cq, tenant: name},
			want{res: LocalQueueResource, ns: qc.Namespace, obj: lq, tenant: name})
	}
	for _, w := range all {
		m, err := ToUnstructured(w.obj)
		if err != nil {
			return fmt.Errorf("kube: ensure queues: %w", err)
		}
		if err := c.ensure(ctx, w.res, w.ns, &unstructured.Unstructured{Object: m}, w.tenant); err != nil {
			return fmt.Errorf("kube: ensure queues: %w", err)
		}
	}
	return nil
}

// ensure creates want, or makes the existing object's spec want's and adds
// want's labels. It updates only when something differs, so a repeated
// call writes nothing. Against an API server whose webhooks default spec
// fields the update repeats, and the server finds it a no-op.
func (c *Controller) ensure(ctx context.Context, gvr schema.GroupVersionResource, ns string, want *unstructured.Unstructured, tenant string) error {
	var res dynamic.ResourceInterface = c.dyn.Resource(gvr)
	if ns != "" {
		res = c.dyn.Resource(gvr).Namespace(ns)
	}
	kind, name := want.GetKind(), want.GetName()
	for range writeTries {
		got, err := res.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = res.Create(ctx, want, metav1.CreateOptions{FieldManager: fieldManager})
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			if err != nil {
				return fmt.Errorf("create %s %s: %w", kind, name, err)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s %s: %w", kind, name, err)
		}
		if tenant != "" {
			if owner, ok := got.GetLabels()[LabelTenant]; !ok || owner != tenant {
				return fmt.Errorf("%s %s exists with label %s=%.64q, not tenant %s's; delete it or give the tenant another name: %w",
					kind, name, LabelTenant, owner, tenant, ErrForeignObject)
			}
		}
		next := got.DeepCopy()
		if len(want.GetLabels()) > 0 {
			labels := next.GetLabels()
			if labels == nil {
				labels = map[string]string{}
			}
			maps.Copy(labels, want.GetLabels())
			next.SetLabels(labels)
		}
		if spec, ok := want.Object["spec"]; ok {
			next.Object["spec"] = spec
		} else {
			delete(next.Object, "spec")
		}
		if reflect.DeepEqual(got.Object, next.Object) {
			return nil
		}
		_, err = res.Update(ctx, next, metav1.UpdateOptions{FieldManager: fieldManager})
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("update %s %s: %w", kind, name, err)
		}
		return nil
	}
	return fmt.Errorf("write %s %s: changed by someone else %d times in a row; is another server managing it?", kind, name, writeTries)
}

// Sink receives what Watch sees. Calls come one at a time, from the
// goroutine running Watch, and must not block for long: the next JobSet
// event waits.
type Sink interface {
	// JobSetState reports the attempt's JobSet when it is first seen and
	// whenever its mapped status changes.
	JobSetState(jobID string, attempt uint32, st Status)
	// JobSetGone reports that the attempt's JobSet was deleted.
	JobSetGone(jobID string, attempt uint32)
}

// SyncSink is a Sink that also learns when the JobSets that existed when
// Watch started have all been reported. A job the service thinks is on
// the cluster and that was not reported by then has lost its JobSet.
type SyncSink interface {
	Sink
	JobSetsSynced()
}

// Watch reports the namespace's JobSets to sink until ctx ends, then
// returns nil. It starts with a list, so JobSets made before the server
// started are reported too, then follows a watch from that list's
// resource version. When the watch breaks it lists again, reporting what
// changed meanwhile, including JobSets deleted while it was not watching.
// It returns an error only when the first list fails (no JobSet CRD, no
// permission); later failures are logged and retried with backoff.
// Objects that are not a pool job attempt's JobSet, or whose status does
// not parse, are logged and skipped.
func (c *Controller) Watch(ctx context.Context, sink Sink) error {
	if sink == nil {
		return errors.New("kube: watch: nil sink")
	}
	w := &watcher{c: c, sink: sink, res: c.jobsets(), seen: map[string]seenJobSet{}}
	synced := false
	bo := backoff.New(minBackoff, maxBackoff, nil)
	for {
		rv, err := w.relist(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			if !synced {
				return fmt.Errorf("kube: watch JobSets in %s: %w; install the JobSet CRD and let the server list and watch jobsets there", c.cfg.Namespace, err)
			}
			wait := bo.Next()
			c.log.Warn("kube: listing JobSets failed; retrying", "namespace", c.cfg.Namespace, "retry_in", wait, "err", clip(err.Error()))
			if !clock.Sleep(c.clock, wait, ctx.Done()) {
				return nil
			}
			continue
		}
		if !synced {
			synced = true
			if s, ok := sink.(SyncSink); ok {
				s.JobSetsSynced()
			}
		}
		healthy, err := w.follow(ctx, rv)
		if ctx.Err() != nil {
			return nil
		}
		if healthy {
			bo.Reset()
		}
		switch {
		case errors.Is(err, errRelist):
			// Expired resource version or resync: list again at once.
		case err != nil:
			wait := bo.Next()
			c.log.Warn("kube: JobSet watch failed; listing again", "namespace", c.cfg.Namespace, "retry_in", wait, "err", clip(err.Error()))
			if !clock.Sleep(c.clock, wait, ctx.Done()) {
				return nil
			}
		}
	}
}

// Watch tuning. A watch the server ends sooner than minWatch without an
// event counts as a failure, so a server that keeps closing watches is not
// hammered.
const (
	listPage   = 500
	maxJobSets = 1 << 16
	minBackoff = 500 * time.Millisecond
	maxBackoff = 30 * time.Second
	minWatch   = time.Second
)

// errRelist asks Watch to list again without waiting.
var errRelist = errors.New("list again")

// watcher turns list and watch results into deduplicated sink calls. Only
// Watch's goroutine uses it.
type watcher struct {
	c    *Controller
	sink Sink
	res  dynamic.ResourceInterface
	seen map[string]seenJobSet // by JobSet name
}

type seenJobSet struct {
	jobID    string
	attempt  uint32
	st       Status
	reported bool
}

// relist reads every JobSet of ours, reports what changed since the last
// look (JobSets not listed are gone) and returns the list's resource
// version to watch from.
func (w *watcher) relist(ctx context.Context) (string, error) {
	opts := metav1.ListOptions{LabelSelector: JobSetSelector, Limit: listPage}
	var items []unstructured.Unstructured
	for {
		l, err := w.res.List(ctx, opts)
		if err != nil {
			return "", fmt.Errorf("list: %w", err)
		}
		items = append(items, l.Items...)
		if len(items) > maxJobSets {
			return "", fmt.Errorf("list: more than %d JobSets match %s; delete finished ones", maxJobSets, JobSetSelector)
		}
		if l.GetContinue() == "" {
			opts.ResourceVersion = l.GetResourceVersion()
			break
		}
		opts.Continue = l.GetContinue()
	}
	listed := make(map[string]bool, len(items))
	for i := range items {
		listed[items[i].GetName()] = true
		w.update(&items[i])
	}
	for _, name := range slices.Sorted(maps.Keys(w.seen)) {
		if !listed[name] {
			e := w.seen[name]
			delete(w.seen, name)
			w.sink.JobSetGone(e.jobID, e.attempt)
		}
	}
	return opts.ResourceVersion, nil
}

// follow watches from rv until the watch fails, the resync period passes
// or ctx ends. healthy says a watch worked (delivered an event or lasted),
// which resets the backoff.
func (w *watcher) follow(ctx context.Context, rv string) (healthy bool, err error) {
	var resync <-chan time.Time
	if w.c.resync > 0 {
		t := w.c.clock.NewTimer(w.c.resync)
		defer t.Stop()
		resync = t.C()
	}
	for {
		start := w.c.clock.Now()
		wi, err := w.res.Watch(ctx, metav1.ListOptions{LabelSelector: JobSetSelector, ResourceVersion: rv, AllowWatchBookmarks: true})
		if err != nil {
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				return healthy, errRelist
			}
			return healthy, fmt.Errorf("watch: %w", err)
		}
		events := 0
		err = func() error {
			defer wi.Stop()
			for {
				select {
				case <-ctx.Done():
					return nil
				case <-resync:
					return errRelist
				case ev, ok := <-wi.ResultChan():
					if !ok {
						return nil
					}
					if ev.Type == watch.Error {
						err := apierrors.FromObject(ev.Object)
						if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
							return errRelist
						}
						return fmt.Errorf("watch: %w", err)
					}
					events++
					u, ok := ev.Object.(*unstructured.Unstructured)
					if !ok {
						w.c.log.Warn("kube: ignoring JobSet event", "reason", fmt.Sprintf("%s event with a %T", ev.Type, ev.Object))
						continue
					}
					if v := u.GetResourceVersion(); v != "" {
						rv = v
					}
					switch ev.Type {
					case watch.Added, watch.Modified:
						w.update(u)
					case watch.Deleted:
						w.gone(u)
					}
				}
			}
		}()
		if events > 0 || w.c.clock.Now().Sub(start) >= minWatch {
			healthy = true
		}
		if err != nil || ctx.Err() != nil {
			return healthy, err
		}
		if events == 0 && w.c.clock.Now().Sub(start) < minWatch {
			return healthy, fmt.Errorf("watch: ended after %v without an event", w.c.clock.Now().Sub(start))
		}
		// The server ends watches now and then; carry on from rv.
	}
}

func (w *watcher) update(u *unstructured.Unstructured) {
	jobID, attempt, err := w.identify(u)
	if err != nil {
		w.ignore(u, err)
		return
	}
	e, had := w.seen[u.GetName()]
	if !had {
		e = seenJobSet{jobID: jobID, attempt: attempt}
		w.seen[u.GetName()] = e
	}
	st, err := StateOfUnstructured(u)
	if err != nil {
		w.ignore(u, err)
		return
	}
	if e.reported && e.st == st {
		return
	}
	e.st, e.reported = st, true
	w.seen[u.GetName()] = e
	w.sink.JobSetState(jobID, attempt, st)
}

func (w *watcher) gone(u *unstructured.Unstructured) {
	// What was seen decides, not the final labels: a JobSet relabelled out
	// of the selector leaves the watch with labels that no longer name the
	// attempt.
	e, had := w.seen[u.GetName()]
	if !had {
		jobID, attempt, err := w.identify(u)
		if err != nil {
			w.ignore(u, err)
			return
		}
		e = seenJobSet{jobID: jobID, attempt: attempt}
	}
	delete(w.seen, u.GetName())
	w.sink.JobSetGone(e.jobID, e.attempt)
}

// identify maps a JobSet to its attempt, if it is one Render made: in the
// namespace, with both labels, and named for them.
func (w *watcher) identify(u *unstructured.Unstructured) (string, uint32, error) {
	if u.GetNamespace() != w.c.cfg.Namespace {
		return "", 0, fmt.Errorf("in namespace %.64q, not %s", u.GetNamespace(), w.c.cfg.Namespace)
	}
	l := u.GetLabels()
	jobID, ok := l[LabelJob]
	if !ok || jobID == "" {
		return "", 0, fmt.Errorf("no %s label", LabelJob)
	}
	a, ok := l[LabelAttempt]
	if !ok {
		return "", 0, fmt.Errorf("no %s label", LabelAttempt)
	}
	attempt, err := strconv.ParseUint(a, 10, 32)
	if err != nil || attempt < 1 {
		return "", 0, fmt.Errorf("%s label %.16q is not an attempt number", LabelAttempt, a)
	}
	if want := JobSetName(jobID, uint32(attempt)); u.GetName() != want {
		return "", 0, fmt.Errorf("labels name job %.64q attempt %d, whose JobSet is %s", jobID, attempt, want)
	}
	return jobID, uint32(attempt), nil
}

func (w *watcher) ignore(u *unstructured.Unstructured, reason error) {
	w.c.log.Warn("kube: ignoring JobSet", "namespace", clip(u.GetNamespace()), "name", clip(u.GetName()), "reason", clip(reason.Error()))
}

func clip(s string) string {
	if len(s) > maxLogged {
		return strings.ToValidUTF8(s[:maxLogged], "") + "…"
	}
	return s
}
