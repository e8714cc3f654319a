package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

func newTaskWatchCommand(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "watch ID",
		Short: "Follow a task's rounds until it completes or stops",
		Long: "watch prints the rounds that already finished, then a progress line per round\n" +
			"event until the task ends. Training rounds count towards the task's rounds;\n" +
			"evaluation rounds are shown but not counted. A task with a server evaluation set\n" +
			"has its base model measured on it before round 1; that is shown first. Where the\n" +
			"base model and the final one were measured on the same data, the end shows both\n" +
			"and the change.\n" +
			"It exits with status 0 when the task completes or is stopped, and non-zero\n" +
			"when it fails or the server pauses it.",
		Example: "  fleetlearn task watch t-3f2a9c1b7d0e\n  fleetlearn task watch t-3f2a9c1b7d0e > watch.log   # a plain line per event, no redrawing",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			w := cmd.OutOrStdout()
			return a.call(cmd, true, func(ctx context.Context, conn *grpc.ClientConn) error {
				return watch(ctx, apiv1.NewTaskServiceClient(conn), args[0], newProgress(w, a.isTerminal(w)))
			})
		},
	}
}

// watch follows task id. The server's stream carries only what happens
// after it began and may drop events for a slow client, so the rounds the
// server has recorded fill in: those before the watch, and any the stream
// skipped. Each round is printed once.
func watch(ctx context.Context, c apiv1.TaskServiceClient, id string, p *progress) error {
	res, err := c.GetTask(ctx, &pb.GetTaskRequest{TaskId: id})
	if err != nil {
		return err
	}
	task := res.GetTask()
	p.begin(task)
	var stream grpc.ServerStreamingClient[pb.WatchTaskResponse]
	if live(task.GetState()) {
		// Opened before the listing, so that few rounds end between the
		// two unseen (the server subscribes when its handler runs); the
		// gap check and the last listing below catch those few.
		if stream, err = c.WatchTask(ctx, &pb.WatchTaskRequest{TaskId: id}); err != nil {
			return err
		}
	}
	if stream != nil {
		p.askBase(ctx, c, id, task)
	}
	if err := p.fill(ctx, c, id, 0); err != nil {
		return err
	}
	first := true
	for stream != nil {
		r, err := stream.Recv()
		if err == io.EOF || status.Code(err) == codes.FailedPrecondition {
			break // the task ended, possibly before the watch began
		}
		if err != nil {
			p.end()
			return err
		}
		if t := r.GetTask(); t != nil {
			task = t // it paused; the stream ends after this
			continue
		}
		ev := r.GetEvent()
		if ev == nil {
			continue
		}
		if first {
			first = false
			p.askBase(ctx, c, id, task)
		}
		if p.gap(ev.GetRound()) {
			if err := p.fill(ctx, c, id, ev.GetRound()); err != nil {
				p.end()
				return err
			}
		}
		p.event(ev)
	}
	if stream != nil {
		if err := p.fill(ctx, c, id, 0); err != nil {
			p.end()
			return err
		}
		p.end()
		if res, err = c.GetTask(ctx, &pb.GetTaskRequest{TaskId: id}); err != nil {
			return err
		}
		task = res.GetTask()
	}
	return p.final(task)
}

// live says whether a task in state s still has rounds to watch.
func live(s pb.TaskState) bool {
	return s == pb.TaskState_TASK_STATE_PENDING || s == pb.TaskState_TASK_STATE_RUNNING
}

// progress renders a task's rounds. On a terminal it redraws the current
// round's line in place and colours the outcome; elsewhere every event is a
// plain line of its own, so logs and pipes read well.
//
// It counts committed training rounds, the task's progress: an abandoned
// training round is tried again under the next round number, and an
// evaluation round trains nothing.
type progress struct {
	w       io.Writer
	tty     bool
	total   uint32
	cohort  uint32 // the task's cohort target, what an opened round selects
	async   *pb.AsyncConfig
	trained uint32
	open    bool   // a redrawn line is pending its newline
	pending uint64 // the round of that line

	stage map[uint64]int // how far each round was printed: see stageOf
	next  uint64         // lowest round from 1 not printed as finished

	// What rounds measured, by model version: a training round's server
	// evaluation measures the model it committed, an evaluation round the
	// model it started from.
	base, current string
	measured      map[string]map[string]float64
	baseShown     bool
}

