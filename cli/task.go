package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/internal/ident"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/round"
)

func newTaskCommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "task",
		Short: "Create, inspect, stop and watch federated training tasks",
	}
	cmd.AddCommand(
		newTaskCreateCommand(a),
		newTaskListCommand(a),
		newTaskGetCommand(a),
		newTaskStopCommand(a),
		newTaskResumeCommand(a),
		newTaskRoundsCommand(a),
		newTaskWatchCommand(a),
	)
	return cmd
}

// rules maps --rule values to aggregation rules.
// parseEncoding reads an --update-encoding value: round's names, the
// wire's enum.
func parseEncoding(s string) (pb.UpdateEncoding, bool) {
	bits, ok := round.ParseEncoding(s)
	if !ok {
		return 0, false
	}
	return wire.EncodingOfBits(bits)
}

// encodingFlag is --update-encoding as a pflag.Value.
type encodingFlag struct{ e *pb.UpdateEncoding }

func (f encodingFlag) String() string {
	if f.e == nil {
		return round.EncodingName(0)
	}
	if bits, ok := wire.EncodingBits(*f.e); ok {
		return round.EncodingName(bits)
	}
	return f.e.String()
}

func (f encodingFlag) Set(s string) error {
	e, ok := parseEncoding(s)
	if !ok {
		return fmt.Errorf("%q: want one of %s", s, strings.Join(round.EncodingNames(), ", "))
	}
	*f.e = e
	return nil
}

func (encodingFlag) Type() string { return "encoding" }

var rules = map[string]pb.AggregationRule{
	"fedavg":       pb.AggregationRule_AGGREGATION_RULE_FEDAVG,
	"fedavgm":      pb.AggregationRule_AGGREGATION_RULE_FEDAVGM,
	"fedadam":      pb.AggregationRule_AGGREGATION_RULE_FEDADAM,
	"fedyogi":      pb.AggregationRule_AGGREGATION_RULE_FEDYOGI,
	"fedadagrad":   pb.AggregationRule_AGGREGATION_RULE_FEDADAGRAD,
	"median":       pb.AggregationRule_AGGREGATION_RULE_MEDIAN,
	"trimmed-mean": pb.AggregationRule_AGGREGATION_RULE_TRIMMED_MEAN,
}

func ruleNames() string {
	names := make([]string, 0, len(rules))
	for n := range rules {
		names = append(names, n)
	}
	slices.SortFunc(names, func(x, y string) int { return int(rules[x]) - int(rules[y]) })
	return strings.Join(names, "|")
}

// maxHyperBytes matches the API's limit on task hyperparameters.
const maxHyperBytes = 1 << 20

type createFlags struct {
	name, model, module      string
	hyper, hyperFile         string
	cohort, reportGoal       uint32
	rounds, evalEvery        uint32
	overSelection            float64
	selectionTimeout         time.Duration
	reportTimeout            time.Duration
	rule                     string
	encoding                 string
	trainable                []string
	serverLR, momentum, trim float64
	maxUpdateNorm            float64
	// --mode async: FedBuff's concurrency, buffer and staleness bound.
	mode                    string
	concurrency, buffer     uint32
	maxStaleness            uint32
	unboundedUpdates        bool
	maxExamples             uint64
	minExamples             uint64
	charging, idle, metered bool
	serverEvalDataset       string
	memoryPages             uint32
	callTimeout             time.Duration
	maxFlops                float64
	format                  string
	privacy                 privacyFlags
}

