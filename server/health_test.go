package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
)

// The health endpoints answer in plain HTTP on the metrics listener: the
// kubelet's httpGet and Docker's HEALTHCHECK speak neither TLS nor gRPC.
func TestHealthEndpoints(t *testing.T) {
	h := servertest.New(t)
	for _, path := range []string{server.HealthzPath, server.ReadyzPath} {
		resp, err := http.Get("http://" + h.MetricsAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(b)) != "ok" {
			t.Errorf("%s: %s %q", path, resp.Status, b)
		}
	}
	if err := h.Ready(t.Context()); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	if err := h.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := h.Ready(t.Context()); err == nil || !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("Ready after Shutdown: %v", err)
	}
}
