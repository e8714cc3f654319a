package kube

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"

	"github.com/fleetlearn/fleetlearn/pool"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Labels Fleetlearn puts on what it renders, so the server can list its own
// objects and map a JobSet back to a pool job attempt.
const (
	LabelJob     = "fleetlearn.io/pool-job"
	LabelAttempt = "fleetlearn.io/attempt"
	LabelTenant  = "fleetlearn.io/tenant"
	// LabelQueueName selects the Kueue LocalQueue that admits a workload.
	LabelQueueName = "kueue.x-k8s.io/queue-name"
	// LabelPriorityClass names the Kueue WorkloadPriorityClass that gives
	// a workload its priority, for admission order and preemption.
	LabelPriorityClass = "kueue.x-k8s.io/priority-class"
	// GPUResource is the device plugin's resource name for NVIDIA GPUs.
	GPUResource corev1.ResourceName = "nvidia.com/gpu"
)

const (
	replicatedJobName = "rank"
	containerName     = "rank"
	checkpointVolume  = "checkpoints"
	// DefaultMasterPort is torchrun's default rendezvous port.
	DefaultMasterPort = 29500
	// DefaultCheckpointMount is where the checkpoint volume is mounted.
	DefaultCheckpointMount = "/fleetlearn/checkpoints"
	// completionIndexAnnotation is set by the Job controller on each pod
	// of an Indexed Job; it is the rank.
	completionIndexAnnotation = "batch.kubernetes.io/job-completion-index"
	// restartAttemptAnnotation is set by the JobSet controller on each pod:
	// how many times the JobSet has been restarted.
	restartAttemptAnnotation = "jobset.sigs.k8s.io/restart-attempt"
	// Rule names must match the JobSet webhook's
	// ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$.
	ruleNonRetryable = "nonRetryableExit"
	ruleRetryable    = "retryableFailure"
)

// Bounds on a command's argv and env, the same as the job service's.
const (
	maxArgs      = 256
	maxArgBytes  = 4096
	maxArgvBytes = 64 << 10
	maxEnv       = 128
	maxEnvValue  = 4096
	// maxExitCodes is the Job API's limit on onExitCodes values.
	maxExitCodes = 255
)

// reservedEnv are the variables every rank gets from Fleetlearn; a job's
// own env may not set them (or any FLEETLEARN_, TORCHELASTIC_, MASTER_ name).
var (
	reservedEnv = []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
		"GROUP_WORLD_SIZE", "PATH", "HOME", "LANG"}
	reservedPrefixes = []string{"FLEETLEARN_", "TORCHELASTIC_", "MASTER_"}
)

// Config is how pool jobs run on one cluster.
type Config struct {
	// Namespace holds the JobSets and the tenants' LocalQueues.
	Namespace string
	// Image is the container image every rank runs; the job's argv is its
	// command.
	Image string
	// CheckpointClaim is the PersistentVolumeClaim (ReadWriteMany) that
	// keeps checkpoints across restarts; each job writes under
	// <mount>/<job id>/rank-<RANK>.
	CheckpointClaim string
	// CheckpointMount is where the claim is mounted; empty is
	// DefaultCheckpointMount.
	CheckpointMount string
	// MasterPort is rank 0's rendezvous port; 0 is DefaultMasterPort.
	MasterPort int32
	// RetryableExitCodes are the non-zero exit codes after which the whole
	// gang restarts (counted against max_restarts). Any other non-zero exit
	// fails the job at once. Failures without an exit code of the job's own
	// (node loss, eviction) restart the gang as well.
	RetryableExitCodes []int32
	// ServiceAccount runs the pods; empty is the namespace's default.
	ServiceAccount string
}

func (c Config) withDefaults() Config {
	if c.CheckpointMount == "" {
		c.CheckpointMount = DefaultCheckpointMount
	}
	if c.MasterPort == 0 {
		c.MasterPort = DefaultMasterPort
	}
	return c
}