func newTaskCreateCommand(a *app) *cobra.Command {
	var f createFlags
	cmd := &cobra.Command{
		Use:   "create --name NAME --model MODEL --module SHA256 [flags]",
		Short: "Create a federated training task",
		Long: "create starts a task from MODEL: NAME (its newest version), NAME@N (its N-th,\n" +
			"as fleetlearn model list numbers them), a version's sha256, or 12 or more of its\n" +
			"leading digits. The models the task commits are stored under the task's name.",
		Example: `  fleetlearn task create --name mnist-ft --model mnist@1 --module 3f2a... \
    --hyper '{"learning_rate":0.05,"batch_size":32,"epochs":1}' --cohort 20 --rounds 50
  # secure aggregation and central DP, epsilon 8 at delta 1e-5 over 50 rounds; the noise
  # is planned by: fleetlearn dp noise --target-epsilon 8 --q 1 --steps 50 --delta 1e-5
  fleetlearn task create --name mnist-private --model mnist --module 3f2a... --cohort 1000 --rounds 50 \
    --secure-aggregation --dp central --dp-noise-multiplier 4.6 --dp-epsilon-budget 8`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(f.format); err != nil {
				return err
			}
			t, err := f.task(cmd)
			if err != nil {
				return err
			}
			budget := f.privacy.budgetWarning(t.GetRoundsTotal())
			return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
				version, err := resolveModel(ctx, apiv1.NewModelServiceClient(conn), f.model)
				if err != nil {
					return fmt.Errorf("--model: %w", err)
				}
				t.Model = &pb.ModelRef{Version: version}
				res, err := apiv1.NewTaskServiceClient(conn).CreateTask(ctx, &pb.CreateTaskRequest{Task: t})
				if err != nil {
					return unknownModule(ctx, apiv1.NewModuleServiceClient(conn), t.GetModule().GetSha256(), err)
				}
				// Warnings go to standard error, so that -o json stays one document.
				warnings := res.GetWarnings()
				if budget != "" {
					warnings = append(warnings, budget)
				}
				for _, w := range warnings {
					fmt.Fprintln(cmd.ErrOrStderr(), "warning: "+printable(w))
				}
				return printTask(cmd.OutOrStdout(), f.format, res.GetTask(), taskProgress{})
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.name, "name", "", "task name (required)")
	fl.StringVar(&f.model, "model", "", "model the first round starts from: NAME, NAME@N or a sha256 (prefix) (required)")
	fl.StringVar(&f.module, "module", "", "SHA-256 of the registered WASM module (required)")
	fl.StringVar(&f.hyper, "hyper", "", "module hyperparameters as a JSON object")
	fl.StringVar(&f.hyperFile, "hyper-file", "", "file holding the hyperparameters JSON object")
	fl.StringVar(&f.mode, "mode", "sync", "sync: rounds that each wait for their cohort; async: devices train continuously and every --buffer reports commit a version (FedBuff)")
	fl.Uint32Var(&f.concurrency, "concurrency", 100, "with --mode async, the most devices training at once")
	fl.Uint32Var(&f.buffer, "buffer", 10, "with --mode async, the reports each server step takes (K)")
	fl.Uint32Var(&f.maxStaleness, "max-staleness", 20, "with --mode async, refuse reports trained more than this many versions before the current one")
	fl.Uint32Var(&f.cohort, "cohort", 10, "reports each round aims for")
	fl.Float64Var(&f.overSelection, "over-selection", 1.3, "devices selected per cohort slot, to absorb dropouts (1.3 selects 30% more)")
	fl.Uint32Var(&f.reportGoal, "report-goal", 0, "minimum reports for a round to commit; 0 means 80% of --cohort (8 of 10)")
	fl.Uint32Var(&f.rounds, "rounds", 20, "training rounds to run")
	fl.DurationVar(&f.selectionTimeout, "selection-timeout", 30*time.Second, "how long a round may take to select its cohort")
	fl.DurationVar(&f.reportTimeout, "report-timeout", 2*time.Minute, "how long selected devices have to report")
	fl.StringVar(&f.rule, "rule", "fedavg", "aggregation rule: "+ruleNames())
	fl.Float64Var(&f.serverLR, "server-lr", 1, "server learning rate applied to the aggregate")
	fl.Float64Var(&f.momentum, "momentum", 0.9, "server momentum (fedavgm only)")
	fl.Float64Var(&f.trim, "trim", 0.1, "fraction trimmed at each end (trimmed-mean only), in [0, 0.5)")
	fl.Float64Var(&f.maxUpdateNorm, "max-update-norm", 0,
		"L2 norm bound on each update: devices clip to it, the server refuses larger ones; 0 means the default, the base model's norm (at least 1)")
	fl.BoolVar(&f.unboundedUpdates, "unbounded-updates", false,
		"run without an update norm bound (recorded in the audit log): any enrolled device can then move the model arbitrarily far")
	fl.Uint64Var(&f.maxExamples, "max-examples-per-report", 0,
		"most examples one report weighs as in the average, so no device dominates a round; 0 means the default, 10000")
	fl.Uint64Var(&f.minExamples, "min-examples", 0, "only devices with at least this many local examples")
	fl.BoolVar(&f.charging, "require-charging", false, "only devices that are charging")
	fl.BoolVar(&f.idle, "require-idle", false, "only idle devices")
	fl.BoolVar(&f.metered, "require-unmetered", false, "only devices on an unmetered network")
	fl.Uint32Var(&f.evalEvery, "eval-every", 0, "run an evaluation round after every N training rounds; 0 never")
	fl.StringVar(&f.serverEvalDataset, "server-eval-dataset", "", "dataset directory on the server to evaluate each committed model on")
	fl.StringVar(&f.encoding, "update-encoding", "none",
		"how devices send updates: none (float32), int8 (3.9x fewer bytes; with secure aggregation an 8-bit ring) or int4 (7.8x, plaintext only), quantized with error feedback")
	fl.StringSliceVar(&f.trainable, "trainable", nil,
		"train only these tensors (names, path.Match patterns such as 'blocks.3.*', or lora for the LoRA adapters); the rest stay frozen and only these travel; needs an ABI 2 module")
	fl.Uint32Var(&f.memoryPages, "memory-pages", 0, "WASM memory limit per call in 64 KiB pages; 0 uses the agent default")
	fl.DurationVar(&f.callTimeout, "call-timeout", 0, "time limit per WASM call on devices; 0 uses the agent default")
	fl.Float64Var(&f.maxFlops, "max-flops", 0, "kernel work limit per WASM call on devices, such as 2e13 for a CNN on large local datasets; 0 uses the agent default (2e12)")
	f.privacy.register(cmd)
	addFormatFlag(cmd, &f.format)
	for _, n := range []string{"name", "model", "module"} {
		cmd.MarkFlagRequired(n)
	}
	cmd.MarkFlagsMutuallyExclusive("hyper", "hyper-file")
	return cmd
}

