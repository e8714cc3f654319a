package cli

// Internal tests: the polling loop runs on a fake clock, which the
// command itself does not take.

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/audit/witness"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
)

// witnessCLI runs the CLI, as the admin of h when h is not nil, and
// returns standard output and error.
func witnessCLI(t *testing.T, h *servertest.Harness, args ...string) (string, string, error) {
	t.Helper()
	root := NewRootCommand(WithGetenv(func(string) string { return "" }), WithTerminal(false))
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	if h != nil {
		args = append([]string{"--server", h.GRPCAddr(), "--ca", server.CAFile(h.Dir), "--token-file", server.AdminTokenPath(h.Dir)}, args...)
	}
	root.SetArgs(append([]string{"--timeout", "0"}, args...))
	err := root.ExecuteContext(t.Context())
	return out.String(), errOut.String(), err
}

func TestWitnessInit(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "witness.key")
	out, _, err := witnessCLI(t, nil, "audit", "witness", "init", "--key", key, "--name", "witness.example/w1")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}
	k, err := audit.ParseWitnessKey(b)
	if err != nil {
		t.Fatal(err)
	}
	if out != k.VerifierKey()+"\n" {
		t.Fatalf("printed %q, want the verifier key %s", out, k.VerifierKey())
	}
	if st, err := os.Stat(key); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, %v", st.Mode(), err)
	}
	if _, _, err := witnessCLI(t, nil, "audit", "witness", "init", "--key", key, "--name", "other"); !errors.Is(err, ErrUsage) {
		t.Fatalf("overwrite: %v", err)
	}
	if again, _ := os.ReadFile(key); !bytes.Equal(again, b) {
		t.Fatal("the key file changed")
	}
	if _, _, err := witnessCLI(t, nil, "audit", "witness", "init", "--key", filepath.Join(dir, "b.key"), "--name", "two words"); !errors.Is(err, ErrUsage) {
		t.Fatalf("bad name: %v", err)
	}
	if _, _, err := witnessCLI(t, nil, "audit", "witness", "--key", key, "--state", dir, "--interval", "0s"); !errors.Is(err, ErrUsage) {
		t.Fatalf("zero interval: %v", err)
	}
}

// TestWitnessLoop drives the polling loop on a fake clock: it waits the
// interval between polls, reports and retries failures, stops at a
// conflict with an alarm and when its context ends.
func TestWitnessLoop(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	polls := make(chan time.Time, 10)
	results := make(chan error, 10)
	poll := func(context.Context) error {
		polls <- clk.Now()
		return <-results
	}
	var errOut syncWriter
	done := make(chan error, 1)
	go func() { done <- witnessLoop(ctx, clk, 10*time.Second, false, &errOut, poll) }()

	start := clk.Now()
	at := <-polls
	results <- nil
	waitTimer(t, clk)
	clk.Advance(10 * time.Second)
	if next := <-polls; next.Sub(at) != 10*time.Second {
		t.Fatalf("second poll %v after the first", next.Sub(at))
	}
	results <- errors.New("server unavailable")
	waitTimer(t, clk)
	if !strings.Contains(errOut.String(), "server unavailable (next poll in 10s)") {
		t.Fatalf("failure not reported: %q", errOut.String())
	}
	clk.Advance(10 * time.Second)
	<-polls
	results <- &witness.ConflictError{Reason: "rollback", Last: audit.Checkpoint{Origin: "o", Size: 9}, Offered: audit.Checkpoint{Origin: "o", Size: 4},
		Evidence: "state/conflict-1.txt"}
	err := <-done
	if !errors.Is(err, audit.ErrInconsistent) {
		t.Fatalf("loop ended with %v", err)
	}
	if clk.Now().Sub(start) != 20*time.Second {
		t.Fatalf("loop took %v of fake time", clk.Now().Sub(start))
	}
	for _, want := range []string{"AUDIT LOG INCONSISTENT: rollback", "size 9", "size 4", "state/conflict-1.txt"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("alarm lacks %q:\n%s", want, errOut.String())
		}
	}

	// Cancelled while waiting: a clean end.
	go func() { done <- witnessLoop(ctx, clk, time.Minute, false, io.Discard, poll) }()
	<-polls
	results <- nil
	waitTimer(t, clk)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("cancelled loop: %v", err)
	}
	// Once: one poll, its error returned.
	boom := errors.New("boom")
	results <- boom
	if err := witnessLoop(t.Context(), clk, time.Minute, true, io.Discard, poll); !errors.Is(err, boom) {
		t.Fatalf("once: %v", err)
	}
	<-polls
}

// waitTimer waits until the loop sleeps on the fake clock.
func waitTimer(t *testing.T, clk *clock.Fake) {
	t.Helper()
	for clk.Pending() == 0 {
		select {
		case <-clk.Changed():
		case <-t.Context().Done():
			t.Fatal("the loop never waited")
		}
	}
}

type syncWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// auditEntries records n operator actions (refused StopTask calls) and
// waits until a checkpoint covers at least want entries.
func auditEntries(t *testing.T, h *servertest.Harness, n int, want uint64) {
	t.Helper()
	ctx := t.Context()
	for range n {
		if _, err := h.Tasks.StopTask(ctx, &pb.StopTaskRequest{TaskId: "no-such-task"}); err == nil {
			t.Fatal("stopped a task that does not exist")
		}
	}
	c := apiv1.NewAuditServiceClient(h.Conn)
	keys, err := c.GetPublicKeys(ctx, &pb.GetPublicKeysRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		// No deadline of its own: the checkpointer runs on the server's
		// one-second ticker, which a loaded machine stretches.
		res, err := c.GetCheckpoint(ctx, &pb.GetCheckpointRequest{})
		if err == nil {
			cp, err := audit.ParseCheckpoint(res.GetCheckpoint().GetNote(), keys.GetCheckpointVerifierKey())
			if err != nil {
				t.Fatal(err)
			}
			if cp.Size >= want {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no checkpoint covers %d entries: %v", want, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// initWitness makes a witness key and returns its file and verifier key.
func initWitness(t *testing.T) (string, string) {
	t.Helper()
	key := filepath.Join(t.TempDir(), "witness.key")
	out, _, err := witnessCLI(t, nil, "audit", "witness", "init", "--key", key, "--name", "witness.example/w1")
	if err != nil {
		t.Fatal(err)
	}
	return key, strings.TrimSpace(out)
}

func cosignedCheckpoint(t *testing.T, h *servertest.Harness, vkey string) (audit.Checkpoint, time.Time, error) {
	t.Helper()
	c := apiv1.NewAuditServiceClient(h.Conn)
	keys, err := c.GetPublicKeys(t.Context(), &pb.GetPublicKeysRequest{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.GetCheckpoint(t.Context(), &pb.GetCheckpointRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return audit.VerifyCosignature(res.GetCheckpoint().GetCosignedNote(), keys.GetCheckpointVerifierKey(), vkey)
}

// TestAuditWitnessFollowsServer: a server that accepts the witness serves
// its cosignatures; the witness follows the log across appends.
func TestAuditWitnessFollowsServer(t *testing.T) {
	key, vkey := initWitness(t)
	h := servertest.New(t, servertest.WithConfig(func(c *server.Config) { c.AuditWitnesses = []string{vkey} }))
	state := filepath.Join(t.TempDir(), "state")
	auditEntries(t, h, 2, 2)
	if _, _, err := cosignedCheckpoint(t, h, vkey); !errors.Is(err, audit.ErrNotCosigned) {
		t.Fatalf("before the witness ran: %v", err)
	}
	out, errOut, err := witnessCLI(t, h, "audit", "witness", "--key", key, "--state", state, "--once")
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	if !strings.Contains(errOut, "pinning the log's verifier key") || !strings.Contains(out, "cosigned fleetlearn/audit at size ") {
		t.Fatalf("first run: %q %q", out, errOut)
	}
	cp1, _, err := cosignedCheckpoint(t, h, vkey)
	if err != nil {
		t.Fatalf("served checkpoint: %v", err)
	}

	auditEntries(t, h, 3, cp1.Size+3)
	out, errOut, err = witnessCLI(t, h, "audit", "witness", "--key", key, "--state", state, "--once")
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	if strings.Contains(errOut, "pinning") {
		t.Fatalf("the second run pinned again: %q", errOut)
	}
	cp2, _, err := cosignedCheckpoint(t, h, vkey)
	if err != nil || cp2.Size < cp1.Size+3 {
		t.Fatalf("served checkpoint after growth: size %d, %v", cp2.Size, err)
	}
	if !strings.Contains(out, "at size "+strconv.FormatUint(cp2.Size, 10)) {
		t.Fatalf("second run: %q", out)
	}
	// The pin from audit keys names the server's witness, so an export
	// verifies with it only while the witness has cosigned what it shows.
	pinFile := filepath.Join(t.TempDir(), "audit.pin")
	if _, _, err := witnessCLI(t, h, "audit", "keys", "-o", pinFile); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(pinFile); err != nil || !strings.Contains(string(b), "witness-vkey: "+vkey+"\n") {
		t.Fatalf("pin file without the witness (%v):\n%s", err, b)
	}
	exp := filepath.Join(t.TempDir(), "audit.jsonl")
	if _, _, err := witnessCLI(t, h, "audit", "export", "--proofs", "-o", exp); err != nil {
		t.Fatal(err)
	}
	if out, _, err := witnessCLI(t, nil, "audit", "verify", exp, "--pin", pinFile, "--witness-checkpoint", state); err != nil ||
		!strings.Contains(out, vkey+" cosigned size") || !strings.Contains(out, "contains the witness's own newest checkpoint, size "+strconv.FormatUint(cp2.Size, 10)) {
		t.Fatalf("verify --pin with the witness = %q, %v", out, err)
	}
	auditEntries(t, h, 1, cp2.Size+1)
	if _, _, err := witnessCLI(t, h, "audit", "export", "-o", exp); err != nil {
		t.Fatal(err)
	}
	if _, _, err := witnessCLI(t, nil, "audit", "verify", exp, "--pin", pinFile, "--witness-checkpoint", filepath.Join(state, witness.CosignedFile)); !errors.Is(err, audit.ErrNotCosigned) {
		t.Fatalf("verify of a checkpoint the witness has not seen: %v", err)
	}
	// The server counted the two cosignatures it accepted.
	res, err := http.Get("http://" + h.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || !bytes.Contains(metrics, []byte(`fleetlearn_audit_cosignatures_total{result="accepted"} 2`)) {
		t.Fatalf("metrics (%v):\n%s", err, metrics)
	}
	// A state for this log refuses --log-key of another.
	other, err := audit.GenerateKeys(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := other.Public("fleetlearn/audit")
	if _, _, err := witnessCLI(t, h, "audit", "witness", "--key", key, "--state", state, "--once", "--log-key", pub.VerifierKey); !errors.Is(err, ErrUsage) {
		t.Fatalf("another log's key: %v", err)
	}
}

// TestAuditWitnessCatchesRollback: the log's data directory is put back to
// an older copy (same keys and origin); the witness that cosigned the newer
// state refuses it loudly, and an auditor verifying with the default flags
// rejects it (checkAuditorSeesRollback).
func TestAuditWitnessCatchesRollback(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three servers")
	}
	key, vkey := initWitness(t)
	withWitness := servertest.WithConfig(func(c *server.Config) { c.AuditWitnesses = []string{vkey} })
	dir := t.TempDir()
	state := filepath.Join(t.TempDir(), "state")
	witnessOnce := func(h *servertest.Harness) (string, string, error) {
		return witnessCLI(t, h, "audit", "witness", "--key", key, "--state", state, "--once")
	}

	h := servertest.New(t, servertest.WithDataDir(dir), withWitness)
	auditEntries(t, h, 2, 2)
	if _, errOut, err := witnessOnce(h); err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	_, first, err := cosignedCheckpoint(t, h, vkey)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(t.TempDir(), "old")
	copyDir(t, dir, old)

	h = servertest.New(t, servertest.WithDataDir(dir), withWitness)
	auditEntries(t, h, 3, 5)
	if _, errOut, err := witnessOnce(h); err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	newer, _, err := cosignedCheckpoint(t, h, vkey)
	if err != nil {
		t.Fatal(err)
	}
	honest := filepath.Join(t.TempDir(), "honest.jsonl")
	if _, _, err := witnessCLI(t, h, "audit", "export", "-o", honest); err != nil {
		t.Fatal(err)
	}
	if err := h.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}

	rolled := servertest.New(t, servertest.WithDataDir(old), withWitness)
	out, errOut, err := witnessOnce(rolled)
	var conflict *witness.ConflictError
	if !errors.Is(err, audit.ErrInconsistent) || !errors.As(err, &conflict) || conflict.Reason != "rollback" {
		t.Fatalf("rolled-back log: %v\n%s%s", err, out, errOut)
	}
	if conflict.Last.Size != newer.Size || conflict.Last.Root != newer.Root || conflict.Offered.Size >= newer.Size {
		t.Fatalf("conflict between %d and %d, newer is %d", conflict.Last.Size, conflict.Offered.Size, newer.Size)
	}
	for _, want := range []string{"AUDIT LOG INCONSISTENT: rollback", "size " + strconv.FormatUint(newer.Size, 10), conflict.Evidence} {
		if !strings.Contains(errOut, want) {
			t.Errorf("alarm lacks %q:\n%s", want, errOut)
		}
	}
	evidence, err := os.ReadFile(conflict.Evidence)
	if err != nil || !bytes.Contains(evidence, conflict.Last.Note) || !bytes.Contains(evidence, conflict.Offered.Note) {
		t.Fatalf("evidence %s: %v\n%s", conflict.Evidence, err, evidence)
	}
	// The rolled-back log still serves the cosignature the witness made
	// back then, and no newer one.
	if _, at, err := cosignedCheckpoint(t, rolled, vkey); err != nil || !at.Equal(first) {
		t.Fatalf("rolled-back checkpoint served with a cosignature of %v (the old one is of %v): %v", at, first, err)
	}
	checkAuditorSeesRollback(t, rolled, vkey, state, honest, newer)
}

// checkAuditorSeesRollback: an auditor exports the rolled-back log and
// verifies it with the default flags. Its cosignature is seconds old, so
// verified offline (the default before) it passes; held to the newest
// checkpoint the witness itself cosigned it fails, naming both sizes,
// while the honest export passes. Grown past what the witness saw, the
// rolled-back log is a fork, and fails as one.
func checkAuditorSeesRollback(t *testing.T, rolled *servertest.Harness, vkey, state, honest string, newer audit.Checkpoint) {
	t.Helper()
	exp := filepath.Join(t.TempDir(), "rolled.jsonl")
	if _, _, err := witnessCLI(t, rolled, "audit", "export", "-o", exp); err != nil {
		t.Fatal(err)
	}
	verify := func(exp string, args ...string) (string, error) {
		out, _, err := witnessCLI(t, nil, append([]string{"audit", "verify", exp, "--witness", vkey}, args...)...)
		return out, err
	}
	if out, err := verify(honest, "--witness-checkpoint", state); err != nil || !strings.Contains(out, "own newest checkpoint, size "+strconv.FormatUint(newer.Size, 10)) {
		t.Fatalf("the honest export: %v\n%s", err, out)
	}
	if out, err := verify(exp, "--witness-offline"); err != nil || !strings.Contains(out, "offline: not held to the witness's own newest checkpoint") {
		t.Fatalf("offline, the rolled-back log is expected to pass (its cosignature is recent): %v\n%s", err, out)
	}
	_, err := verify(exp)
	if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "--witness-checkpoint") || !strings.Contains(err.Error(), "--witness-offline") {
		t.Fatalf("--witness alone: %v", err)
	}
	_, err = verify(exp, "--witness-checkpoint", state)
	var ve *audit.VerifyError
	if !errors.As(err, &ve) || !errors.Is(err, audit.ErrInconsistent) || ve.Index >= int64(newer.Size) ||
		!strings.Contains(err.Error(), "cosigned a checkpoint of size "+strconv.FormatUint(newer.Size, 10)) ||
		!strings.Contains(err.Error(), "this log has only "+strconv.FormatInt(ve.Index, 10)+" entries") || !strings.Contains(err.Error(), "rolled back") {
		t.Fatalf("the rolled-back log: %v", err)
	}

	auditEntries(t, rolled, int(newer.Size), newer.Size+1)
	if _, _, err := witnessCLI(t, rolled, "audit", "export", "-o", exp); err != nil {
		t.Fatal(err)
	}
	_, err = verify(exp, "--witness-checkpoint", state)
	if !errors.As(err, &ve) || !errors.Is(err, audit.ErrInconsistent) || ve.Index != int64(newer.Size) || !strings.Contains(err.Error(), "fork") {
		t.Fatalf("the forked log: %v", err)
	}
}

// copyDir copies a stopped server's data directory, modes included.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, info.Mode().Perm())
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, info.Mode().Perm())
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestAuditVerifyWitnessFlags: a required witness needs its own checkpoint
// or --witness-offline, each of which needs a witness; a state folder the
// witness has not cosigned from yet is reported as such.
func TestAuditVerifyWitnessFlags(t *testing.T) {
	_, vkey := initWitness(t)
	exp := filepath.Join(t.TempDir(), "audit.jsonl")
	if err := os.WriteFile(exp, []byte("not an export\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	cp := filepath.Join(t.TempDir(), "cosigned")
	if err := os.WriteFile(cp, []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want error
		says string
	}{
		{[]string{"--witness", vkey}, ErrUsage, "--witness-offline"},
		{[]string{"--witness-checkpoint", cp}, ErrUsage, "need the witness"},
		{[]string{"--witness-offline"}, ErrUsage, "need the witness"},
		{[]string{"--witness", vkey, "--witness-offline", "--witness-checkpoint", cp}, ErrUsage, "one or the other"},
		{[]string{"--witness", vkey, "--witness-checkpoint", empty}, ErrInput, "cosigned nothing yet"},
		{[]string{"--witness", vkey, "--witness-checkpoint", filepath.Join(empty, "missing")}, ErrInput, "missing"},
		// Past the flags: the file is read as an export.
		{[]string{"--witness", vkey, "--witness-offline"}, audit.ErrExportFormat, "header record"},
		{[]string{"--witness", vkey, "--witness-checkpoint", cp}, audit.ErrExportFormat, "header record"},
	} {
		_, _, err := witnessCLI(t, nil, append([]string{"audit", "verify", exp}, tc.args...)...)
		if !errors.Is(err, tc.want) || !strings.Contains(fmt.Sprint(err), tc.says) {
			t.Errorf("verify %v: %v, want %v saying %q", tc.args, err, tc.want, tc.says)
		}
	}
}
