package api_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/test/bufconn"

	"github.com/fleetlearn/fleetlearn/server/internal/api"
	"github.com/fleetlearn/fleetlearn/server/internal/api/apitest"
)

// The aggregator registers the API on its gRPC server; here an in-memory
// listener and backend stand in for net.Listen("tcp", addr) and the core.
func ExampleRegister() {
	lis := bufconn.Listen(1 << 20)
	s := grpc.NewServer()
	api.Register(s, apitest.New(),
		api.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))),
		api.WithMaxModelBytes(256<<20))
	go s.Serve(lis)
	defer s.Stop()

	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()
	r, err := healthpb.NewHealthClient(conn).Check(context.Background(),
		&healthpb.HealthCheckRequest{Service: "fleetlearn.api.v1.TaskService"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(r.GetStatus())
	// Output: SERVING
}