// task builds the task from the flags, refusing values the server would
// refuse anyway, with messages in terms of flags.
func (f *createFlags) task(cmd *cobra.Command) (*pb.Task, error) {
	changed := cmd.Flags().Changed
	usage := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrUsage}, args...)...)
	}
	if err := checkModelName("--name", f.name); err != nil {
		return nil, err
	}
	module := strings.ToLower(strings.TrimSpace(f.module))
	if !ident.IsSHA256(module) {
		return nil, usage("--module %q is not a SHA-256 (64 hexadecimal characters): fleetlearn module list shows each registered module's", f.module)
	}
	hyper, err := f.hyperparameters()
	if err != nil {
		return nil, err
	}
	rule, ok := rules[f.rule]
	if !ok {
		return nil, usage("--rule %q (want %s)", f.rule, ruleNames())
	}
	encoding, ok := parseEncoding(f.encoding)
	if !ok {
		return nil, usage("--update-encoding %q (want one of %s)", f.encoding, strings.Join(round.EncodingNames(), ", "))
	}
	for name, v := range map[string]float64{"over-selection": f.overSelection, "server-lr": f.serverLR,
		"momentum": f.momentum, "trim": f.trim, "max-update-norm": f.maxUpdateNorm} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, usage("--%s must be finite", name)
		}
	}
	goal := f.reportGoal
	if goal == 0 {
		goal = uint32((uint64(f.cohort)*4 + 4) / 5) // 80%, rounded up
	}
	var async *pb.AsyncConfig
	switch f.mode {
	case "sync":
		for _, n := range []string{"concurrency", "buffer", "max-staleness"} {
			if changed(n) {
				return nil, usage("--%s applies to --mode async", n)
			}
		}
	case "async":
		for _, n := range []string{"cohort", "report-goal", "over-selection", "eval-every", "selection-timeout"} {
			if changed(n) {
				return nil, usage("--%s applies to rounds (--mode sync); an async task's steps take --buffer reports each", n)
			}
		}
		async = &pb.AsyncConfig{Concurrency: f.concurrency, Buffer: f.buffer, MaxStaleness: f.maxStaleness}
		cfg := round.AsyncConfig{Concurrency: int(f.concurrency), Buffer: int(f.buffer), MaxStaleness: uint64(f.maxStaleness)}
		if err := cfg.Validate(); err != nil {
			return nil, usage("--concurrency, --buffer, --max-staleness: %v", err)
		}
		f.cohort, goal, f.overSelection = f.buffer, f.buffer, 1
	default:
		return nil, usage("--mode %q (want sync or async)", f.mode)
	}
	switch {
	case f.cohort == 0:
		return nil, usage("--cohort must be at least 1")
	case goal > f.cohort:
		return nil, usage("--report-goal %d must be between 1 and --cohort %d", goal, f.cohort)
	case f.rounds == 0:
		return nil, usage("--rounds must be at least 1")
	case f.overSelection < 1:
		return nil, usage("--over-selection %g must be at least 1", f.overSelection)
	case f.selectionTimeout <= 0 || f.reportTimeout <= 0:
		return nil, usage("--selection-timeout and --report-timeout must be positive")
	case f.callTimeout < 0:
		return nil, usage("--call-timeout must not be negative")
	case !(f.maxFlops >= 0 && f.maxFlops < math.MaxInt64):
		return nil, usage("--max-flops %g must be a count of flops from 0 (the agent default) to 9.2e18", f.maxFlops)
	case f.serverLR <= 0:
		return nil, usage("--server-lr must be positive")
	case f.maxUpdateNorm < 0:
		return nil, usage("--max-update-norm must not be negative")
	case f.unboundedUpdates && f.maxUpdateNorm > 0:
		return nil, usage("--unbounded-updates and --max-update-norm contradict each other; give one")
	case changed("momentum") && rule != pb.AggregationRule_AGGREGATION_RULE_FEDAVGM:
		return nil, usage("--momentum applies only to --rule fedavgm")
	case changed("trim") && rule != pb.AggregationRule_AGGREGATION_RULE_TRIMMED_MEAN:
		return nil, usage("--trim applies only to --rule trimmed-mean")
	case f.momentum < 0 || f.momentum >= 1:
		return nil, usage("--momentum %g must be in [0, 1)", f.momentum)
	case f.trim < 0 || f.trim >= 0.5:
		return nil, usage("--trim %g must be in [0, 0.5)", f.trim)
	}

	agg := &pb.AggregationConfig{Rule: rule, ServerLearningRate: f.serverLR, MaxUpdateNorm: f.maxUpdateNorm,
		UnboundedUpdates: f.unboundedUpdates, MaxExamplesPerReport: f.maxExamples}
	switch rule {
	case pb.AggregationRule_AGGREGATION_RULE_FEDAVGM:
		agg.Momentum = f.momentum
	case pb.AggregationRule_AGGREGATION_RULE_TRIMMED_MEAN:
		agg.TrimFraction = f.trim
	}
	t := &pb.Task{
		Name:            f.name,
		Module:          &pb.ModuleRef{Sha256: module},
		Hyperparameters: hyper,
		CohortTarget:    f.cohort,
		// The API counts the extra fraction; rounding drops the float noise of
		// the subtraction (1.3 - 1 = 0.30000000000000004).
		OverSelection:     math.Round((f.overSelection-1)*1e9) / 1e9,
		ReportGoal:        goal,
		SelectionTimeout:  durationpb.New(f.selectionTimeout),
		ReportTimeout:     durationpb.New(f.reportTimeout),
		Aggregation:       agg,
		RoundsTotal:       f.rounds,
		EvalEvery:         f.evalEvery,
		ServerEvalDataset: f.serverEvalDataset,
		UpdateEncoding:    encoding,
		Trainable:         f.trainable,
		Async:             async,
	}
	if f.minExamples > 0 || f.charging || f.idle || f.metered {
		t.Eligibility = &pb.Eligibility{MinExamples: f.minExamples, RequireCharging: f.charging,
			RequireIdle: f.idle, RequireUnmetered: f.metered}
	}
	if f.memoryPages > 0 || f.callTimeout > 0 || f.maxFlops > 0 {
		t.Limits = &pb.Limits{MemoryPages: f.memoryPages, MaxFlops: uint64(f.maxFlops)}
		if f.callTimeout > 0 {
			t.Limits.Timeout = durationpb.New(f.callTimeout)
		}
	}
	if err := f.privacy.apply(cmd, t); err != nil {
		return nil, err
	}
	return t, nil
}