func (c Config) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("kube: config: %s: %w", fmt.Sprintf(format, a...), ErrInvalidConfig)
	}
	if errs := validation.IsDNS1123Label(c.Namespace); len(errs) > 0 {
		return bad("namespace %.64q: %s", c.Namespace, strings.Join(errs, "; "))
	}
	if c.Image == "" || len(c.Image) > 1024 || strings.ContainsAny(c.Image, " \t\r\n") {
		return bad("image %.64q: set a container image reference without spaces", c.Image)
	}
	if errs := validation.IsDNS1123Subdomain(c.CheckpointClaim); len(errs) > 0 {
		return bad("checkpoint claim %.64q: name the PersistentVolumeClaim that keeps checkpoints: %s", c.CheckpointClaim, strings.Join(errs, "; "))
	}
	if !strings.HasPrefix(c.CheckpointMount, "/") || strings.ContainsAny(c.CheckpointMount, ":$") || len(c.CheckpointMount) > 512 {
		return bad("checkpoint mount %.64q: want an absolute path without ':' or '$'", c.CheckpointMount)
	}
	if errs := validation.IsValidPortNum(int(c.MasterPort)); len(errs) > 0 {
		return bad("master port %d: %s", c.MasterPort, strings.Join(errs, "; "))
	}
	if len(c.RetryableExitCodes) >= maxExitCodes {
		return bad("%d retryable exit codes, at most %d", len(c.RetryableExitCodes), maxExitCodes-1)
	}
	for _, code := range c.RetryableExitCodes {
		if code < 1 || code > 255 {
			return bad("retryable exit code %d outside [1, 255]", code)
		}
	}
	if c.ServiceAccount != "" {
		if errs := validation.IsDNS1123Subdomain(c.ServiceAccount); len(errs) > 0 {
			return bad("service account %.64q: %s", c.ServiceAccount, strings.Join(errs, "; "))
		}
	}
	return nil
}

