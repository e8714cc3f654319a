package poolsvc

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

func TestLogsFollowUntilCancelled(t *testing.T) {
	e := newEnv(t, nil)
	ws, ls := startGang(t, e, "j", 1)
	w := ws[0]
	r := ref(w, ls[0])
	appendLines := func(from, n int) {
		t.Helper()
		var lines []*pb.PoolLogLine
		for i := range n {
			lines = append(lines, &pb.PoolLogLine{Stream: "stdout", Text: fmt.Sprintf("line %d", from+i)})
		}
		if _, err := w.c.AppendLogs(w.ctx, &pb.AppendLogsRequest{Ref: r, Lines: lines}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 11 {
		appendLines(i*1000, 1000)
	}
	_, err := w.c.AppendLogs(w.ctx, &pb.AppendLogsRequest{Ref: r, Lines: []*pb.PoolLogLine{{Stream: "stdout", Text: strings.Repeat("x", MaxLogLineBytes+1)}}})
	wantCode(t, "oversized line", err, codes.InvalidArgument)
	_, err = w.c.AppendLogs(w.ctx, &pb.AppendLogsRequest{Ref: r, Lines: []*pb.PoolLogLine{{Stream: "tty", Text: "x"}}})
	wantCode(t, "unknown stream", err, codes.InvalidArgument)

	c, ctx := e.ops()
	stream, err := c.JobLogs(ctx, &pb.JobLogsRequest{JobId: "j", Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []*pb.PoolLogLine
	for len(got) < MaxLogLines {
		res, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, res.GetLines()...)
	}
	if len(got) != MaxLogLines || got[0].GetText() != "line 1000" || got[0].GetSeq() != 1001 || got[len(got)-1].GetText() != "line 10999" {
		t.Fatalf("kept %d lines, %q .. %q", len(got), got[0].GetText(), got[len(got)-1].GetText())
	}
	appendLines(11000, 1)
	res, err := stream.Recv()
	if err != nil || len(res.GetLines()) != 1 || res.GetLines()[0].GetText() != "line 11000" {
		t.Fatalf("followed %v %v", res, err)
	}
	if _, err := c.CancelJob(ctx, &pb.CancelJobRequest{JobId: "j", Reason: "wrong data"}); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := stream.Recv(); err != nil {
			break // the job ended, and so did the stream
		}
	}
	hb := w.beat()
	if len(hb.GetStop()) != 1 || hb.GetStop()[0].GetAtCheckpoint() || hb.GetStop()[0].GetJobId() != "j" {
		t.Fatalf("heartbeat after cancel %v", hb)
	}
	j := e.waitJob("j", func(j *pb.PoolJob) bool { return terminalState(j.GetState()) })
	if j.GetState() != pb.PoolJobState_POOL_JOB_STATE_CANCELLED || j.GetStateReason() != "cancelled by client: wrong data" {
		t.Fatalf("job %v", j)
	}
	if ev := e.poolEvents(); ev[len(ev)-1].State != "cancelled" {
		t.Fatalf("last event %+v", ev[len(ev)-1])
	}
	_, err = c.CancelJob(ctx, &pb.CancelJobRequest{JobId: "j"})
	wantCode(t, "cancel twice", err, codes.FailedPrecondition)
	// The stopped rank's last lines and its exit still arrive; after its
	// exit nothing more does.
	if _, err = w.c.AppendLogs(w.ctx, &pb.AppendLogsRequest{Ref: r, Lines: []*pb.PoolLogLine{{Stream: "stdout", Text: "last words"}}}); err != nil {
		t.Fatalf("last lines of a cancelled job's rank: %v", err)
	}
	if _, err = w.c.RankExited(w.ctx, &pb.RankExitedRequest{WorkerId: r.GetWorkerId(), JobId: "j", Attempt: r.GetAttempt(), Rank: r.GetRank(), Stopped: true}); err != nil {
		t.Fatalf("exit of a cancelled job's rank: %v", err)
	}
	_, err = w.c.AppendLogs(w.ctx, &pb.AppendLogsRequest{Ref: r, Lines: []*pb.PoolLogLine{{Stream: "stdout", Text: "late"}}})
	if c := status.Code(err); c != codes.NotFound && c != codes.FailedPrecondition {
		t.Fatalf("logs after the exit: %v, want NotFound or FailedPrecondition", err)
	}
	// A stale attempt's stop is sent once per loss interval, not at every
	// heartbeat of a rank still shutting down.
	stale := &pb.RankStatus{JobId: "j", Attempt: r.GetAttempt(), Rank: r.GetRank()}
	first := w.beat(stale)
	if again := w.beat(stale); len(again.GetStop()) != 0 {
		t.Fatalf("stop repeated at once: first %v, then %v", first, again)
	}
}
