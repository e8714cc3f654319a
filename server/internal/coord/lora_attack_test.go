package coord

import (
	"bytes"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/model"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// useModel makes m the harness's base model, as an import would.
func (h *harness) useModel(m *model.Model) {
	h.t.Helper()
	var buf bytes.Buffer
	if err := model.WriteSafetensors(&buf, m); err != nil {
		h.t.Fatal(err)
	}
	ver, err := h.deps.Blobs.Put(h.t.Context(), buf.Bytes())
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.st.InsertModel(h.t.Context(), &store.ModelRow{Version: ver, Name: "lora-base", Source: pb.ModelSource_MODEL_SOURCE_IMPORTED,
		Tensors: len(m.Tensors), Params: m.Layout().Size(), Size: int64(buf.Len()), Created: epoch}); err != nil {
		h.t.Fatal(err)
	}
	h.model, h.ver = m, ver
}

// tensorUpdate is one tensor of a hand-built update: the name and shape
// the report declares and its values.
type tensorUpdate struct {
	name   string
	shape  []uint64
	values []float32
}

// sendLayout publishes d's signed float32 report of tensors, laid out as
// given, under message id id.
func (d *device) sendLayout(plan *pb.RoundPlan, tensors []tensorUpdate, id string) {
	d.h.t.Helper()
	var flat []float32
	layout := make([]*pb.TensorSpec, len(tensors))
	for i, tu := range tensors {
		layout[i] = &pb.TensorSpec{Name: tu.name, Shape: tu.shape}
		flat = append(flat, tu.values...)
	}
	values := wire.EncodeDense(flat)
	rep := &pb.UpdateReport{TaskId: plan.TaskId, Round: plan.Round, DeviceId: d.id, ModelVersion: plan.GetModel().GetVersion(),
		ModuleSha256: plan.GetModule().GetSha256(), NumExamples: 5,
		Payload:       &pb.UpdateReport_Dense{Dense: &pb.DenseUpdate{Values: values, Layout: layout}},
		PayloadSha256: wire.SHA256(values)}
	sig, err := identity.SignReport(d.key, identity.UpdateStatement(rep))
	if err != nil {
		d.h.t.Fatal(err)
	}
	rep.Signature = sig
	d.publish(wire.ReportSubject(rep.TaskId, rep.Round, d.id), rep, id)
}

// TestLoRAReportsTouchOnlyAdapters: on a LoRA task (trainable "lora") an
// enrolled device sends signed reports meant to change what the task
// freezes or to slip values into the wrong adapter: every tensor of the
// model (base weights included), the adapters in the other order, an
// adapter renamed to the base tensor it sits on, an adapter of another
// rank, one of its own size but transposed, and adapters plus an extra
// tensor. Each is refused with a receipt naming the mismatch, before it
// touches the aggregate. Honest adapter updates commit; the base weights
// keep every bit and the adapters move by the honest mean.
func TestLoRAReportsTouchOnlyAdapters(t *testing.T) {
	h := newHarness(t)
	base, err := model.New(
		model.Tensor{Name: "fc.weight", Shape: []int{2, 3}, Data: []float32{1, 2, 3, 4, 5, 6}},
		model.Tensor{Name: "fc.lora_a", Shape: []int{1, 3}, Data: []float32{0.1, 0.2, 0.3}},
		model.Tensor{Name: "fc.lora_b", Shape: []int{2, 1}, Data: []float32{0, 0}})
	if err != nil {
		t.Fatal(err)
	}
	h.useModel(base)
	task := h.start(h.baseTask(func(t *pb.Task) { t.Trainable = []string{"lora"} }))
	ev := h.watch(task.Id)
	mallory, a, b := h.enroll("mallory", 5), h.enroll("dev-a", 5), h.enroll("dev-b", 5)
	plan := mallory.join()
	if got := plan.GetTrainable(); len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("plan trainable %v, want [1 2]", got)
	}
	full := func(v float32, n int) []float32 { return constant(n, v) }
	loraA := tensorUpdate{"fc.lora_a", []uint64{1, 3}, full(0.1, 3)}
	loraB := tensorUpdate{"fc.lora_b", []uint64{2, 1}, full(0.1, 2)}
	for i, tc := range []struct {
		name    string
		tensors []tensorUpdate
		want    []string
	}{
		{"every tensor, base weights included",
			[]tensorUpdate{{"fc.weight", []uint64{2, 3}, full(100, 6)}, loraA, loraB}, []string{"update has 3 tensors, the task trains 2"}},
		{"the base weight alone, in the adapters' place",
			[]tensorUpdate{{"fc.weight", []uint64{2, 3}, full(100, 6)}}, []string{"update has 1 tensors, the task trains 2"}},
		{"adapters in the other order", []tensorUpdate{loraB, loraA}, []string{"tensor 0 is fc.lora_b", "the task trains fc.lora_a"}},
		{"adapter renamed to its base tensor",
			[]tensorUpdate{{"fc.weight", []uint64{1, 3}, full(100, 3)}, loraB}, []string{"tensor 0 is fc.weight", "fc.lora_a"}},
		{"adapter of rank 2", []tensorUpdate{{"fc.lora_a", []uint64{2, 3}, full(0.1, 6)}, {"fc.lora_b", []uint64{2, 2}, full(0.1, 4)}},
			[]string{"tensor fc.lora_a has shape [2 3]", "[1 3]"}},
		{"adapter transposed", []tensorUpdate{{"fc.lora_a", []uint64{3, 1}, full(0.1, 3)}, loraB},
			[]string{"tensor fc.lora_a has shape [3 1]"}},
		{"adapter with an extra dimension", []tensorUpdate{{"fc.lora_a", []uint64{1, 3, 1}, full(0.1, 3)}, loraB},
			[]string{"tensor 0 is fc.lora_a[1 3 1]"}},
		{"adapters and an extra tensor", []tensorUpdate{loraA, loraB, {"fc.weight", []uint64{2, 3}, full(100, 6)}},
			[]string{"update has 3 tensors, the task trains 2"}},
		{"right layout, base weight's values appended", []tensorUpdate{loraA, loraB, {"", nil, full(100, 6)}},
			[]string{"update has 3 tensors"}},
	} {
		mallory.sendLayout(plan, tc.tensors, fmt.Sprintf("attack-%d", i))
		if r := mallory.receipt(); r.Accepted || !containsAll(r.Reason, tc.want...) {
			t.Fatalf("%s: receipt %v, want refused naming %q", tc.name, r, tc.want)
		}
	}
	for _, d := range []*device{a, b} {
		d.sendLayout(d.join(), []tensorUpdate{loraA, loraB}, "honest-"+d.id)
		if r := d.receipt(); !r.Accepted {
			t.Fatalf("%s: %v", d.id, r)
		}
	}
	h.clk.Advance(30 * time.Second)
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED || got.Reported != 2 {
		t.Fatalf("round: %v", got)
	}
	after := h.current(task.Id)
	for i, v := range after.Tensors[0].Data {
		if math.Float32bits(v) != math.Float32bits(base.Tensors[0].Data[i]) {
			t.Fatalf("frozen fc.weight changed: %v, was %v", after.Tensors[0].Data, base.Tensors[0].Data)
		}
	}
	wantA := []float32{0.2, 0.3, 0.4}
	for i, v := range after.Tensors[1].Data {
		if math.Abs(float64(v-wantA[i])) > 1e-6 {
			t.Fatalf("fc.lora_a = %v, want %v", after.Tensors[1].Data, wantA)
		}
	}
}
