package api_test

import (
	"bytes"
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/cli"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/api"
	"github.com/fleetlearn/fleetlearn/server/internal/api/apitest"
)

// TestCLIAgainstAPI drives the operator CLI against this package's API over
// TCP, so that the two sides agree on chunking, digests and messages.
func TestCLIAgainstAPI(t *testing.T) {
	b := apitest.New()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	api.Register(s, b)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	addr := lis.Addr().String()
	dir := t.TempDir()
	run := func(args ...string) (string, error) {
		root := cli.NewRootCommand(cli.WithGetenv(func(string) string { return "" }), cli.WithTerminal(false))
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		// --timeout 0: no per-command deadline that a loaded machine could
		// miss; a hang ends with the test binary's timeout.
		root.SetArgs(append([]string{"--server", addr, "--insecure", "--timeout", "0"}, args...))
		err := root.ExecuteContext(t.Context())
		return out.String(), err
	}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	code := append([]byte("\x00asm\x01\x00\x00\x00"), make([]byte, 3<<20)...)
	out, err := run("module", "register", write("m.wasm", code), "--name", "mlp")
	if err != nil || out != sha(code)+"\n" {
		t.Fatalf("module register = %q, %v", out, err)
	}

	header := `{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`
	model := append(binary.LittleEndian.AppendUint64(nil, uint64(len(header))), header...)
	model = append(model, pattern(2*api.ChunkBytes+5)...)
	out, err = run("model", "import", write("m.safetensors", model), "--name", "mnist")
	// The version is the first line, alone; what follows on standard
	// error says which hash is which.
	if err != nil || !strings.HasPrefix(out, "mnist@1\n") {
		t.Fatalf("model import = %q, %v", out, err)
	}
	out, err = run("model", "export", "mnist@1", "-o", filepath.Join(dir, "back.safetensors"))
	if err != nil {
		t.Fatalf("model export = %q, %v", out, err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "back.safetensors")); !bytes.Equal(got, model) {
		t.Fatal("exported model differs from the imported one")
	}

	out, err = run("task", "create", "--name", "ft", "--model", "mnist@1", "--module", sha(code), "--rounds", "2",
		"--hyper", `{"lr":0.1}`)
	if err != nil || !strings.HasPrefix(out, "ID") || !strings.Contains(out, "task-1") {
		t.Fatalf("task create = %q, %v", out, err)
	}

	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := run("task", "watch", "task-1")
		done <- result{out, err}
	}()
	if err := b.WaitWatchers(t.Context(), "task-1", 1); err != nil {
		t.Fatal(err)
	}
	b.Publish(&pb.RoundEvent{TaskId: "task-1", Round: 1, Kind: pb.RoundKind_ROUND_KIND_TRAIN,
		Type: pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED, Assigned: 10, Reported: 9, Dropped: 1,
		Metrics: &pb.Metrics{Values: map[string]float64{"accuracy": 0.5}}})
	if err := b.SetTaskState("task-1", pb.TaskState_TASK_STATE_COMPLETED, ""); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || !strings.Contains(r.out, "round 1 train 1/2 committed [##########----------] 9/10 reported, 1 dropped  accuracy=0.5") ||
		!strings.Contains(r.out, "task task-1 completed after 1/2 training rounds") {
		t.Fatalf("task watch = %q, %v", r.out, r.err)
	}

	_, err = run("task", "get", "nope")
	if status.Code(err) != codes.NotFound || err.Error() != `get task: task "nope": not found` {
		t.Errorf("task get nope: %v", err)
	}
	_, err = run("task", "stop", "task-1")
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("stopping a completed task: %v", err)
	}
}
