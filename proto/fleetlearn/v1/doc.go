// Package fleetlearnv1 is the generated Go code for the fleetlearn.v1
// Protocol Buffers package: the NATS messages exchanged between the
// aggregator and device agents (CheckIn, RoundPlan, UpdateReport, the SecAgg+
// stages), task and audit records, and the request and response messages of
// the control plane's gRPC services. The services themselves are in package
// apiv1 (proto/fleetlearn/api/v1), so this package links no gRPC.
//
// The *.pb.go files are generated from the .proto files in this directory;
// regenerate them with `go generate ./proto/...` from the repository root
// instead of editing them.
package fleetlearnv1