func newProgress(w io.Writer, tty bool) *progress {
	return &progress{w: w, tty: tty, stage: map[uint64]int{}, next: 1, measured: map[string]map[string]float64{}}
}

func (p *progress) begin(t *pb.Task) {
	p.total = t.GetRoundsTotal()
	p.cohort = t.GetCohortTarget()
	p.async = t.GetAsync()
	p.base = t.GetModel().GetVersion()
	p.current = p.base
	p.showBase(t)
}

// askBase looks again for the base model's measure on a task that has a
// server evaluation set but did not show one: the server measures it before
// round 1 opens, so a watch begun with the task may be early. It is asked
// before the rounds are listed and at the first event, to show it before
// them; the final task shows it otherwise.
func (p *progress) askBase(ctx context.Context, c apiv1.TaskServiceClient, id string, t *pb.Task) {
	if p.baseShown || t.GetServerEvalDataset() == "" || t.GetBaseMetrics() != nil || t.GetCurrentRound() > 0 {
		return
	}
	if res, err := c.GetTask(ctx, &pb.GetTaskRequest{TaskId: id}); err == nil {
		p.showBase(res.GetTask())
	}
}

// showBase prints what the server measured the base model at before round
// 1, once, and keeps it for the final comparison:
//
//	base model a1a1a1a1a1a1: server_accuracy=0.1 server_loss=2.3
func (p *progress) showBase(t *pb.Task) {
	vals := t.GetBaseMetrics().GetValues()
	if p.baseShown || len(vals) == 0 || p.base == "" {
		return
	}
	if p.measured[p.base] == nil {
		p.measured[p.base] = map[string]float64{}
	}
	maps.Copy(p.measured[p.base], vals)
	p.baseShown = true
	p.end()
	fmt.Fprintf(p.w, "base model %s: %s\n", shortSHA(p.base), metricsString(&pb.Metrics{Values: vals}))
}

// gap says whether a round before round has not been printed as finished:
// its events came before the watch, or the stream dropped them.
func (p *progress) gap(round uint64) bool { return round > p.next }

// fill prints, in order, the recorded rounds not yet printed, those before
// round only when round is not 0.
func (p *progress) fill(ctx context.Context, c apiv1.TaskServiceClient, id string, before uint64) error {
	rounds, err := listRounds(ctx, c, id)
	if err != nil {
		return err
	}
	slices.SortFunc(rounds, func(a, b *pb.RoundSummary) int { return cmp.Compare(a.GetRound(), b.GetRound()) })
	for _, r := range rounds {
		if before != 0 && r.GetRound() >= before {
			break
		}
		p.event(summaryEvent(r))
	}
	return nil
}

// summaryEvent renders a recorded round as the event that left it in its
// state.
func summaryEvent(r *pb.RoundSummary) *pb.RoundEvent {
	typ := map[pb.RoundState]pb.RoundEventType{
		pb.RoundState_ROUND_STATE_OPEN:      pb.RoundEventType_ROUND_EVENT_TYPE_OPENED,
		pb.RoundState_ROUND_STATE_CLOSED:    pb.RoundEventType_ROUND_EVENT_TYPE_CLOSED,
		pb.RoundState_ROUND_STATE_COMMITTED: pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED,
		pb.RoundState_ROUND_STATE_ABANDONED: pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED,
	}[r.GetState()]
	return &pb.RoundEvent{TaskId: r.GetTaskId(), Round: r.GetRound(), Type: typ, Kind: r.GetKind(),
		Assigned: r.GetAssigned(), Reported: r.GetReported(), Dropped: r.GetDropped(), Metrics: r.GetMetrics(),
		Model: r.GetModel(), Reason: r.GetReason(), EpsilonSpent: r.GetEpsilonSpent()}
}

// ANSI escapes, written only to terminals.
const (
	clearLine = "\r\x1b[2K"
	green     = "\x1b[32m"
	red       = "\x1b[31m"
	reset     = "\x1b[0m"
)

const barWidth = 20

// stageOf orders a round's events: a round is printed at most once per
// stage, and never back at an earlier one.
func stageOf(t pb.RoundEventType) int {
	switch t {
	case pb.RoundEventType_ROUND_EVENT_TYPE_OPENED:
		return 1
	case pb.RoundEventType_ROUND_EVENT_TYPE_CLOSED:
		return 2
	case pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED, pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED:
		return finishedStage
	}
	return 0
}

const finishedStage = 3

