package simfleet_test

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/aggregator/quant"
	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/internal/simfleet"
	"github.com/fleetlearn/fleetlearn/model"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

func TestStartRefusesBadConfig(t *testing.T) {
	layout := []*pb.TensorSpec{{Name: "w", Shape: []uint64{2, 3}}}
	delta := make([]float32, 6)
	for _, tc := range []struct {
		name string
		cfg  simfleet.Config
		want string
	}{
		{"no url", simfleet.Config{Devices: 1, Layout: layout, Delta: delta}, "NATSURL"},
		{"no devices", simfleet.Config{NATSURL: "nats://x", Layout: layout, Delta: delta}, "0 devices"},
		{"more conns than devices", simfleet.Config{NATSURL: "nats://x", Devices: 2, Conns: 3, Layout: layout, Delta: delta}, "connections"},
		{"negative conns", simfleet.Config{NATSURL: "nats://x", Devices: 2, Conns: -1, Layout: layout, Delta: delta}, "connections"},
		{"empty update", simfleet.Config{NATSURL: "nats://x", Devices: 1, Layout: layout}, "empty update"},
		{"no layout", simfleet.Config{NATSURL: "nats://x", Devices: 1, Delta: delta}, "does not hold"},
		{"short update", simfleet.Config{NATSURL: "nats://x", Devices: 1, Layout: layout, Delta: delta[:5]}, "does not hold"},
		{"overflowing shape", simfleet.Config{NATSURL: "nats://x", Devices: 1, Delta: delta,
			Layout: []*pb.TensorSpec{{Name: "w", Shape: []uint64{1 << 40, 1 << 40}}}}, "does not hold"},
		{"bad id", simfleet.Config{NATSURL: "nats://x", Devices: 1, Layout: layout, Delta: delta, IDPrefix: "a.b"}, "invalid identifier"},
		{"negative uploads", simfleet.Config{NATSURL: "nats://x", Devices: 2, Uploads: -1, Layout: layout, Delta: delta}, "upload connections"},
		{"more uploads than devices", simfleet.Config{NATSURL: "nats://x", Devices: 2, Uploads: 3, Layout: layout, Delta: delta}, "upload connections"},
		{"negative max publishing", simfleet.Config{NATSURL: "nats://x", Devices: 1, Layout: layout, Delta: delta, MaxPublishing: -1}, "MaxPublishing"},
		{"unknown encoding", simfleet.Config{NATSURL: "nats://x", Devices: 1, Layout: layout, Quantized: []byte{1},
			Encoding: pb.UpdateEncoding(99)}, "update encoding"},
		{"quantized without encoding", simfleet.Config{NATSURL: "nats://x", Devices: 1, Layout: layout, Delta: delta, Quantized: []byte{1}}, "needs its Encoding"},
		{"int8 without quantized", simfleet.Config{NATSURL: "nats://x", Devices: 1, Layout: layout, Delta: delta,
			Encoding: pb.UpdateEncoding_UPDATE_ENCODING_INT8}, "empty update"},
		{"int8 with delta too", simfleet.Config{NATSURL: "nats://x", Devices: 1, Layout: layout, Delta: delta, Quantized: []byte{1},
			Encoding: pb.UpdateEncoding_UPDATE_ENCODING_INT8}, "leave Delta empty"},
		{"int8 without layout", simfleet.Config{NATSURL: "nats://x", Devices: 1, Quantized: []byte{1},
			Encoding: pb.UpdateEncoding_UPDATE_ENCODING_INT8}, "does not hold"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := simfleet.Start(tc.cfg)
			if !errors.Is(err, simfleet.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want ErrConfig mentioning %q", err, tc.want)
			}
		})
	}
}

