package edgecmd

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/edge"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm"
)

// execute runs the command line with agent standing in for the agent and
// returns the exit status and output.
func execute(t *testing.T, agent agentFunc, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(t.Context(), args, strings.NewReader(stdin), &out, &errOut, agent)
	return code, out.String(), errOut.String()
}

// noAgent fails a test that should not get as far as running the agent.
func noAgent(t *testing.T) agentFunc {
	return func(context.Context, edge.Config, process, *slog.Logger) error {
		t.Error("the agent ran")
		return nil
	}
}

func TestVersion(t *testing.T) {
	want := wasm.ABIRange()
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		code, out, errOut := execute(t, noAgent(t), "", args...)
		if code != 0 || errOut != "" {
			t.Fatalf("%v: exit %d, stderr %q", args, code, errOut)
		}
		if !strings.HasPrefix(out, "fleetlearn-edge ") || !strings.HasSuffix(out, want+"\n") || strings.Count(out, "\n") != 1 {
			t.Errorf("%v printed %q, want one line: fleetlearn-edge VERSION, ..., %s", args, out, want)
		}
		// The commit (or "commit unknown") and the engine the device
		// trains with, by name.
		if !strings.Contains(out, ", commit ") || !strings.Contains(out, ", wasm "+wasm.Engine()+", ") {
			t.Errorf("%v printed %q, want the commit and \"wasm %s\"", args, out, wasm.Engine())
		}
	}
}

// TestHelp: every command's help exits 0 and names the files as the server
// writes them.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-help"}, {"enroll", "--help"}, {"enroll", "-h"}, {"help", "enroll"}} {
		code, out, _ := execute(t, noAgent(t), "", args...)
		if code != 0 {
			t.Errorf("%v: exit %d", args, code)
		}
		if !strings.Contains(out, "tls/ca.crt") || strings.Contains(out, "tls/ca.pem") || !strings.Contains(out, "Examples:") {
			t.Errorf("%v: help does not name the server's tls/ca.crt or has no examples:\n%s", args, out)
		}
	}
}

