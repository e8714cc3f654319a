package api_test

import (
	"io"
	"slices"
	"testing"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/fleetlearn/fleetlearn/server/internal/api"
)

var services = []string{"fleetlearn.api.v1.TaskService", "fleetlearn.api.v1.ModelService", "fleetlearn.api.v1.ModuleService"}

func TestHealth(t *testing.T) {
	h := health.NewServer()
	e := newEnv(t, api.WithHealthServer(h))
	ctx := testContext(t)
	c := healthpb.NewHealthClient(e.conn)
	for _, svc := range append([]string{""}, services...) {
		r, err := c.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("%q: %v", svc, err)
		}
		if r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%q: %v", svc, r.GetStatus())
		}
	}
	// The caller's health server is the one registered: draining shows.
	h.Shutdown()
	r, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("after Shutdown: %v, %v", r, err)
	}
}

func TestReflectionListsServices(t *testing.T) {
	e := newEnv(t)
	stream, err := reflectionpb.NewServerReflectionClient(e.conn).ServerReflectionInfo(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	err = stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	stream.CloseSend()
	if _, err := stream.Recv(); err != io.EOF {
		t.Errorf("after CloseSend: %v", err)
	}
	var got []string
	for _, s := range res.GetListServicesResponse().GetService() {
		got = append(got, s.GetName())
	}
	for _, want := range append(services, "grpc.health.v1.Health") {
		if !slices.Contains(got, want) {
			t.Errorf("reflection lists %v, missing %s", got, want)
		}
	}
	if slices.Contains(got, "fleetlearn.api.v1.AuditService") {
		t.Errorf("reflection lists AuditService, which Register does not serve")
	}
}
