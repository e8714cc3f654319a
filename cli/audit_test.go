package cli_test

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/cli"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/servertest"
)

// auditServer starts a real server and makes it record n operator actions
// (refused StopTask calls), waiting until a checkpoint covers them.
func auditServer(t *testing.T, n int) (*servertest.Harness, apiv1.AuditServiceClient) {
	t.Helper()
	h := servertest.New(t)
	// No deadline of its own: the checkpointer runs on the server's
	// schedule, which a loaded machine stretches; a hang ends with the test
	// binary's timeout.
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
		res, err := c.GetCheckpoint(ctx, &pb.GetCheckpointRequest{})
		if err == nil {
			cp, err := audit.ParseCheckpoint(res.GetCheckpoint().GetNote(), keys.GetCheckpointVerifierKey())
			if err != nil {
				t.Fatal(err)
			}
			if cp.Size >= uint64(n) {
				return h, c
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no checkpoint covers %d entries: %v", n, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func TestAuditQuery(t *testing.T) {
	h, _ := auditServer(t, 3)

	out, err := runServer(t, h, "audit", "query")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "INDEX") || !strings.Contains(lines[3], "operator.action") ||
		!strings.Contains(lines[1], "operator:admin") || !strings.Contains(lines[1], "no-such-task") {
		t.Fatalf("table:\n%s", out)
	}

	out, err = runServer(t, h, "audit", "query", "--json", "--type", "operator.action", "--task", "no-such-task", "--limit", "2")
	if err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("--limit 2 printed %d lines:\n%s", len(lines), out)
	}
	for i, l := range lines {
		var rec struct {
			Index    uint64 `json:"index"`
			LeafHash string `json:"leaf_hash"`
			Event    struct {
				Type    string `json:"type"`
				Payload struct {
					Code string `json:"code"`
				} `json:"payload"`
			} `json:"event"`
		}
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Index != uint64(i) || len(rec.LeafHash) != 64 || rec.Event.Type != "operator.action" || rec.Event.Payload.Code != "NOT_FOUND" {
			t.Errorf("line %d = %s", i, l)
		}
	}

	for _, args := range [][]string{
		{"--filter", "type=task.created"},
		{"--actor", "service:coordinator"},
		{"--since", "2999-01-01"},
	} {
		out, err = runServer(t, h, append([]string{"audit", "query"}, args...)...)
		if err != nil || strings.Count(out, "\n") != 1 {
			t.Errorf("query %v = %q, %v; want the header only", args, out, err)
		}
	}
}

func TestAuditQueryRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--filter", "task=t-1", "--task", "t-2"},
		{"--filter", "colour=red"},
		{"--filter", `task="unterminated`},
		{"--type", "Not A Type"},
		{"--round", "0", "--filter", "round=x"},
		{"--since", "yesterday"},
		{"--since", "2026-02-01", "--until", "2026-01-01"},
		{"--limit", "-1"},
	} {
		_, err := run(t, "127.0.0.1:1", append([]string{"audit", "query"}, args...)...)
		if err == nil || strings.Contains(err.Error(), "unavailable") {
			t.Errorf("query %v: err = %v, want a usage error before any call", args, err)
		}
	}
}