// ErrUnknownModule reports a --module that names no registered module.
var ErrUnknownModule = errors.New("unknown module")

// unknownModule turns the API's refusal of a task whose module is not
// registered into what to do about it; other errors pass unchanged. The
// API names the module in the refusal; whether it exists is asked anew,
// so that no message text is relied on.
func unknownModule(ctx context.Context, c apiv1.ModuleServiceClient, sha string, err error) error {
	if status.Code(err) != codes.InvalidArgument && status.Code(err) != codes.NotFound {
		return err
	}
	if _, gerr := c.GetModule(ctx, &pb.GetModuleRequest{Sha256: sha}); status.Code(gerr) != codes.NotFound {
		return err
	}
	return &sentence{is: ErrUnknownModule, msg: fmt.Sprintf("--module: no module %s is registered; "+
		"fleetlearn module list shows the modules, fleetlearn module register adds one", sha)}
}

// hyperparameters returns --hyper or the --hyper-file contents, compacted,
// after checking that they are a JSON object.
func (f *createFlags) hyperparameters() ([]byte, error) {
	raw, src := []byte(f.hyper), "--hyper"
	if f.hyperFile != "" {
		file, err := os.Open(f.hyperFile)
		if err != nil {
			return nil, err
		}
		defer file.Close()
		raw, err = io.ReadAll(io.LimitReader(file, maxHyperBytes+1))
		if err != nil {
			return nil, err
		}
		src = f.hyperFile
	}
	if len(raw) == 0 {
		return nil, nil
	}
	if len(raw) > maxHyperBytes {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrInput, src, maxHyperBytes)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return nil, fmt.Errorf("%w: %s is not a JSON object", ErrInput, src)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInput, src, err)
	}
	return buf.Bytes(), nil
}

