package simfleet

import "github.com/nats-io/nats.go"

// ConnStats are the counters of the fleet's connections: the devices',
// then the upload connections'.
func (f *Fleet) ConnStats() []nats.Statistics {
	out := make([]nats.Statistics, len(f.conns))
	for i, nc := range f.conns {
		out[i] = nc.Stats()
	}
	return out
}