// TestFleetRunsRounds: simulated devices check in, fetch the model and report
// through a real server; every round commits with their updates, which move
// the model by the reported delta.
func TestFleetRunsRounds(t *testing.T) {
	h := servertest.New(t, servertest.WithPace(20*time.Millisecond))
	m, err := model.New(model.Tensor{Name: "w", Shape: []int{2, 3}, Data: make([]float32, 6)})
	if err != nil {
		t.Fatal(err)
	}
	version := h.ImportModel(t, "tiny", m)
	module := h.RegisterModule(t, "softmax", wasmtest.Build(t, wasmtest.Softmax))
	task := h.CreateTask(t, &pb.Task{Name: "simfleet", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
		CohortTarget: 3, ReportGoal: 3, OverSelection: 0.01, RoundsTotal: 2,
		SelectionTimeout: durationpb.New(20 * time.Second), ReportTimeout: durationpb.New(20 * time.Second),
		// The update below has norm 1.22: above the default bound for a
		// model this small.
		Aggregation: &pb.AggregationConfig{MaxUpdateNorm: 2}})
	delta := []float32{0.5, 0.5, 0.5, 0.5, 0.5, 0.5}
	lg := simfleet.Config{NATSURL: h.NATSURL(), NATSOptions: h.ServiceNATSOptions(), Devices: 3, Conns: 2, FetchModel: true,
		Layout: []*pb.TensorSpec{{Name: "w", Shape: []uint64{2, 3}}}, Delta: delta}
	lg.Keys = h.EnrollKeys(t, lg.DeviceIDs())
	f, err := simfleet.Start(lg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	done := h.WaitTask(t, task.Id, 60*time.Second, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s (fleet %+v, %s)", done.State, done.StateReason, f.Stats(), f.LastFailure())
	}
	for _, r := range h.Rounds(t, task.Id) {
		if r.State != pb.RoundState_ROUND_STATE_COMMITTED || r.Reported != 3 {
			t.Fatalf("round %d: %v with %d reports: %s", r.Round, r.State, r.Reported, r.Reason)
		}
		tr, ok := f.Trace(task.Id, r.Round)
		if !ok || tr.Plans < 3 || tr.Reports < 3 || tr.LastReport.Before(tr.FirstPlan) {
			t.Fatalf("round %d trace %+v (found %v)", r.Round, tr, ok)
		}
	}
	f.Stop()
	st := f.Stats()
	if st.Fetches < 6 || st.Reports < 6 || st.Failures != 0 || st.CheckIns < st.Plans {
		t.Fatalf("stats %+v: %s", st, f.LastFailure())
	}
	// FedAvg of identical deltas is the delta: two rounds move every value by 1.
	_, buf, err := client.ExportModelBytes(t.Context(), h.Models, done.CurrentModel.GetVersion(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	got, err := model.DecodeSafetensors(buf)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range got.Flatten() {
		if v < 0.999 || v > 1.001 {
			t.Fatalf("value %d is %v after two rounds of +0.5", i, v)
		}
	}
}

// TestFleetUploadConnections: with Uploads, the devices' reports go over
// the upload connections and nothing report-sized over the devices' own,
// and every round commits with them.
func TestFleetUploadConnections(t *testing.T) {
	h := servertest.New(t, servertest.WithPace(20*time.Millisecond))
	// 64k values: a report of 256 KB, far above anything else a device sends.
	const rows, cols = 256, 256
	m, err := model.New(model.Tensor{Name: "w", Shape: []int{rows, cols}, Data: make([]float32, rows*cols)})
	if err != nil {
		t.Fatal(err)
	}
	version := h.ImportModel(t, "wide", m)
	module := h.RegisterModule(t, "softmax", wasmtest.Build(t, wasmtest.Softmax))
	task := h.CreateTask(t, &pb.Task{Name: "simfleet-uploads", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
		CohortTarget: 3, ReportGoal: 3, OverSelection: 0.01, RoundsTotal: 2,
		SelectionTimeout: durationpb.New(20 * time.Second), ReportTimeout: durationpb.New(20 * time.Second),
		Aggregation: &pb.AggregationConfig{MaxUpdateNorm: 200}}) // the update's norm is 128
	delta := make([]float32, rows*cols)
	for i := range delta {
		delta[i] = 0.5
	}
	lg := simfleet.Config{NATSURL: h.NATSURL(), NATSOptions: h.ServiceNATSOptions(), Devices: 4, Uploads: 2, FetchModel: true,
		Layout: []*pb.TensorSpec{{Name: "w", Shape: []uint64{rows, cols}}}, Delta: delta}
	lg.Keys = h.EnrollKeys(t, lg.DeviceIDs())
	f, err := simfleet.Start(lg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	done := h.WaitTask(t, task.Id, 60*time.Second, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s (fleet %+v, %s)", done.State, done.StateReason, f.Stats(), f.LastFailure())
	}
	f.Stop()
	st := f.Stats()
	// Four devices for a goal of three: the round may close before the
	// fourth report, which is then refused as late; every round still
	// needed three accepted.
	if st.Accepted < 6 || st.Failures != 0 {
		t.Fatalf("stats %+v: %s", st, f.LastFailure())
	}
	conns := f.ConnStats()
	if len(conns) != 4+2 {
		t.Fatalf("%d connections, want 4 devices' and 2 upload", len(conns))
	}
	var uploaded uint64
	for i, c := range conns {
		if i < 4 && c.OutBytes >= 4*rows*cols {
			t.Fatalf("device connection %d sent %d bytes: a report went over it", i, c.OutBytes)
		}
		if i >= 4 {
			uploaded += c.OutBytes
		}
	}
	if want := uint64(st.Reports) * 4 * rows * cols; uploaded < want {
		t.Fatalf("upload connections sent %d bytes, want at least %d for %d reports", uploaded, want, st.Reports)
	}
	_, buf, err := client.ExportModelBytes(t.Context(), h.Models, done.CurrentModel.GetVersion(), 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	got, err := model.DecodeSafetensors(buf)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range got.Flatten() {
		if v < 0.999 || v > 1.001 {
			t.Fatalf("value %d is %v after two rounds of +0.5", i, v)
		}
	}
}

// TestFleetQuantizedOneAtATime: devices of an int8 task report the update
// the fleet was given already quantized, and with MaxPublishing 1 they build
// and publish their reports one at a time; every round commits with all of
// them and moves the model by the update.
func TestFleetQuantizedOneAtATime(t *testing.T) {
	h := servertest.New(t, servertest.WithPace(20*time.Millisecond))
	m, err := model.New(model.Tensor{Name: "w", Shape: []int{2, 3}, Data: make([]float32, 6)})
	if err != nil {
		t.Fatal(err)
	}
	version := h.ImportModel(t, "tiny", m)
	module := h.RegisterModule(t, "softmax", wasmtest.Build(t, wasmtest.Softmax))
	task := h.CreateTask(t, &pb.Task{Name: "simfleet-int8", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
		CohortTarget: 3, ReportGoal: 3, OverSelection: 0.01, RoundsTotal: 2, UpdateEncoding: pb.UpdateEncoding_UPDATE_ENCODING_INT8,
		SelectionTimeout: durationpb.New(20 * time.Second), ReportTimeout: durationpb.New(20 * time.Second),
		Aggregation: &pb.AggregationConfig{MaxUpdateNorm: 2}})
	// Every value is the block's largest, which int8 codes as 127 steps of
	// the block's scale: 0.5 to within float32 rounding.
	enc, _, err := quant.Encode([]float32{0.5, 0.5, 0.5, 0.5, 0.5, 0.5}, 8, quant.DefaultBlock, rand.NewPCG(1, 2))
	if err != nil {
		t.Fatal(err)
	}
	lg := simfleet.Config{NATSURL: h.NATSURL(), NATSOptions: h.ServiceNATSOptions(), Devices: 3, FetchModel: true,
		Layout: []*pb.TensorSpec{{Name: "w", Shape: []uint64{2, 3}}}, Encoding: pb.UpdateEncoding_UPDATE_ENCODING_INT8, Quantized: enc,
		MaxPublishing: 1}
	lg.Keys = h.EnrollKeys(t, lg.DeviceIDs())
	f, err := simfleet.Start(lg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	done := h.WaitTask(t, task.Id, 60*time.Second, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s (fleet %+v, %s)", done.State, done.StateReason, f.Stats(), f.LastFailure())
	}
	for _, r := range h.Rounds(t, task.Id) {
		if r.State != pb.RoundState_ROUND_STATE_COMMITTED || r.Reported != 3 {
			t.Fatalf("round %d: %v with %d reports: %s", r.Round, r.State, r.Reported, r.Reason)
		}
	}
	f.Stop()
	if st := f.Stats(); st.Reports < 6 || st.Refused != 0 || st.Failures != 0 || st.PeakPublishing != 1 {
		t.Fatalf("stats %+v (want 6 reports or more, none refused, one publishing at a time): %s", st, f.LastFailure())
	}
	_, buf, err := client.ExportModelBytes(t.Context(), h.Models, done.CurrentModel.GetVersion(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	got, err := model.DecodeSafetensors(buf)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range got.Flatten() {
		if v < 0.999 || v > 1.001 {
			t.Fatalf("value %d is %v after two rounds of +0.5", i, v)
		}
	}
}