func TestAuditExportAndVerify(t *testing.T) {
	h, c := auditServer(t, 4)
	dir := t.TempDir()
	keys, err := c.GetPublicKeys(t.Context(), &pb.GetPublicKeysRequest{})
	if err != nil {
		t.Fatal(err)
	}
	jwks := filepath.Join(dir, "keys.jwks")
	if err := os.WriteFile(jwks, keys.GetEntryJwks(), 0o600); err != nil {
		t.Fatal(err)
	}
	note, err := runServer(t, h, "audit", "checkpoint")
	if err != nil || !strings.HasPrefix(note, audit.DefaultOrigin+"\n") {
		t.Fatalf("checkpoint = %q, %v", note, err)
	}
	trusted := filepath.Join(dir, "trusted.checkpoint")
	if err := os.WriteFile(trusted, []byte(note), 0o600); err != nil {
		t.Fatal(err)
	}

	export := filepath.Join(dir, "audit.jsonl")
	if out, err := runServer(t, h, "audit", "export", "-o", export); err != nil || out != "wrote "+export+"\n" {
		t.Fatalf("export = %q, %v", out, err)
	}
	out, err := run(t, "", "audit", "verify", export, "--jwks", jwks, "--verifier-key", keys.GetCheckpointVerifierKey(),
		"--trusted-checkpoint", trusted)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"verified:", "export of " + audit.DefaultOrigin, "checkpoints:", "1 checked",
		"trusted:", "1 checkpoints matched", "(pinned)", "operator.action="} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "compare with the published key") {
		t.Errorf("keys reported unpinned:\n%s", out)
	}

	// Without pinned keys the report says so.
	if out, err := run(t, "", "audit", "verify", export); err != nil || !strings.Contains(out, "compare with the published key") {
		t.Errorf("unpinned verify = %q, %v", out, err)
	}

	// One byte changed in entry 1 is caught and named.
	data, err := os.ReadFile(export)
	if err != nil {
		t.Fatal(err)
	}
	tampered := filepath.Join(dir, "tampered.jsonl")
	if err := os.WriteFile(tampered, flipEntryByte(t, data, 1), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = run(t, "", "audit", "verify", tampered, "--jwks", jwks)
	var ve *audit.VerifyError
	if !errors.As(err, &ve) || ve.Index != 1 || !errors.Is(err, audit.ErrTampered) || !strings.Contains(err.Error(), "entry 1") {
		t.Fatalf("tampered export: %v", err)
	}

	// Another log's key does not verify this one.
	other, _, _ := ed25519.GenerateKey(bytes.NewReader(make([]byte, 64)))
	otherJWKS, err := audit.PublicKeys{Origin: "x", Entry: other}.JWKS()
	if err != nil {
		t.Fatal(err)
	}
	wrong := filepath.Join(dir, "other.jwks")
	if err := os.WriteFile(wrong, otherJWKS, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "", "audit", "verify", export, "--jwks", wrong); !errors.Is(err, audit.ErrKeyMismatch) {
		t.Errorf("verify with another key: %v", err)
	}

	// A stopped server's data directory exports and verifies too, with
	// the final checkpoint the server signed on shutdown.
	if _, err := runServer(t, h, "audit", "export", "--data-dir", h.Dir); !errors.Is(err, cli.ErrUsage) {
		t.Errorf("--server with --data-dir: %v", err)
	}
	if err := h.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	offline := filepath.Join(dir, "offline.jsonl")
	if _, err := run(t, "", "audit", "export", "--data-dir", h.Dir, "-o", offline); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, "", "audit", "verify", offline, "--jwks", jwks, "--verifier-key", keys.GetCheckpointVerifierKey(),
		"--trusted-checkpoint", trusted)
	if err != nil || !strings.Contains(out, "1 checkpoints matched") {
		t.Fatalf("offline verify = %q, %v", out, err)
	}

	// The server is gone: the gRPC path reports it.
	if _, err := runServer(t, h, "audit", "export", "-o", filepath.Join(dir, "gone.jsonl")); err == nil ||
		!strings.Contains(err.Error(), "unavailable") {
		t.Errorf("export from a stopped server: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "gone.jsonl")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed export left a file: %v", err)
	}
}

func TestAuditVerifyRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	notJWKS := writeFile(t, "bad.jwks", []byte(`{"keys":[]}`))
	garbage := writeFile(t, "garbage.jsonl", []byte("not an export\n"))
	for _, tc := range []struct {
		args []string
		want error
	}{
		{[]string{filepath.Join(dir, "missing.jsonl")}, cli.ErrInput},
		{[]string{garbage, "--jwks", notJWKS}, cli.ErrInput},
		{[]string{garbage, "--jwks", filepath.Join(dir, "missing.jwks")}, cli.ErrInput},
		{[]string{garbage, "--verifier-key", "not a key"}, cli.ErrUsage},
		{[]string{garbage, "--trusted-checkpoint", filepath.Join(dir, "missing")}, cli.ErrInput},
		{[]string{garbage}, audit.ErrExportFormat},
	} {
		if _, err := run(t, "", append([]string{"audit", "verify"}, tc.args...)...); !errors.Is(err, tc.want) {
			t.Errorf("verify %v: %v, want %v", tc.args, err, tc.want)
		}
	}
	if _, err := run(t, "", "audit", "verify"); err == nil {
		t.Error("verify without a file succeeded")
	}
}

func TestAuditCheckpointUnsupported(t *testing.T) {
	f := newFake()
	_, err := run(t, f.serve(t), "audit", "checkpoint")
	if status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "does not support") {
		t.Fatalf("checkpoint from a server without the audit service: %v", err)
	}
}

// flipEntryByte changes one character in the middle of entry index's JWS.
func flipEntryByte(t *testing.T, export []byte, index int) []byte {
	t.Helper()
	lines := bytes.Split(export, []byte("\n"))
	prefix := []byte(`{"kind":"entry","index":` + strconv.Itoa(index) + `,"jws":"`)
	for i, l := range lines {
		if bytes.HasPrefix(l, prefix) {
			l = bytes.Clone(l)
			p := len(prefix) + 60
			if l[p] == 'A' {
				l[p] = 'B'
			} else {
				l[p] = 'A'
			}
			lines[i] = l
			return bytes.Join(lines, []byte("\n"))
		}
	}
	t.Fatalf("no entry %d in the export", index)
	return nil
}
