package worker

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/internal/clock"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/worker/internal/remote"
)

// Log bounds: a line is at most what the protocol takes; a rank that
// writes faster than the server takes lines loses the excess, counted.
const (
	maxLineBytes    = 4096
	maxPendingLines = 2048
	maxBatchLines   = 256
	logFlushEvery   = 500 * time.Millisecond
)

// logShipper batches one rank's output lines to AppendLogs.
type logShipper struct {
	c   apiv1.PoolWorkerServiceClient
	ref *pb.RankRef
	clk clock.Clock
	log *slog.Logger

	mu      sync.Mutex
	pending []*pb.PoolLogLine
	dropped int
	kick    chan struct{}
	done    chan struct{}
	stopped chan struct{}
}

func newLogShipper(c apiv1.PoolWorkerServiceClient, ref *pb.RankRef, clk clock.Clock, log *slog.Logger) *logShipper {
	s := &logShipper{c: c, ref: ref, clk: clk, log: log, kick: make(chan struct{}, 1), done: make(chan struct{}), stopped: make(chan struct{})}
	go s.run()
	return s
}

// add queues a line; it never blocks, so a slow server cannot stall the
// rank's output pipe.
func (s *logShipper) add(stream, text string) {
	text = strings.ToValidUTF8(text, "\uFFFD")
	if len(text) > maxLineBytes {
		text = strings.ToValidUTF8(text[:maxLineBytes], "")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) >= maxPendingLines {
		s.dropped++
		return
	}
	s.pending = append(s.pending, &pb.PoolLogLine{Attempt: s.ref.GetAttempt(), Rank: s.ref.GetRank(), Stream: stream, Text: text, Time: timestamppb.New(s.clk.Now())})
	if len(s.pending) >= maxBatchLines {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

func (s *logShipper) run() {
	defer close(s.stopped)
	t := s.clk.NewTicker(logFlushEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C():
		case <-s.kick:
		case <-s.done:
			s.flush()
			return
		}
		s.flush()
	}
}

func (s *logShipper) flush() {
	for {
		s.mu.Lock()
		if s.dropped > 0 && len(s.pending) < maxPendingLines {
			s.pending = append(s.pending, &pb.PoolLogLine{Attempt: s.ref.GetAttempt(), Rank: s.ref.GetRank(), Stream: "agent",
				Text: fmt.Sprintf("%d lines dropped: the rank wrote faster than the server took them", s.dropped), Time: timestamppb.New(s.clk.Now())})
			s.dropped = 0
		}
		n := min(len(s.pending), maxBatchLines)
		batch := s.pending[:n:n]
		s.pending = s.pending[n:]
		s.mu.Unlock()
		if n == 0 {
			return
		}
		// A hang guard only: a log batch is not worth stalling the rank's end.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := remote.DefaultRetry().Do(ctx, func(ctx context.Context) error {
			_, err := s.c.AppendLogs(ctx, &pb.AppendLogsRequest{Ref: s.ref, Lines: batch}, remote.CallOptions()...)
			return err
		})
		cancel()
		if err != nil {
			s.log.Warn("rank log lines lost", "job", s.ref.GetJobId(), "rank", s.ref.GetRank(), "lines", n, "err", err)
			return
		}
	}
}

// close sends what is left and stops.
func (s *logShipper) close() {
	close(s.done)
	<-s.stopped
}