// taskStates maps --state values to task states.
var taskStates = map[string]pb.TaskState{
	"pending": pb.TaskState_TASK_STATE_PENDING, "running": pb.TaskState_TASK_STATE_RUNNING,
	"completed": pb.TaskState_TASK_STATE_COMPLETED, "stopped": pb.TaskState_TASK_STATE_STOPPED,
	"failed": pb.TaskState_TASK_STATE_FAILED, "paused": pb.TaskState_TASK_STATE_PAUSED,
}

// taskStateNames lists the --state values for help and errors.
const taskStateNames = "pending|running|paused|completed|stopped|failed"

func newTaskListCommand(a *app) *cobra.Command {
	var format, state string
	cmd := &cobra.Command{
		Use:     "list",
		Short:   "List tasks, newest first",
		Example: "  fleetlearn task list\n  fleetlearn task list --state running\n  fleetlearn task list -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			var st pb.TaskState
			if state != "" {
				var ok bool
				if st, ok = taskStates[state]; !ok {
					return fmt.Errorf("%w: --state %q (want %s)", ErrUsage, state, taskStateNames)
				}
			}
			return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
				c := apiv1.NewTaskServiceClient(conn)
				tasks, err := listAll(ctx, func(ctx context.Context, token string) ([]*pb.Task, string, error) {
					res, err := c.ListTasks(ctx, &pb.ListTasksRequest{PageToken: token, State: st})
					return res.GetTasks(), res.GetNextPageToken(), err
				})
				if err != nil {
					return err
				}
				w := cmd.OutOrStdout()
				if format == formatJSON {
					return writeJSON(w, &pb.ListTasksResponse{Tasks: tasks})
				}
				t := newTable(w, "ID", "NAME", "STATE", "TRAINED", "ROUND", "MODEL", "CREATED")
				for _, task := range tasks {
					trained, err := trainedRounds(ctx, c, task)
					if err != nil {
						return err
					}
					t.row(task.GetId(), task.GetName(), taskState(task.GetState()),
						fmt.Sprintf("%d/%d", trained, task.GetRoundsTotal()), latestRound(task),
						orDash(task.GetCurrentModel().GetVersion()), timeString(task.GetCreateTime()))
				}
				return t.flush()
			})
		},
	}
	cmd.Flags().StringVar(&state, "state", "", "only tasks in this state: "+taskStateNames)
	addFormatFlag(cmd, &format)
	return cmd
}

