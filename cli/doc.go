// Package cli implements the fleetlearn operator command line: creating and
// watching federated training tasks, importing and exporting models and
// registering WASM update modules through the aggregator's gRPC API.
//
// The commands live here rather than in cmd/fleetlearn so that tests can run
// them in-process; cmd/fleetlearn only builds the root command and turns
// signals into context cancellation.
package cli