// event prints ev unless its round was printed as far already.
func (p *progress) event(ev *pb.RoundEvent) {
	if ev == nil {
		return
	}
	round, typ := ev.GetRound(), ev.GetType()
	st := stageOf(typ)
	if st == 0 || st <= p.stage[round] {
		return
	}
	p.stage[round] = st
	final := st == finishedStage
	for p.stage[p.next] == finishedStage {
		p.next++
	}
	train := ev.GetKind() == pb.RoundKind_ROUND_KIND_TRAIN
	if train && typ == pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED {
		p.trained++
	}
	line := p.line(ev)
	measuredBase := p.measure(ev)
	if !p.tty {
		fmt.Fprintln(p.w, line)
	} else {
		if p.open && p.pending != round {
			p.end()
		}
		fmt.Fprint(p.w, clearLine+line)
		p.open, p.pending = !final, round
		if final {
			fmt.Fprintln(p.w)
		}
	}
	if measuredBase && !p.baseShown {
		p.baseShown = true
		p.end()
		fmt.Fprintf(p.w, "base model %s: %s\n", shortSHA(p.base), metricsString(&pb.Metrics{Values: p.measured[p.base]}))
	}
}

// measure records what a committed round measured and reports whether that
// was the base model.
func (p *progress) measure(ev *pb.RoundEvent) bool {
	if ev.GetType() != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED {
		return false
	}
	var model, prefix string
	switch ev.GetKind() {
	case pb.RoundKind_ROUND_KIND_TRAIN:
		if v := ev.GetModel().GetVersion(); v != "" {
			p.current = v
		}
		model, prefix = p.current, "server_"
	case pb.RoundKind_ROUND_KIND_EVALUATE:
		model, prefix = p.current, "eval_"
	default:
		return false
	}
	found := false
	for k, v := range ev.GetMetrics().GetValues() {
		if !strings.HasPrefix(k, prefix) || model == "" {
			continue
		}
		if p.measured[model] == nil {
			p.measured[model] = map[string]float64{}
		}
		p.measured[model][k] = v
		found = true
	}
	return found && model == p.base
}

// line formats one event, for example
//
//	round 4 train 3/20 opened [###-----------------] selecting a cohort of 10
//	round 4 train 3/20 committed [###-----------------] 8/10 reported, 2 dropped  train_accuracy=0.91 train_loss=0.23  model 3f2a9c1b7d0e
//	round 5 evaluate committed [###-----------------] 9/10 reported, 1 dropped  eval_accuracy=0.93
//
// A round just opened has no counts yet: it is selecting its cohort. An
// async task's round is a buffer, and its line says so, for example
//
//	round 7 train 7/20 committed [#######-------------] 10 reports, staleness mean 2.4 max 6, 93/100 training  train_loss=0.31  model 3f2a9c1b7d0e
func (p *progress) line(ev *pb.RoundEvent) string {
	var b strings.Builder
	fmt.Fprintf(&b, "round %d ", ev.GetRound())
	switch ev.GetKind() {
	case pb.RoundKind_ROUND_KIND_TRAIN:
		n := p.trained
		if ev.GetType() != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED {
			n++ // the training round this one tries to commit
		}
		fmt.Fprintf(&b, "train %d/%d ", n, p.total)
	default:
		b.WriteString(roundKind(ev.GetKind()) + " ")
	}
	fmt.Fprintf(&b, "%s %s ", p.outcome(ev.GetType()), bar(uint64(p.trained), uint64(p.total)))
	m := ev.GetMetrics()
	if a := p.async; a != nil {
		m = asyncLine(&b, a, ev)
	} else if ev.GetType() == pb.RoundEventType_ROUND_EVENT_TYPE_OPENED && ev.GetAssigned() == 0 && ev.GetReported() == 0 && ev.GetDropped() == 0 {
		if p.cohort > 0 {
			fmt.Fprintf(&b, "selecting a cohort of %d", p.cohort)
		} else {
			b.WriteString("selecting its cohort")
		}
	} else {
		fmt.Fprintf(&b, "%d/%d reported, %d dropped", ev.GetReported(), ev.GetAssigned(), ev.GetDropped())
	}
	if len(m.GetValues()) > 0 {
		b.WriteString("  " + metricsString(m))
	}
	if e := ev.GetEpsilonSpent(); e > 0 {
		b.WriteString("  epsilon=" + formatFloat(e))
	}
	if v := ev.GetModel().GetVersion(); v != "" {
		b.WriteString("  model " + shortSHA(v))
	}
	if r := ev.GetReason(); r != "" {
		b.WriteString("  (" + printable(r) + ")")
	}
	return b.String()
}

