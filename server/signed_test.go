package server_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/edge"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/model"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// enrollDir enrolls a device with id through the enrollment service, as
// `fleetlearn-edge enroll` does, and returns its agent data directory.
func enrollDir(t testing.TB, h *servertest.Harness, id string) string {
	t.Helper()
	tok, err := h.Devices.CreateEnrollmentToken(context.Background(), &pb.CreateEnrollmentTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := edge.Enroll(context.Background(), edge.EnrollConfig{API: h.GRPCAddr(), CAPEM: h.CACertPEM(),
		Token: tok.GetToken(), DataDir: dir, DeviceID: id}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// enroll enrolls a device and returns its agent data directory and key.
func enroll(t testing.TB, h *servertest.Harness, id string) (string, *identity.UserKey) {
	t.Helper()
	dir := enrollDir(t, h, id)
	key, err := identity.LoadOrCreateUserKey(filepath.Join(dir, edge.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	return dir, key
}

func signed(t testing.TB, key *identity.UserKey, r *pb.UpdateReport) *pb.UpdateReport {
	t.Helper()
	sig, err := identity.SignReport(key.PrivateKey(), identity.UpdateStatement(r))
	if err != nil {
		t.Fatal(err)
	}
	r.Signature, r.KeyId = sig, key.ID()
	return r
}

// TestSignedReports: an enrolled device's reports must carry its signature
// over what they claim; unsigned, forged and altered reports are refused
// while the round goes on and commits the genuine one; a revoked device is
// not selected again; enrolled agents sign their reports themselves.
func TestSignedReports(t *testing.T) {
	h := servertest.New(t, servertest.WithPace(50*time.Millisecond))
	base, err := model.New(model.Tensor{Name: "w", Shape: []int{2, 3}, Data: make([]float32, 6)})
	if err != nil {
		t.Fatal(err)
	}
	version := h.ImportModel(t, "signed", base)
	module := h.RegisterModule(t, "trivial", wasmtest.Trivial())
	dirB, _ := enroll(t, h, "dev-b")
	_, other := enroll(t, h, "dev-other")

	task := h.CreateTask(t, &pb.Task{Name: "signed", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
		CohortTarget: 2, ReportGoal: 2, RoundsTotal: 2, SelectionTimeout: durationpb.New(20 * time.Second),
		ReportTimeout: durationpb.New(30 * time.Second)})
	d := newScripted(t, h, "dev-a")
	keyA, err := identity.LoadOrCreateUserKey(filepath.Join(d.dir, edge.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	plan := d.join(t, task.Id, 1)
	subj := wire.ReportSubject(task.Id, 1, "dev-a")
	rep := func() *pb.UpdateReport { return rogueUpdate(plan, "dev-a", base, 0.25, 10) }

	d.refused(t, subj, mustMarshal(t, rep()), task.Id, 1, "not signed")
	d.refused(t, subj, mustMarshal(t, signed(t, other, rep())), task.Id, 1, "does not verify")
	altered := signed(t, keyA, rep())
	altered.NumExamples = 200 // a weight the device did not sign
	d.refused(t, subj, mustMarshal(t, altered), task.Id, 1, "does not verify")
	d.accepted(t, subj, mustMarshal(t, signed(t, keyA, rep())))
	d.refused(t, subj, mustMarshal(t, signed(t, keyA, rep())), task.Id, 1, "already reported")

	// dev-b, an enrolled agent, signs its own report and completes the round.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agent, err := edge.New(edge.Config{NATSURL: h.NATSURL(), DataDir: dirB, DeviceID: "dev-b"},
		edge.WithDataset(datatest.Synthetic(20, 4, 2, 1)), edge.WithSandbox(sharedSandbox(t)))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); agent.Run(ctx) }()
	defer func() { cancel(); <-done }()
	end := time.Now().Add(30 * time.Second)
	for {
		rs := h.Rounds(t, task.Id)
		if len(rs) > 0 && rs[0].State == pb.RoundState_ROUND_STATE_COMMITTED {
			if rs[0].Reported != 2 {
				t.Fatalf("round 1 committed with %d reports", rs[0].Reported)
			}
			break
		}
		if time.Now().After(end) {
			t.Fatalf("round 1 did not commit: %+v (agent %+v, %s)", rs, agent.Stats(), agent.LastRefusal())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st := agent.Stats(); st.Refused != 0 {
		t.Fatalf("the agent's report was refused: %s", agent.LastRefusal())
	}

	// Revoked: dev-a's live NATS connection is cut, it cannot connect
	// again, and the coordinator would not select it.
	if _, err := h.Devices.RevokeDevice(t.Context(), &pb.RevokeDeviceRequest{DeviceId: "dev-a", Reason: "lost"}); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(10 * time.Second); !d.nc.IsClosed(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("revoked device still connected: %v", d.nc.Status())
		}
	}
	if _, err := nats.Connect(h.NATSURL(), nats.UserCredentials(filepath.Join(d.dir, edge.CredsFile)),
		nats.CustomInboxPrefix(identity.DeviceInboxPrefix("dev-a"))); err == nil {
		t.Fatal("a revoked device connected again")
	}
}