func newTaskGetCommand(a *app) *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Show one task",
		Long: "get shows a task's state, progress and settings, its secure aggregation and\n" +
			"differential privacy as the server resolves them for the task's cohort, and,\n" +
			"with DP, the epsilon its committed rounds spent against its budget.",
		Example: "  fleetlearn task get t-3f2a9c1b7d0e\n  fleetlearn task get t-3f2a9c1b7d0e -o json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.taskCall(cmd, format, func(ctx context.Context, c apiv1.TaskServiceClient) (taskResponse, error) {
				return c.GetTask(ctx, &pb.GetTaskRequest{TaskId: args[0]})
			})
		},
	}
	addFormatFlag(cmd, &format)
	return cmd
}

func newTaskStopCommand(a *app) *cobra.Command {
	var format, reason string
	cmd := &cobra.Command{
		Use:     "stop ID",
		Short:   "Stop a task; its open round is abandoned",
		Example: "  fleetlearn task stop t-3f2a9c1b7d0e --reason 'accuracy plateaued'",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.taskCall(cmd, format, func(ctx context.Context, c apiv1.TaskServiceClient) (taskResponse, error) {
				return c.StopTask(ctx, &pb.StopTaskRequest{TaskId: args[0], Reason: reason})
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why the task is stopped; recorded in the task and the audit log")
	addFormatFlag(cmd, &format)
	return cmd
}

// taskResponse is a response that carries the task it acted on.
type taskResponse interface{ GetTask() *pb.Task }

// taskCall runs one TaskService call about a task and prints the task.
func (a *app) taskCall(cmd *cobra.Command, format string, call func(context.Context, apiv1.TaskServiceClient) (taskResponse, error)) error {
	if err := checkFormat(format); err != nil {
		return err
	}
	return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
		c := apiv1.NewTaskServiceClient(conn)
		res, err := call(ctx, c)
		if err != nil {
			return err
		}
		return printTaskOf(ctx, c, cmd.OutOrStdout(), format, res.GetTask())
	})
}

func newTaskResumeCommand(a *app) *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "resume ID",
		Short: "Run a paused task's rounds again",
		Long: "The server pauses a task after several rounds in a row were abandoned for want\n" +
			"of devices; fleetlearn task get shows why. Resume it once enough devices are\n" +
			"enrolled and online, or stop it.",
		Example: "  fleetlearn task resume t-3f2a9c1b7d0e",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.taskCall(cmd, format, func(ctx context.Context, c apiv1.TaskServiceClient) (taskResponse, error) {
				return c.ResumeTask(ctx, &pb.ResumeTaskRequest{TaskId: args[0]})
			})
		},
	}
	addFormatFlag(cmd, &format)
	return cmd
}

func newTaskRoundsCommand(a *app) *cobra.Command {
	var format string
	var failures bool
	cmd := &cobra.Command{
		Use:   "rounds ID",
		Short: "List a task's rounds with their metrics and device failures, newest first",
		Long: "rounds lists every round of a task, newest first: its kind, state, devices assigned,\n" +
			"reported and dropped, the epsilon the task had spent after it (with DP), its metrics,\n" +
			"model and why it ended.",
		Example: "  fleetlearn task rounds t-3f2a9c1b7d0e\n  fleetlearn task rounds t-3f2a9c1b7d0e --failures\n" +
			"  fleetlearn task rounds t-3f2a9c1b7d0e -o json",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
				rounds, err := listRounds(ctx, apiv1.NewTaskServiceClient(conn), args[0])
				if err != nil {
					return err
				}
				w := cmd.OutOrStdout()
				sortRounds(rounds)
				if format == formatJSON {
					return writeJSON(w, &pb.ListRoundsResponse{Rounds: rounds})
				}
				return printRounds(w, rounds, failures)
			})
		},
	}
	addFormatFlag(cmd, &format)
	cmd.Flags().BoolVar(&failures, "failures", false, "also list, for each round, the devices that failed and why (-o json always has them)")
	return cmd
}