// TestFlags: flags keep the single-dash spellings of earlier releases, and
// reach the agent's configuration.
func TestFlags(t *testing.T) {
	var got edge.Config
	var procs int
	agent := func(_ context.Context, cfg edge.Config, p process, _ *slog.Logger) error {
		got, procs = cfg, p.procs
		return nil
	}
	code, _, errOut := execute(t, agent, "", "-data-dir", "state", "-dataset=data", "-tasks", "t-1,t-2", "-charging=false",
		"-nats-url", "nats://agg:4222", "--max-procs", "2", "-device-class", "gw", "-wasm-engine", wasm.EngineInterpreter)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if got.DataDir != "state" || got.DatasetDir != "data" || !slices.Equal(got.TaskIDs, []string{"t-1", "t-2"}) || got.Charging ||
		!got.Idle || got.NATSURL != "nats://agg:4222" || got.DeviceClass != "gw" || procs != 2 ||
		got.WASMEngine != wasm.EngineInterpreter {
		t.Errorf("config %+v, procs %d", got, procs)
	}
	// An engine this machine does not run is the command line's fault, and
	// the error lists the ones it does.
	if code, _, errOut := execute(t, noAgent(t), "", "--dataset", "d", "--wasm-engine", "jit"); code != exitUsage ||
		!strings.Contains(errOut, "--wasm-engine \"jit\": this machine runs "+strings.Join(wasm.Engines(), ", ")) {
		t.Errorf("--wasm-engine jit: exit %d, stderr %q; want a usage error listing the engines", code, errOut)
	}

	for _, args := range [][]string{{}, {"-dataset"}, {"--dataset", "d", "--log-level", "loud"}, {"--dataset", "d", "--bogus"}, {"bogus"}} {
		if code, _, errOut := execute(t, noAgent(t), "", args...); code != exitUsage || !strings.Contains(errOut, "fleetlearn-edge: ") {
			t.Errorf("%q: exit %d, stderr %q; want a usage error", args, code, errOut)
		}
	}
	// enroll reads its flags the same way: here the CA file it names is missing.
	tok := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tok, []byte("t\n"), 0o600)
	code, _, errOut = execute(t, noAgent(t), "", "enroll", "-api", "127.0.0.1:1", "-ca=/nonexistent/ca.crt", "-token-file", tok)
	if code != exitError || !strings.Contains(errOut, "enroll: --ca: open /nonexistent/ca.crt") {
		t.Errorf("enroll with a missing CA: exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut := execute(t, noAgent(t), "", "enroll", "--api", "h:7070", "--ca", "ca.crt"); code != exitUsage ||
		!strings.Contains(errOut, "--token-file") {
		t.Errorf("enroll without a token: exit %d, stderr %q", code, errOut)
	}
}

// TestNotEnrolled: the agent without credentials exits at once with the
// enroll command to run, and leaves its data directory alone.
func TestNotEnrolled(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state dir")
	code, _, errOut := execute(t, runAgent, "", "--dataset", t.TempDir(), "--data-dir", dir)
	if code != exitOperator {
		t.Errorf("exit %d, want %d", code, exitOperator)
	}
	hint := "fleetlearn-edge enroll --api HOST:7070 --ca ca.crt --token-file FILE --data-dir '" + dir + "'"
	if !strings.HasPrefix(errOut, "fleetlearn-edge: not enrolled: ") || !strings.Contains(errOut, hint) {
		t.Errorf("stderr %q, want the enroll command %q", errOut, hint)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the data directory was created: %v", err)
	}
}

// TestEnrollAndRevoke runs the commands as an operator's device would: the
// enrollment succeeds once; the used token is refused in one line that says
// what to do, leaving the new data directory absent; the agent of a revoked
// device stops with exit status 3 and says so.
func TestEnrollAndRevoke(t *testing.T) {
	h := servertest.New(t)
	work := t.TempDir()
	ca, tok := filepath.Join(work, "ca.crt"), filepath.Join(work, "token")
	res, err := h.Devices.CreateEnrollmentToken(t.Context(), &pb.CreateEnrollmentTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(ca, h.CACertPEM(), 0o600)
	os.WriteFile(tok, []byte(res.GetToken()+"\n"), 0o600)

	dir := filepath.Join(work, "edge")
	code, out, errOut := execute(t, noAgent(t), "", "enroll", "--api", h.GRPCAddr(), "--ca", ca, "--token-file", tok,
		"--data-dir", dir, "--device-id", "dev-1")
	if code != 0 || !strings.HasPrefix(out, "enrolled as dev-1 ") {
		t.Fatalf("enroll: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	again := filepath.Join(work, "again")
	code, _, errOut = execute(t, noAgent(t), res.GetToken(), "enroll", "--api", h.GRPCAddr(), "--ca", ca, "--token-file", "-",
		"--data-dir", again)
	want := "fleetlearn-edge: enroll: enrollment token refused: it was already used; ask the operator for a new one ('fleetlearn device token')\n"
	if code != exitOperator || errOut != want {
		t.Errorf("enroll with a used token: exit %d, stderr\n%q, want\n%q", code, errOut, want)
	}
	if _, err := os.Stat(again); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed enrollment created %s: %v", again, err)
	}

	if _, err := h.Devices.RevokeDevice(t.Context(), &pb.RevokeDeviceRequest{DeviceId: "dev-1", Reason: "lost"}); err != nil {
		t.Fatal(err)
	}
	dataset := filepath.Join(work, "dataset")
	if err := data.WriteDir(dataset, &data.Dataset{Dim: 1, NumClasses: 2, Features: []float32{0, 1}, Labels: []uint8{0, 1}}, "dev"); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = execute(t, runAgent, "", "--dataset", dataset, "--data-dir", dir, "--log-level", "error")
	if code != exitOperator || !strings.HasPrefix(errOut, "fleetlearn-edge: revoked by the operator") ||
		!strings.Contains(errOut, "fleetlearn device list --all") || strings.Contains(errOut, "on connection [") {
		t.Errorf("agent of a revoked device: exit %d, stderr %q", code, errOut)
	}
}
