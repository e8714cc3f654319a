package server_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/model/train"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// TestAuditWiring: mutating API calls land in the server's audit log as
// operator actions, each new checkpoint is published on NATS, and Shutdown
// (twice) leaves a closed log whose final checkpoint covers every entry.
func TestAuditWiring(t *testing.T) {
	h := servertest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	nc, err := nats.Connect(h.NATSURL(), h.ServiceNATSOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	notes := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(wire.SubjectAuditCheckpoint, notes)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	init, _ := train.InitMLP([]int{8, 3}, 1)
	version := h.ImportModel(t, "audited", init)
	module := h.RegisterModule(t, "softmax", wasmtest.Build(t, wasmtest.Softmax))
	task := h.CreateTask(t, baseTask("audited", version, module, 1))
	if _, err := h.Tasks.StopTask(ctx, &pb.StopTaskRequest{TaskId: task.Id, Reason: "test"}); err != nil {
		t.Fatal(err)
	}

	c := apiv1.NewAuditServiceClient(h.Conn)
	keys, err := c.GetPublicKeys(ctx, &pb.GetPublicKeysRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// Published checkpoints only grow; wait for one covering the four calls.
	var last uint64
	for seen := 0; last < 4; seen++ {
		select {
		case m := <-notes:
			cp, err := audit.ParseCheckpoint(m.Data, keys.GetCheckpointVerifierKey())
			if err != nil {
				t.Fatal(err)
			}
			if seen > 0 && cp.Size <= last {
				t.Fatalf("published checkpoint of size %d after %d", cp.Size, last)
			}
			last = cp.Size
		case <-ctx.Done():
			t.Fatalf("no published checkpoint covers 4 entries; last %d", last)
		}
	}

	res, err := c.QueryEntries(ctx, &pb.QueryEntriesRequest{Filter: &pb.AuditFilter{TaskId: task.Id,
		EventType: string(audit.TypeOperatorAction)}})
	if err != nil {
		t.Fatal(err)
	}
	entryKey, err := audit.ParseJWKS(keys.GetEntryJwks())
	if err != nil {
		t.Fatal(err)
	}
	var methods []string
	for _, pe := range res.GetEntries() {
		ev, err := audit.VerifyEntry(audit.Entry{Index: pe.GetIndex(), Data: pe.GetJws()}, entryKey)
		if err != nil {
			t.Fatal(err)
		}
		p, err := ev.DecodePayload()
		if err != nil {
			t.Fatal(err)
		}
		a := p.(audit.OperatorAction)
		if a.Result != audit.ResultOK || a.Task != task.Id || ev.Actor.Kind != audit.ActorOperator {
			t.Errorf("action %+v by %v", a, ev.Actor)
		}
		methods = append(methods, a.Method)
	}
	if len(methods) != 2 || methods[0] != "fleetlearn.api.v1.TaskService/CreateTask" || methods[1] != "fleetlearn.api.v1.TaskService/StopTask" {
		t.Fatalf("actions on the task: %v", methods)
	}

	if err := h.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.Shutdown(ctx); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
	lg, err := audit.OpenReadOnly(ctx, h.Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer lg.Close()
	cp, err := lg.Latest(ctx)
	if err != nil || cp.Size != lg.Size() || cp.Size < 4 {
		t.Fatalf("final checkpoint %d of %d entries: %v", cp.Size, lg.Size(), err)
	}
	var export bytes.Buffer
	if err := lg.Export(ctx, &export); err != nil {
		t.Fatal(err)
	}
	if _, err := audit.VerifyExport(&export, audit.WithEntryKey(entryKey),
		audit.WithVerifierKey(keys.GetCheckpointVerifierKey())); err != nil {
		t.Fatal(err)
	}
}