// trainedRounds counts a task's committed training rounds, its progress
// towards rounds_total. The task's current_round is no count of them: it
// numbers evaluation rounds and abandoned tries too.
func trainedRounds(ctx context.Context, c apiv1.TaskServiceClient, t *pb.Task) (uint32, error) {
	p, err := progressOf(ctx, c, t)
	return p.trained, err
}

func latestRound(t *pb.Task) string {
	if t.GetCurrentRound() == 0 {
		return "-"
	}
	return fmt.Sprint(t.GetCurrentRound())
}

// taskProgress is what a task's rounds have done so far.
type taskProgress struct {
	trained uint32  // committed training rounds
	epsilon float64 // DP ε spent, at the task's δ
}

// progressOf reads a task's progress from its rounds.
func progressOf(ctx context.Context, c apiv1.TaskServiceClient, t *pb.Task) (taskProgress, error) {
	var p taskProgress
	if t.GetCurrentRound() == 0 {
		return p, nil
	}
	rounds, err := listRounds(ctx, c, t.GetId())
	if err != nil {
		return p, err
	}
	for _, r := range rounds {
		if r.GetKind() == pb.RoundKind_ROUND_KIND_TRAIN && r.GetState() == pb.RoundState_ROUND_STATE_COMMITTED {
			p.trained++
		}
		// Each round states the task's cumulative ε after it.
		p.epsilon = max(p.epsilon, r.GetEpsilonSpent())
	}
	return p, nil
}

// printTaskOf prints t with its training progress.
func printTaskOf(ctx context.Context, c apiv1.TaskServiceClient, w io.Writer, format string, t *pb.Task) error {
	if format == formatJSON {
		return writeJSON(w, t)
	}
	p, err := progressOf(ctx, c, t)
	if err != nil {
		return err
	}
	return printTask(w, format, t, p)
}

// printTask prints one task: its id first, then the settings an operator
// checks most, and what its rounds have done (p).
func printTask(w io.Writer, format string, t *pb.Task, p taskProgress) error {
	if format == formatJSON {
		return writeJSON(w, t)
	}
	tw := newTable(w)
	tw.row("ID", t.GetId())
	tw.row("NAME", t.GetName())
	state := taskState(t.GetState())
	if r := t.GetStateReason(); r != "" {
		state += " (" + r + ")"
	}
	tw.row("STATE", state)
	tw.row("TRAINED", fmt.Sprintf("%d/%d rounds", p.trained, t.GetRoundsTotal()))
	tw.row("ROUND", latestRound(t))
	tw.row("MODEL", modelRef(t.GetModel()))
	tw.row("CURRENT MODEL", modelRef(t.GetCurrentModel()))
	tw.row("MODULE", moduleRef(t.GetModule()))
	if a := t.GetAsync(); a != nil {
		tw.row("MODE", fmt.Sprintf("async: %d training at once, a version every %d reports, reports at most %d versions stale (weight 1/sqrt(1+staleness))",
			a.GetConcurrency(), a.GetBuffer(), a.GetMaxStaleness()))
	} else {
		tw.row("COHORT", fmt.Sprintf("%d, report goal %d, over-selection %.2gx",
			t.GetCohortTarget(), t.GetReportGoal(), 1+t.GetOverSelection()))
	}
	tw.row("TIMEOUTS", fmt.Sprintf("selection %v, report %v",
		t.GetSelectionTimeout().AsDuration(), t.GetReportTimeout().AsDuration()))
	tw.row("AGGREGATION", aggregation(t.GetAggregation()))
	tw.row("SECURE AGGREGATION", secureAggregation(t))
	tw.row("DIFFERENTIAL PRIVACY", differentialPrivacy(t))
	if privacyconf.ResolveDP(t) != nil {
		tw.row("EPSILON SPENT", epsilonSpent(t, p.epsilon))
	}
	if e := t.GetUpdateEncoding(); e != pb.UpdateEncoding_UPDATE_ENCODING_UNSPECIFIED {
		tw.row("UPDATES", encodingFlag{&e}.String()+", with error feedback")
	}
	if tr := t.GetTrainable(); len(tr) > 0 {
		tw.row("TRAINABLE", strings.Join(tr, ", "))
	}
	if e := eligibility(t.GetEligibility()); e != "" {
		tw.row("ELIGIBILITY", e)
	}
	if n := t.GetEvalEvery(); n > 0 {
		tw.row("EVALUATION", fmt.Sprintf("every %d rounds", n))
	}
	if d := t.GetServerEvalDataset(); d != "" {
		tw.row("SERVER EVAL", d)
	}
	if l := t.GetLimits(); l != nil {
		tw.row("LIMITS", limits(l))
	}
	if h := t.GetHyperparameters(); len(h) > 0 {
		tw.row("HYPERPARAMETERS", string(h))
	}
	tw.row("CREATED", timeString(t.GetCreateTime()))
	tw.row("UPDATED", timeString(t.GetUpdateTime()))
	return tw.flush()
}

