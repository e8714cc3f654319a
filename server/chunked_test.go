package server_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/model"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// bigParams makes an update of 4100×4096 float32 values, 67 MB: eight
// chunks or more at the default 8 MiB message limit.
const bigRows, bigCols = 4100, 4096

// TestChunkedRounds: a 67 MB update round-trips through one plaintext
// round, one secure round and one DP round, the agents storing them in
// chunks (docs/PROTOCOL.md, Chunked reports). The committed model moved by the
// Trivial module's step.
func TestChunkedRounds(t *testing.T) {
	if testing.Short() {
		t.Skip("67 MB updates; skipped in -short")
	}
	if 4*bigRows*bigCols < 64<<20 || 4*bigRows*bigCols <= wire.MaxMessageBytes {
		t.Fatal("the update must exceed 64 MiB")
	}
	for _, tc := range []struct {
		name       string
		devices    int
		rows, cols int
		edit       func(*pb.Task)
	}{
		{"plaintext", 2, bigRows, bigCols, func(*pb.Task) {}},
		{"secagg", 3, bigRows, bigCols, func(task *pb.Task) {
			task.Secagg = &pb.SecAggConfig{ClipRange: 0.01, MaxWeight: 1, StageTimeout: durationpb.New(60 * time.Second)}
		}},
		{"dp", 2, bigRows, bigCols, func(task *pb.Task) {
			task.Dp = &pb.DPConfig{Mechanism: pb.DPMechanism_DP_MECHANISM_CENTRAL_GAUSSIAN, ClipNorm: 5,
				NoiseMultiplier: 0.01, TargetEpsilon: 1e6, Delta: 1e-5}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, version, module, base, stored := bigHarness(t, tc.devices, tc.rows, tc.cols)
			task := &pb.Task{Name: "big-" + tc.name, Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
				CohortTarget: uint32(tc.devices), ReportGoal: uint32(tc.devices), RoundsTotal: 1,
				SelectionTimeout: durationpb.New(60 * time.Second), ReportTimeout: durationpb.New(300 * time.Second)}
			tc.edit(task)
			task = h.CreateTask(t, task)
			t.Cleanup(func() {
				if t.Failed() {
					for _, r := range h.Rounds(t, task.Id) {
						t.Logf("round %d %v: %s %v", r.Round, r.State, r.Reason, r.Failures)
					}
				}
			})
			done := h.WaitTask(t, task.Id, 5*time.Minute, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED,
				pb.TaskState_TASK_STATE_STOPPED)
			if done.State != pb.TaskState_TASK_STATE_COMPLETED {
				t.Fatalf("task %v: %s", done.State, done.StateReason)
			}
			rounds := h.Rounds(t, task.Id)
			if len(rounds) != 1 || rounds[0].State != pb.RoundState_ROUND_STATE_COMMITTED || int(rounds[0].Reported) != tc.devices {
				t.Fatalf("rounds %v", rounds)
			}
			if n := stored(); n < 2*tc.devices {
				t.Fatalf("%d chunks stored for %d reports", n, tc.devices)
			}
			got := exportModel(t, h, done.CurrentModel.GetVersion())
			// Every parameter moved by the step, or less where the devices
			// clipped the update to the task's norm bound (1 by default: a
			// move of 1/4098). The noise of the DP round (std 0.025 a
			// parameter) averages out over 16.8M parameters to 6e-6; the
			// quantization of secagg is far below the move everywhere.
			var move float64
			for i := range got {
				move += float64(got[i] - base[i])
			}
			move /= float64(len(got))
			if move < 0.2*wasmtest.TrivialStep || move > 1.05*wasmtest.TrivialStep {
				t.Fatalf("mean parameter move %v, want (0.2, 1]×%v", move, wasmtest.TrivialStep)
			}
			if task.Dp == nil {
				for _, i := range []int{0, len(got) / 2, len(got) - 1} {
					if d := float64(got[i] - base[i]); d < 0.95*move || d > 1.05*move {
						t.Fatalf("parameter %d moved by %v, the mean by %v", i, d, move)
					}
				}
			}
			t.Logf("%s: peak RSS of the test process (server and %d agents) %d MiB", tc.name, tc.devices, peakRSS(t)>>20)
		})
	}
}

// bigHarness is a server with the Trivial module, a rows×cols model and n agents.
func bigHarness(t *testing.T, n, rows, cols int) (h *servertest.Harness, version, module string, base []float32, stored func() int) {
	t.Helper()
	h = servertest.New(t, servertest.WithPace(50*time.Millisecond))
	m, err := model.New(model.Tensor{Name: "w", Shape: []int{rows, cols}, Data: make([]float32, rows*cols)})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(h.NATSURL(), h.ServiceNATSOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var chunks atomic.Int64
	if _, err := nc.Subscribe(wire.SubjectStoredPrefix+"fl.chunk.>", func(*nats.Msg) { chunks.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	stored = func() int { nc.Flush(); return int(chunks.Load()) }
	version = h.ImportModel(t, "big", m)
	module = h.RegisterModule(t, "trivial", wasmtest.Trivial())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait(); runtime.GC() })
	for i := range n {
		id := fmt.Sprintf("dev-%03d", i)
		a, err := edge.New(edge.Config{NATSURL: h.NATSURL(), DataDir: enrollDir(t, h, id), DeviceID: id},
			edge.WithDataset(datatest.Synthetic(20, 4, 2, uint64(i+1))), edge.WithSandbox(sharedSandbox(t)))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); a.Run(ctx) }()
	}
	return h, version, module, m.Flatten(), stored
}

func exportModel(t *testing.T, h *servertest.Harness, version string) []float32 {
	t.Helper()
	_, b, err := client.ExportModelBytes(t.Context(), h.Models, version, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.DecodeSafetensors(b)
	if err != nil {
		t.Fatal(err)
	}
	return m.Flatten()
}

// peakRSS is the process's peak resident set (VmHWM), 0 where /proc has none.
func peakRSS(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
