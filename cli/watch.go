package cli

import (
	"context"
	"fmt"
	"io"
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
		Long: "watch prints a progress line per round event until the task ends. It exits\n" +
			"with status 0 when the task completes or is stopped, and non-zero when it fails.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			w := cmd.OutOrStdout()
			return a.call(cmd, true, func(ctx context.Context, conn *grpc.ClientConn) error {
				return watch(ctx, apiv1.NewTaskServiceClient(conn), args[0], newProgress(w, a.isTerminal(w)))
			})
		},
	}
}

func watch(ctx context.Context, c apiv1.TaskServiceClient, id string, p *progress) error {
	res, err := c.GetTask(ctx, &pb.GetTaskRequest{TaskId: id})
	if err != nil {
		return err
	}
	p.total = res.GetTask().GetRoundsTotal()
	if !ended(res.GetTask().GetState()) {
		stream, err := c.WatchTask(ctx, &pb.WatchTaskRequest{TaskId: id})
		if err != nil {
			return err
		}
		for {
			r, err := stream.Recv()
			if err == io.EOF || status.Code(err) == codes.FailedPrecondition {
				break // the task ended, possibly before the watch began
			}
			if err != nil {
				p.end()
				return err
			}
			p.event(r.GetEvent())
		}
		p.end()
		if res, err = c.GetTask(ctx, &pb.GetTaskRequest{TaskId: id}); err != nil {
			return err
		}
	}
	return p.final(res.GetTask())
}

func ended(s pb.TaskState) bool {
	return s == pb.TaskState_TASK_STATE_COMPLETED || s == pb.TaskState_TASK_STATE_STOPPED ||
		s == pb.TaskState_TASK_STATE_FAILED
}

// progress renders round events. On a terminal it redraws the current
// round's line in place and colours the outcome; elsewhere every event is a
// plain line of its own, so logs and pipes read well.
type progress struct {
	w     io.Writer
	tty   bool
	total uint32
	open  bool // a redrawn line is pending its newline
}

func newProgress(w io.Writer, tty bool) *progress { return &progress{w: w, tty: tty} }

const barWidth = 20

// ANSI escapes, written only to terminals.
const (
	clearLine = "\r\x1b[2K"
	green     = "\x1b[32m"
	red       = "\x1b[31m"
	reset     = "\x1b[0m"
)

func (p *progress) event(ev *pb.RoundEvent) {
	if ev == nil {
		return
	}
	line := p.line(ev)
	if !p.tty {
		fmt.Fprintln(p.w, line)
		return
	}
	final := ev.GetType() == pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED ||
		ev.GetType() == pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED
	fmt.Fprint(p.w, clearLine+line)
	p.open = !final
	if final {
		fmt.Fprintln(p.w)
	}
}

// line formats one event, for example
//
//	round 3/20 train committed [###-----------------] 8/10 reported, 2 dropped  accuracy=0.91 loss=0.23  model mnist@3
func (p *progress) line(ev *pb.RoundEvent) string {
	done := ev.GetRound()
	if t := ev.GetType(); t == pb.RoundEventType_ROUND_EVENT_TYPE_OPENED || t == pb.RoundEventType_ROUND_EVENT_TYPE_CLOSED {
		done-- // the round itself is still running
	}
	var b strings.Builder
	fmt.Fprintf(&b, "round %d/%d %s %s %s %d/%d reported, %d dropped",
		ev.GetRound(), p.total, roundKind(ev.GetKind()), p.outcome(ev.GetType()), bar(done, uint64(p.total)),
		ev.GetReported(), ev.GetAssigned(), ev.GetDropped())
	if m := ev.GetMetrics(); len(m.GetValues()) > 0 {
		b.WriteString("  " + metricsString(m))
	}
	if e := ev.GetEpsilonSpent(); e > 0 {
		b.WriteString("  epsilon=" + formatFloat(e))
	}
	if v := ev.GetModel().GetVersion(); v != "" {
		b.WriteString("  model " + v)
	}
	if r := ev.GetReason(); r != "" {
		b.WriteString("  (" + printable(r) + ")")
	}
	return b.String()
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
	switch state {
	case pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_STOPPED:
		msg := fmt.Sprintf("task %s %s after %d/%d rounds", t.GetId(), taskState(state), t.GetCurrentRound(), t.GetRoundsTotal())
		if v := t.GetCurrentModel().GetVersion(); v != "" {
			msg += ", model " + v
		}
		if r := t.GetStateReason(); r != "" {
			msg += " (" + printable(r) + ")"
		}
		fmt.Fprintln(p.w, msg)
		return nil
	case pb.TaskState_TASK_STATE_FAILED:
		return fmt.Errorf("task %s: %w: %s", t.GetId(), ErrTaskFailed, orDash(t.GetStateReason()))
	}
	return fmt.Errorf("task %s: %w: the task is %s", t.GetId(), ErrWatchEnded, taskState(state))
}
