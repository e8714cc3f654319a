package api_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/api"
	"github.com/fleetlearn/fleetlearn/server/internal/api/apitest"
)

// env is one API server on an in-memory listener with clients for it.
type env struct {
	b       *apitest.Backend
	logs    *syncBuffer
	conn    *grpc.ClientConn
	tasks   apiv1.TaskServiceClient
	models  apiv1.ModelServiceClient
	modules apiv1.ModuleServiceClient
}

func newEnv(t *testing.T, opts ...api.Option) *env {
	t.Helper()
	b := apitest.New()
	logs := &syncBuffer{}
	lis := bufconn.Listen(1 << 20)
	s := grpc.NewServer()
	opts = append([]api.Option{api.WithLogger(slog.New(slog.NewTextHandler(logs, nil)))}, opts...)
	api.Register(s, b, opts...)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &env{b: b, logs: logs, conn: conn,
		tasks: apiv1.NewTaskServiceClient(conn), models: apiv1.NewModelServiceClient(conn),
		modules: apiv1.NewModuleServiceClient(conn)}
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// wantCode fails unless err is a status error with code want.
func wantCode(t *testing.T, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("code = %v, want %v (err: %v)", got, want, err)
	}
}

// upload sends msgs on a client stream and returns the outcome. A server
// that fails early makes Send return io.EOF; the status then comes from
// CloseAndRecv.
func upload[Req, Res any](t *testing.T, st grpc.ClientStreamingClient[Req, Res], err error, msgs []*Req) (*Res, error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if err := st.Send(m); err != nil {
			break
		}
	}
	return st.CloseAndRecv()
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// errBackendReached is injected where a request must be refused before it
// reaches the backend: if it got through, the call fails as Internal.
var errBackendReached = errors.New("backend reached")