// Render builds the JobSet for the job's current attempt. It is suspended:
// Kueue admits it from the tenant's LocalQueue by unsuspending it. When the
// job has a committed checkpoint the ranks resume from it.
func Render(job *pb.PoolJob, cfg Config) (*jobset.JobSet, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	spec, err := specOf(job)
	if err != nil {
		return nil, err
	}
	attempt := job.GetAttempt()
	if attempt < 1 {
		return nil, fmt.Errorf("kube: render %s: attempt %d; attempts count from 1: %w", spec.ID, attempt, ErrInvalidJob)
	}
	if job.GetCommittedStep() < 0 || job.GetCommittedStep() > spec.TotalSteps {
		return nil, fmt.Errorf("kube: render %s: committed step %d outside [0, %d]: %w", spec.ID, job.GetCommittedStep(), spec.TotalSteps, ErrInvalidJob)
	}
	cmd := job.GetSpec().GetCommand()
	if cmd == nil {
		return nil, fmt.Errorf("kube: render %s: only command jobs run on kubernetes; the built-in trainer runs on fleetlearn-worker agents: %w", spec.ID, ErrUnsupportedProgram)
	}
	argv, env, err := commandOf(cmd)
	if err != nil {
		return nil, fmt.Errorf("kube: render %s: %w", spec.ID, err)
	}

	name := JobSetName(spec.ID, attempt)
	ranks := int32(spec.Ranks)
	labels := map[string]string{
		LabelJob:       spec.ID,
		LabelAttempt:   strconv.FormatUint(uint64(attempt), 10),
		LabelTenant:    spec.Tenant,
		LabelQueueName: QueueName(spec.Tenant),
	}
	if spec.Priority != 0 {
		labels[LabelPriorityClass] = PriorityClassName(int32(spec.Priority))
	}
	podLabels := map[string]string{LabelJob: spec.ID, LabelAttempt: labels[LabelAttempt]}

	res := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(spec.PerRank.MilliCPU, resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(spec.PerRank.Memory, resource.BinarySI),
	}
	if spec.PerRank.GPUs > 0 {
		res[GPUResource] = *resource.NewQuantity(spec.PerRank.GPUs, resource.DecimalSI)
	}

	// Every rank is its own pod, so torchrun's local and group ranks are
	// the trivial ones. Rank 0's stable hostname comes from the JobSet's
	// headless service (the subdomain).
	master := fmt.Sprintf("%s-%s-0-0.%s", name, replicatedJobName, name)
	ckptDir := RankCheckpointDir(cfg.CheckpointMount, spec.ID, "$(RANK)")
	vars := []corev1.EnvVar{
		{Name: "RANK", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{
			FieldPath: "metadata.annotations['" + completionIndexAnnotation + "']"}}},
		{Name: "WORLD_SIZE", Value: strconv.Itoa(spec.Ranks)},
		{Name: "LOCAL_RANK", Value: "0"},
		{Name: "LOCAL_WORLD_SIZE", Value: "1"},
		{Name: "GROUP_RANK", Value: "$(RANK)"},
		{Name: "GROUP_WORLD_SIZE", Value: strconv.Itoa(spec.Ranks)},
		{Name: "MASTER_ADDR", Value: master},
		{Name: "MASTER_PORT", Value: strconv.Itoa(int(cfg.MasterPort))},
		{Name: "TORCHELASTIC_RESTART_COUNT", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{
			FieldPath: "metadata.annotations['" + restartAttemptAnnotation + "']"}}},
		{Name: "FLEETLEARN_CHECKPOINT_DIR", Value: ckptDir},
		{Name: "FLEETLEARN_STEPS", Value: strconv.FormatInt(spec.TotalSteps, 10)},
		{Name: "FLEETLEARN_CHECKPOINT_EVERY", Value: strconv.FormatInt(spec.CheckpointInterval, 10)},
	}
	if step := job.GetCommittedStep(); step > 0 {
		vars = append(vars, corev1.EnvVar{Name: "FLEETLEARN_RESUME_FROM", Value: "$(FLEETLEARN_CHECKPOINT_DIR)/step-" + strconv.FormatInt(step, 10)})
	}
	vars = append(vars, env...)

	pod := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: podLabels},
		Spec: corev1.PodSpec{
			// The Job's pod failure policy needs Never: a failed rank fails
			// its pod and the JobSet decides about the whole gang.
			RestartPolicy:      corev1.RestartPolicyNever,
			ServiceAccountName: cfg.ServiceAccount,
			Containers: []corev1.Container{{
				Name:         containerName,
				Image:        cfg.Image,
				Command:      argv,
				Env:          vars,
				Ports:        []corev1.ContainerPort{{Name: "rendezvous", ContainerPort: cfg.MasterPort, Protocol: corev1.ProtocolTCP}},
				Resources:    corev1.ResourceRequirements{Requests: res, Limits: res.DeepCopy()},
				VolumeMounts: []corev1.VolumeMount{{Name: checkpointVolume, MountPath: cfg.CheckpointMount}},
			}},
			Volumes: []corev1.Volume{{Name: checkpointVolume, VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: cfg.CheckpointClaim}}}},
		},
	}

	js := &jobset.JobSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: jobset.GroupVersion.String(), Kind: "JobSet"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cfg.Namespace, Labels: labels},
		Spec: jobset.JobSetSpec{
			Suspend: ptr.To(true),
			Network: &jobset.Network{EnableDNSHostnames: ptr.To(true), Subdomain: name, PublishNotReadyAddresses: ptr.To(true)},
			ReplicatedJobs: []jobset.ReplicatedJob{{
				Name:     replicatedJobName,
				Replicas: 1,
				Template: batchv1.JobTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: podLabels},
					Spec: batchv1.JobSpec{
						CompletionMode: ptr.To(batchv1.IndexedCompletion),
						Parallelism:    ptr.To(ranks),
						Completions:    ptr.To(ranks),
						// One failed pod fails the Job; restarts are the
						// JobSet's, of the whole gang, never of one rank.
						BackoffLimit:     ptr.To[int32](0),
						PodFailurePolicy: podFailurePolicy(cfg.RetryableExitCodes),
						Template:         pod,
					},
				},
			}},
			// No restart happens inside a JobSet: recreated pods would get
			// this attempt's env, and so resume from the checkpoint the
			// attempt started from. A retryable failure instead fails the
			// JobSet with reason ReachedMaxRestarts (restart 0 of 0), and
			// the job service starts the next attempt from the step every
			// rank has committed since, counting it against max_restarts.
			FailurePolicy: &jobset.FailurePolicy{
				MaxRestarts:     0,
				RestartStrategy: jobset.Recreate,
				Rules: []jobset.FailurePolicyRule{
					// The pod failure policy fails the Job with reason
					// PodFailurePolicy exactly when a rank exited with a
					// code not declared retryable.
					{Name: ruleNonRetryable, Action: jobset.FailJobSet, OnJobFailureReasons: []string{batchv1.JobReasonPodFailurePolicy}},
					{Name: ruleRetryable, Action: jobset.RestartJobSet},
				},
			},
		},
	}
	return js, nil
}

// podFailurePolicy fails the Job (reason PodFailurePolicy) when the rank
// exits with a non-zero code outside retryable. Every other pod failure
// counts against a backoff limit of 0 (reason BackoffLimitExceeded).
// RankCheckpointDir is where a rank of job keeps its step-<N> checkpoints
// (package pool/stepdir) under root, the checkpoint volume's mount: the
// pods' environment and the server reading the volume both use it.
func RankCheckpointDir(root, job, rank string) string {
	return root + "/" + job + "/rank-" + rank
}

func podFailurePolicy(retryable []int32) *batchv1.PodFailurePolicy {
	// NotIn matches only failed containers; 0 is listed because the Job
	// API wants the set, sorted and unique, never empty.
	codes := append([]int32{0}, retryable...)
	slices.Sort(codes)
	codes = slices.Compact(codes)
	return &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
		Action: batchv1.PodFailurePolicyActionFailJob,
		OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{
			ContainerName: ptr.To(containerName),
			Operator:      batchv1.PodFailurePolicyOnExitCodesOpNotIn,
			Values:        codes,
		},
	}}}
}

