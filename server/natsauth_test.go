package server_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/fleetlearn/fleetlearn/internal/natstest"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
)

// TestExternalNATSCluster: the resolver configuration the server writes
// makes a separate nats-server trust its operator; an aggregator pointed at
// that server (--nats-url, same data directory) connects as its service
// user, and enrolled agents complete a round through it.
func TestExternalNATSCluster(t *testing.T) {
	dataDir := t.TempDir()
	conf := filepath.Join(t.TempDir(), "fleetlearn.conf")
	if err := server.WriteNATSResolverConfig(context.Background(), dataDir, filepath.Join(t.TempDir(), "jwt"), conf); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := natsserver.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server rejects the configuration: %v\n%s", err, b)
	}
	opts.Host, opts.Port, opts.JetStream, opts.StoreDir, opts.NoSigs = "127.0.0.1", -1, true, t.TempDir(), true
	opts.MaxPayload = 8 << 20
	ns := natstest.Run(t, opts)

	h := servertest.New(t, servertest.WithDataDir(dataDir), func(c *server.Config) { c.NATSURL = ns.ClientURL() })
	task := trivialTask(t, h, 2)
	runAgent(t, h, "ext-a")
	runAgent(t, h, "ext-b")
	done := h.WaitTask(t, task.Id, 30*time.Second, pb.TaskState_TASK_STATE_COMPLETED, pb.TaskState_TASK_STATE_FAILED)
	if done.State != pb.TaskState_TASK_STATE_COMPLETED {
		t.Fatalf("task %v: %s", done.State, done.StateReason)
	}
}