func modelRef(r *pb.ModelRef) string {
	if r.GetVersion() == "" {
		return "-"
	}
	if r.GetSha256() == "" {
		return r.GetVersion()
	}
	return fmt.Sprintf("%s (sha256 %s)", r.GetVersion(), shortSHA(r.GetSha256()))
}

func moduleRef(r *pb.ModuleRef) string {
	var details []string
	if r.GetName() != "" {
		details = append(details, r.GetName())
	}
	if r.GetAbiVersion() != 0 {
		details = append(details, fmt.Sprintf("ABI %d", r.GetAbiVersion()))
	}
	if len(details) == 0 {
		return orDash(r.GetSha256())
	}
	return fmt.Sprintf("%s (%s)", orDash(r.GetSha256()), strings.Join(details, ", "))
}

// limits describes WASM call limits, where zero means the agent default.
func limits(l *pb.Limits) string {
	orDefault := func(set bool, s string) string {
		if !set {
			return "agent default"
		}
		return s
	}
	return fmt.Sprintf("memory %s, call timeout %s, work %s",
		orDefault(l.GetMemoryPages() > 0, fmt.Sprintf("%d pages", l.GetMemoryPages())),
		orDefault(l.GetTimeout().AsDuration() > 0, l.GetTimeout().AsDuration().String()),
		orDefault(l.GetMaxFlops() > 0, fmt.Sprintf("%.3g flops", float64(l.GetMaxFlops()))))
}

func aggregation(c *pb.AggregationConfig) string {
	s := fmt.Sprintf("%s, server lr %g", ruleName(c.GetRule()), c.GetServerLearningRate())
	if c.GetMomentum() != 0 {
		s += fmt.Sprintf(", momentum %g", c.GetMomentum())
	}
	if c.GetTrimFraction() != 0 {
		s += fmt.Sprintf(", trim %g", c.GetTrimFraction())
	}
	if c.GetMaxUpdateNorm() != 0 {
		s += fmt.Sprintf(", max update norm %g", c.GetMaxUpdateNorm())
	}
	if c.GetUnboundedUpdates() {
		s += ", updates unbounded"
	}
	if c.GetMaxExamplesPerReport() != 0 {
		s += fmt.Sprintf(", at most %d examples per report", c.GetMaxExamplesPerReport())
	}
	return s
}

func eligibility(e *pb.Eligibility) string {
	var parts []string
	if n := e.GetMinExamples(); n > 0 {
		parts = append(parts, fmt.Sprintf("at least %d examples", n))
	}
	if e.GetRequireCharging() {
		parts = append(parts, "charging")
	}
	if e.GetRequireIdle() {
		parts = append(parts, "idle")
	}
	if e.GetRequireUnmetered() {
		parts = append(parts, "unmetered")
	}
	if len(e.GetDeviceClasses()) > 0 {
		parts = append(parts, "classes "+strings.Join(e.GetDeviceClasses(), ","))
	}
	return strings.Join(parts, ", ")
}
