package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/internal/tracing"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/train"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// tracedRound runs a task of one plaintext round on a server and n agents
// that share tp, and returns the task once it completed and the agents
// stopped.
func tracedRound(t *testing.T, tp trace.TracerProvider, n int) *pb.Task {
	t.Helper()
	h := servertest.NewWith(t, []server.Option{server.WithTracerProvider(tp)})
	init, _ := train.InitMLP([]int{8, 3}, 1)
	version := h.ImportModel(t, "synthetic", init)
	module := h.RegisterModule(t, "softmax", wasmtest.Build(t, wasmtest.Softmax))
	f := startFleet(t, h, n, func(i int) *data.Dataset { return datatest.Synthetic(64, 8, 3, uint64(i+1)) }, edge.WithTracerProvider(tp))
	spec := baseTask("traced", version, module, 1)
	spec.CohortTarget, spec.OverSelection, spec.ReportGoal = uint32(n), 0, uint32(n)
	task := h.CreateTask(t, spec)
	done := h.WaitTask(t, task.Id, 60*time.Second, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", done.State, done.StateReason)
	}
	f.stop()
	return task
}

// TestRoundTraceFile: --trace-file's exporter (tracing.Setup with a File)
// writes the round's spans as JSON lines, server's and devices', all of
// one trace.
func TestRoundTraceFile(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a second traced round")
	}
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	tp, flush, err := tracing.Setup(context.Background(), tracing.Config{ServiceName: "fleetlearn-test", File: path})
	if err != nil {
		t.Fatal(err)
	}
	tracedRound(t, tp, 2)
	if err := flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	names, traces := map[string]int{}, map[string]bool{}
	for line := range bytes.Lines(b) {
		var span struct {
			Name        string
			SpanContext struct{ TraceID string }
		}
		if err := json.Unmarshal(line, &span); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		names[span.Name]++
		traces[span.SpanContext.TraceID] = true
	}
	for _, name := range []string{"round", "selection", "checkin", "training", "upload", "validation", "aggregation", "commit", "audit"} {
		if names[name] == 0 {
			t.Errorf("no %q span in the file (spans: %v)", name, names)
		}
	}
	if len(traces) != 1 {
		t.Errorf("spans of %d traces, want one", len(traces))
	}
}

// TestRoundIsOneTrace: with a tracer provider shared by the server and
// three agents, a committed round is one trace holding the server's spans
// (round, selection, validation, aggregation, commit, audit) and every
// device's (checkin, training, upload); each validation links the upload
// of the report it checked.
func TestRoundIsOneTrace(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	const devices = 3
	task := tracedRound(t, tp, devices)

	spans := exp.GetSpans()
	var root *tracetest.SpanStub
	for i, s := range spans {
		if s.Name == "round" {
			if root != nil {
				t.Fatalf("two round spans: %v and %v", root.SpanContext.TraceID(), s.SpanContext.TraceID())
			}
			root = &spans[i]
		}
	}
	if root == nil {
		t.Fatalf("no round span among %d spans", len(spans))
	}
	id := root.SpanContext.TraceID()
	attrs := func(s tracetest.SpanStub) map[string]string {
		m := map[string]string{}
		for _, kv := range s.Attributes {
			m[string(kv.Key)] = kv.Value.Emit()
		}
		return m
	}
	if a := attrs(*root); a[string(tracing.AttrTask)] != task.Id || a[string(tracing.AttrRound)] != "1" ||
		a[string(tracing.AttrKind)] != "train" || a["fleetlearn.round.outcome"] != "committed" {
		t.Fatalf("round span attributes %v", a)
	}
	count := map[string]int{}
	byDevice := map[string]map[string]bool{}
	uploads := map[string]bool{} // span ids
	for _, s := range spans {
		if s.SpanContext.TraceID() != id {
			t.Errorf("span %q in trace %v, not the round's %v", s.Name, s.SpanContext.TraceID(), id)
			continue
		}
		count[s.Name]++
		switch s.Name {
		case "checkin", "training", "upload":
			a := attrs(s)
			dev := a[string(tracing.AttrDevice)]
			if dev == "" || a[string(tracing.AttrTask)] != task.Id || a[string(tracing.AttrRound)] != "1" {
				t.Errorf("%s span attributes %v", s.Name, a)
			}
			if byDevice[dev] == nil {
				byDevice[dev] = map[string]bool{}
			}
			byDevice[dev][s.Name] = true
			if s.Name == "checkin" && s.Parent.SpanID() != root.SpanContext.SpanID() {
				t.Errorf("checkin of %s is not a child of the round span", dev)
			}
			if s.Name == "upload" {
				uploads[s.SpanContext.SpanID().String()] = true
			}
		}
	}
	for _, name := range []string{"round", "selection", "checkin", "training", "upload", "validation", "aggregation", "commit", "audit"} {
		if count[name] == 0 {
			t.Errorf("no %q span in the round's trace (spans: %v)", name, count)
		}
	}
	if len(byDevice) != devices {
		t.Errorf("device spans of %d devices, want %d: %v", len(byDevice), devices, byDevice)
	}
	for dev, names := range byDevice {
		if !names["checkin"] || !names["training"] || !names["upload"] {
			t.Errorf("device %s has spans %v, want checkin, training and upload", dev, names)
		}
	}
	linked := 0
	for _, s := range spans {
		if s.Name != "validation" {
			continue
		}
		if s.Parent.SpanID() != root.SpanContext.SpanID() {
			t.Errorf("validation span is not a child of the round span")
		}
		for _, l := range s.Links {
			if uploads[l.SpanContext.SpanID().String()] {
				linked++
			}
		}
	}
	if linked != devices {
		t.Errorf("%d validation spans link an upload, want %d", linked, devices)
	}
}

