package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/model"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// runAgent runs an enrolled agent with opts until the test ends.
func runAgent(t *testing.T, h *servertest.Harness, id string, opts ...edge.Option) *edge.Agent {
	t.Helper()
	return runAgentWith(t, h, edge.Config{NATSURL: h.NATSURL(), DataDir: enrollDir(t, h, id), DeviceID: id}, opts...)
}

func runAgentWith(t *testing.T, h *servertest.Harness, cfg edge.Config, opts ...edge.Option) *edge.Agent {
	t.Helper()
	a, err := edge.New(cfg, append([]edge.Option{edge.WithDataset(datatest.Synthetic(20, 4, 2, 1)), edge.WithSandbox(sharedSandbox(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return a
}

func trivialTask(t *testing.T, h *servertest.Harness, cohort uint32) *pb.Task {
	t.Helper()
	base, err := model.New(model.Tensor{Name: "w", Shape: []int{2, 3}, Data: make([]float32, 6)})
	if err != nil {
		t.Fatal(err)
	}
	version := h.ImportModel(t, "trivial", base)
	module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
	return h.CreateTask(t, &pb.Task{Name: "trivial", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
		CohortTarget: cohort, ReportGoal: cohort, RoundsTotal: 1, SelectionTimeout: durationpb.New(20 * time.Second),
		ReportTimeout: durationpb.New(20 * time.Second)})
}

// TestNATSTLS: with --nats-tls the embedded NATS server speaks only TLS
// with the server's CA; enrolled agents learn the tls:// URL and the CA at
// enrollment and complete rounds over it.
func TestNATSTLS(t *testing.T) {
	h := servertest.New(t, func(c *server.Config) { c.NATSTLS = true })
	if !strings.HasPrefix(h.NATSURL(), "tls://") {
		t.Fatalf("NATS URL %q is not tls://", h.NATSURL())
	}
	plain := "nats://" + strings.TrimPrefix(h.NATSURL(), "tls://")
	// The service user's credentials (the last option) without the TLS ones.
	opts := h.ServiceNATSOptions()
	if nc, err := nats.Connect(plain, opts[len(opts)-1:]...); err == nil {
		nc.Close()
		t.Fatal("a client without TLS connected")
	}
	task := trivialTask(t, h, 2)
	a := runAgent(t, h, "tls-a")
	b := runAgent(t, h, "tls-b")
	done := h.WaitTask(t, task.Id, 30*time.Second, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s (agents %+v %+v)", done.State, done.StateReason, a.Stats(), b.Stats())
	}
}

// TestAgentRefusesUntrustedModule: an agent runs only modules signed by a
// publisher it trusts, whatever the server accepted.
func TestAgentRefusesUntrustedModule(t *testing.T) {
	h := servertest.New(t, servertest.WithPace(50*time.Millisecond))
	_, otherJWKS := servertest.NewPublisher(t) // not the publisher that signed the task's module
	task := trivialTask(t, h, 1)
	a := runAgentWith(t, h, edge.Config{NATSURL: h.NATSURL(), DataDir: enrollDir(t, h, "wary"), DeviceID: "wary",
		ModulePublishers: otherJWKS})
	for end := time.Now().Add(20 * time.Second); a.Stats().Failures == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the agent never refused the module: %+v", a.Stats())
		}
	}
	if st := a.Stats(); st.Reports != 0 {
		t.Fatalf("agent reported with an untrusted module: %+v", st)
	}
	if rs := h.Rounds(t, task.Id); len(rs) > 0 && rs[0].Reported != 0 {
		t.Fatalf("round counted a report: %+v", rs[0])
	}
}