// asyncLine writes what an async task's round did as a buffer: the reports
// it took, their staleness and the seats in use as its last report came
// in. It returns the round's other metrics.
func asyncLine(b *strings.Builder, a *pb.AsyncConfig, ev *pb.RoundEvent) *pb.Metrics {
	vals := ev.GetMetrics().GetValues()
	if ev.GetType() == pb.RoundEventType_ROUND_EVENT_TYPE_OPENED {
		fmt.Fprintf(b, "buffering %d reports, up to %d devices training, staleness at most %d", a.GetBuffer(), a.GetConcurrency(), a.GetMaxStaleness())
	} else {
		fmt.Fprintf(b, "%d reports", ev.GetReported())
		if mean, ok := vals["async_staleness_mean"]; ok {
			fmt.Fprintf(b, ", staleness mean %s max %s, %s/%d training", formatFloat(mean), formatFloat(vals["async_staleness_max"]),
				formatFloat(vals["async_training"]), a.GetConcurrency())
		}
	}
	rest := map[string]float64{}
	for k, v := range vals {
		if !strings.HasPrefix(k, "async_") {
			rest[k] = v
		}
	}
	return &pb.Metrics{Values: rest}
}

func (p *progress) outcome(t pb.RoundEventType) string {
	s := eventType(t)
	if !p.tty {
		return s
	}
	switch t {
	case pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED:
		return green + s + reset
	case pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED:
		return red + s + reset
	}
	return s
}

// bar draws done out of total as a fixed-width text bar.
func bar(done, total uint64) string {
	filled := barWidth
	if total > 0 {
		filled = int(min(done, total) * barWidth / total)
	}
	return "[" + strings.Repeat("#", filled) + strings.Repeat("-", barWidth-filled) + "]"
}

// end finishes a line left open by a redraw.
func (p *progress) end() {
	if p.open {
		fmt.Fprintln(p.w)
		p.open = false
	}
}

// final reports how the task ended: nil when it completed or was stopped.
func (p *progress) final(t *pb.Task) error {
	state := t.GetState()
	rounds := fmt.Sprintf("%d/%d training rounds", p.trained, t.GetRoundsTotal())
	switch state {
	case pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_STOPPED:
		p.showBase(t) // unless shown already
		msg := fmt.Sprintf("task %s %s after %s", t.GetId(), taskState(state), rounds)
		final := t.GetCurrentModel().GetVersion()
		if final != "" {
			msg += ", model " + shortSHA(final)
		}
		if r := t.GetStateReason(); r != "" {
			msg += " (" + printable(r) + ")"
		}
		fmt.Fprintln(p.w, msg)
		if m := p.measured[final]; len(m) > 0 && final != p.base {
			fmt.Fprintf(p.w, "final model %s: %s\n", shortSHA(final), compare(m, p.measured[p.base]))
		}
		return nil
	case pb.TaskState_TASK_STATE_FAILED:
		return &sentence{is: ErrTaskFailed, msg: fmt.Sprintf("task %s failed after %s: %s; the server log has the details",
			t.GetId(), rounds, orDash(printable(t.GetStateReason())))}
	case pb.TaskState_TASK_STATE_PAUSED:
		return &sentence{is: ErrTaskPaused, msg: fmt.Sprintf("task %s paused after %s: %s; "+
			"fleetlearn task resume %s runs it again once devices can fill its cohort, fleetlearn task stop %s ends it",
			t.GetId(), rounds, orDash(printable(t.GetStateReason())), t.GetId(), t.GetId())}
	}
	return &sentence{is: ErrWatchEnded, msg: fmt.Sprintf("the server ended the watch while task %s is %s; watch it again",
		t.GetId(), taskState(state))}
}

// compare formats final metrics, each with the base model's value and the
// change where the base model was measured on the same data.
func compare(final, base map[string]float64) string {
	parts := make([]string, 0, len(final))
	for _, k := range slices.Sorted(maps.Keys(final)) {
		s := k + "=" + formatFloat(final[k])
		if b, ok := base[k]; ok {
			s += fmt.Sprintf(" (base %s, %+.4g)", formatFloat(b), final[k]-b)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}