// TestSecureRoundTrace: a SecAgg+ round's aggregation span holds an event
// per closed stage, and the devices' spans are in the round's trace.
func TestSecureRoundTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a secure aggregation round through its stages")
	}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	h := servertest.NewWith(t, []server.Option{server.WithTracerProvider(tp)})
	base, err := model.New(model.Tensor{Name: "w", Shape: []int{4, 5}, Data: make([]float32, 20)},
		model.Tensor{Name: "b", Shape: []int{5}, Data: []float32{1, 2, 3, 4, 5}})
	if err != nil {
		t.Fatal(err)
	}
	version := h.ImportModel(t, "secure", base)
	module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
	const devices = 4
	f := startFleet(t, h, devices, func(i int) *data.Dataset { return datatest.Synthetic(20, 4, 2, uint64(i+1)) }, edge.WithTracerProvider(tp))
	task := h.CreateTask(t, &pb.Task{Name: "secure-traced", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
		CohortTarget: devices, ReportGoal: 3, RoundsTotal: 1, SelectionTimeout: durationpb.New(10 * time.Second),
		ReportTimeout: durationpb.New(20 * time.Second),
		Secagg:        &pb.SecAggConfig{ClipRange: 0.01, MaxWeight: 1, StageTimeout: durationpb.New(2500 * time.Millisecond)}})
	done := h.WaitTask(t, task.Id, 90*time.Second, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", done.State, done.StateReason)
	}
	f.stop()
	traces := map[string]bool{}
	var stages []string
	names := map[string]int{}
	for _, s := range exp.GetSpans() {
		traces[s.SpanContext.TraceID().String()] = true
		names[s.Name]++
		if s.Name != "aggregation" {
			continue
		}
		for _, ev := range s.Events {
			for _, kv := range ev.Attributes {
				if kv.Key == "fleetlearn.secagg.stage" {
					stages = append(stages, kv.Value.AsString())
				}
			}
		}
	}
	if len(traces) != 1 {
		t.Errorf("spans in %d traces, want one", len(traces))
	}
	for _, name := range []string{"round", "selection", "checkin", "training", "upload", "validation", "aggregation", "commit", "audit"} {
		if names[name] == 0 {
			t.Errorf("no %q span (spans: %v)", name, names)
		}
	}
	if len(stages) < 4 {
		t.Errorf("aggregation span has stage events %v, want one per SecAgg+ stage", stages)
	}
}
