package coord

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/internal/devproto"
	"github.com/fleetlearn/fleetlearn/model"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// TestChunkedReportMemory: two 67 MB updates stored by devproto in chunks
// are accepted and committed; it logs how much the process's peak RSS rose
// while they were stored and taken in (VmHWM, reset through
// /proc/self/clear_refs once the devices' reports were built), which is the
// coordinator's intake plus NATS storing the chunks.
func TestChunkedReportMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("67 MB updates; skipped in -short")
	}
	const rows, cols = 4100, 4096
	// Two and four reports: the rise should follow the model, not the count.
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("%d reports", n), func(t *testing.T) {
			h := newHarness(t)
			big, err := model.New(model.Tensor{Name: "w", Shape: []int{rows, cols}, Data: make([]float32, rows*cols)})
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := model.WriteSafetensors(&buf, big); err != nil {
				t.Fatal(err)
			}
			ver, err := h.deps.Blobs.Put(t.Context(), buf.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			if err := h.st.InsertModel(t.Context(), &store.ModelRow{Version: ver, Name: "big", Source: pb.ModelSource_MODEL_SOURCE_IMPORTED,
				Tensors: 1, Params: rows * cols, Size: int64(buf.Len()), Created: epoch}); err != nil {
				t.Fatal(err)
			}
			buf = bytes.Buffer{}
			h.model, h.ver = big, ver
			task := h.start(h.baseTask(func(task *pb.Task) { task.CohortTarget, task.ReportGoal = uint32(n), uint32(n) }))
			ev := h.watch(task.Id)
			var devs []*device
			for i := range n {
				devs = append(devs, h.enroll(fmt.Sprintf("dev-%d", i), 5))
			}
			plans := make([]*pb.RoundPlan, len(devs))
			payloads := make([][]byte, len(devs))
			for i, d := range devs {
				plans[i] = d.join()
				// Norm 0.41, within the default bound of 1.
				if payloads[i], err = proto.Marshal(d.signedUpdate(plans[i], constant(rows*cols, 1e-4), 5, nil)); err != nil {
					t.Fatal(err)
				}
			}
			before := procStatus(t, "VmRSS")
			if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
				t.Logf("cannot reset the peak RSS: %v", err)
			}
			for i, d := range devs {
				if err := devproto.PublishReport(t.Context(), clock.Real(), h.js, plans[i], d.id, payloads[i], nil); err != nil {
					t.Fatal(err)
				}
				if r := d.receipt(); !r.Accepted {
					t.Fatalf("%s: %v", d.id, r)
				}
			}
			if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Reported != uint32(n) {
				t.Fatalf("round: %v", got)
			}
			peak := procStatus(t, "VmHWM")
			t.Logf("%d reports of %d bytes: RSS %d MiB before, peak %d MiB after (+%d MiB)", n, len(payloads[0]), before>>20, peak>>20, (peak-before)>>20)
		})
	}
}

// procStatus is a /proc/self/status field in bytes, 0 where there is none.
func procStatus(t *testing.T, field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
