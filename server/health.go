package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fleetlearn/fleetlearn/internal/healthcheck"
)

// Health endpoints, served in plain HTTP beside /metrics so that probes
// which speak neither TLS nor gRPC (the kubelet's httpGet, Docker's
// HEALTHCHECK through "fleetlearn-server health", load balancers) can ask.
const (
	// HealthzPath answers 200 while the process serves: a liveness probe.
	HealthzPath = healthcheck.Healthz
	// ReadyzPath answers 200 when the server can run rounds (Ready), 503
	// with the reason otherwise.
	ReadyzPath = healthcheck.Readyz
)

// Ready reports why the server cannot run rounds now, or nil: it is
// starting or shutting down, NATS is disconnected or the store fails.
func (s *Server) Ready(ctx context.Context) error {
	if st := s.standby.Load(); st != nil {
		if st.err != "" {
			return fmt.Errorf("standby: cannot reach the store's lease: %s", st.err)
		}
		if st.holder != "" {
			return fmt.Errorf("standby: replica %s leads", st.holder)
		}
		return errors.New("standby: waiting for the lease")
	}
	if s.deposed.Load() {
		return errors.New("lost the lease: this replica no longer runs rounds; restart it to rejoin as a standby")
	}
	if !s.started.Load() {
		return errors.New("starting")
	}
	if s.closing.Load() {
		return errors.New("shutting down")
	}
	if !s.nc.IsConnected() {
		return fmt.Errorf("NATS is %s", s.nc.Status())
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return s.store.Ping(ctx)
}