// specOf checks the job against pool's bounds, which every size below
// relies on.
func specOf(job *pb.PoolJob) (pool.Spec, error) {
	in := job.GetSpec()
	if in == nil {
		return pool.Spec{}, fmt.Errorf("kube: render: job without a spec: %w", ErrInvalidJob)
	}
	r := in.GetPerRank()
	sp := pool.Spec{ID: in.GetId(), Tenant: in.GetTenant(), Priority: int(in.GetPriority()),
		Ranks:       int(min(in.GetRanks(), pool.MaxRanks+1)),
		PerRank:     pool.Resources{MilliCPU: r.GetMilliCpu(), Memory: r.GetMemoryBytes(), GPUs: r.GetGpus()},
		MaxRestarts: int(min(in.GetMaxRestarts(), pool.MaxRestarts+1)), CheckpointInterval: in.GetCheckpointInterval(),
		TotalSteps: in.GetTotalSteps(), OutputModel: in.GetOutputModel()}
	// The deadline is the job service's to enforce; Validate checks it
	// against submission, which this job may no longer be near.
	if err := sp.Validate(job.GetSubmitTime().AsTime()); err != nil {
		return pool.Spec{}, fmt.Errorf("kube: render: %w: %w", err, ErrInvalidJob)
	}
	return sp, nil
}

// commandOf bounds argv and env, refuses names Fleetlearn sets, and escapes
// '$' so Kubernetes does not expand $(VAR) references the user never meant.
func commandOf(cmd *pb.PoolCommand) ([]string, []corev1.EnvVar, error) {
	argv := cmd.GetArgv()
	if len(argv) == 0 || len(argv) > maxArgs {
		return nil, nil, fmt.Errorf("command: %d arguments; want 1 to %d: %w", len(argv), maxArgs, ErrInvalidJob)
	}
	total := 0
	out := make([]string, len(argv))
	for i, a := range argv {
		if len(a) > maxArgBytes {
			return nil, nil, fmt.Errorf("command: argument %d is %d bytes, at most %d: %w", i, len(a), maxArgBytes, ErrInvalidJob)
		}
		total += len(a)
		out[i] = escape(a)
	}
	if total > maxArgvBytes || argv[0] == "" {
		return nil, nil, fmt.Errorf("command: argv of %d bytes with program %.64q; want a program and at most %d bytes: %w", total, argv[0], maxArgvBytes, ErrInvalidJob)
	}
	if len(cmd.GetEnv()) > maxEnv {
		return nil, nil, fmt.Errorf("command: %d env variables, at most %d: %w", len(cmd.GetEnv()), maxEnv, ErrInvalidJob)
	}
	var env []corev1.EnvVar
	for k, v := range cmd.GetEnv() {
		if errs := validation.IsEnvVarName(k); len(errs) > 0 || len(k) > 256 {
			return nil, nil, fmt.Errorf("command: env name %.64q: want [A-Za-z_.-][A-Za-z0-9_.-]*, at most 256 bytes: %w", k, ErrInvalidJob)
		}
		if slices.Contains(reservedEnv, k) || slices.ContainsFunc(reservedPrefixes, func(p string) bool { return strings.HasPrefix(k, p) }) {
			return nil, nil, fmt.Errorf("command: env %s is set by Fleetlearn; rename it: %w", k, ErrInvalidJob)
		}
		if len(v) > maxEnvValue {
			return nil, nil, fmt.Errorf("command: env %s is %d bytes, at most %d: %w", k, len(v), maxEnvValue, ErrInvalidJob)
		}
		env = append(env, corev1.EnvVar{Name: k, Value: escape(v)})
	}
	// Map order is random; rendered objects must be stable.
	slices.SortFunc(env, func(a, b corev1.EnvVar) int { return strings.Compare(a.Name, b.Name) })
	return out, env, nil
}

// escape makes s literal in a container's command or env value, where
// Kubernetes expands $(VAR) and reads $$ as $.
func escape(s string) string { return strings.ReplaceAll(s, "$", "$$") }

// ToUnstructured converts a rendered object into the map a dynamic client
// sends. Status is left out: the API server ignores it on create, and an
// empty one would claim fields no controller has written.
func ToUnstructured(obj runtime.Object) (map[string]any, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, fmt.Errorf("kube: to unstructured: %w", err)
	}
	delete(m, "status")
	return m, nil
}
