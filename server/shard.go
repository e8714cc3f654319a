package server

import (
	"github.com/nats-io/nats.go"

	"github.com/fleetlearn/fleetlearn/server/internal/coord"
	"github.com/fleetlearn/fleetlearn/server/internal/natsx"
)

// startShardWorkers starts a replica's aggregation workers before it waits
// for the lease, on a NATS connection of their own, so that a standby sums
// reports for the leader (docs/HA.md, "Sharded aggregation"). A single
// server starts them on its own connection instead, once it has one.
func (s *Server) startShardWorkers() error {
	if s.cfg.AggregationWorkers <= 0 {
		return nil
	}
	var opts []nats.Option
	if !s.cfg.InsecureNATS {
		a, err := s.loadNATSAuthority()
		if err != nil {
			return err
		}
		s.natsAuthority = a
		user, err := a.serviceOption()
		if err != nil {
			return err
		}
		opts = append(opts, user)
	}
	opts = append(opts, s.natsTLSOptions()...)
	// It retries until NATS answers: a standby may start before the cluster.
	nc, err := natsx.Connect(s.cfg.NATSURL, "fleetlearn-aggregation-worker", s.o.log, opts...)
	if err != nil {
		return err
	}
	s.shardNC = nc
	s.shardWorkers, err = coord.StartShardWorkers(nc, s.cfg.AggregationWorkers, s.o.log.With("component", "aggregation-worker"))
	return err
}
