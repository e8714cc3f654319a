// Package apiv1 is the generated Go code for the fleetlearn.api.v1 Protocol
// Buffers package: the gRPC services of the control plane (TaskService,
// ModelService, ModuleService, AuditService, DeviceService and
// EnrollmentService), their clients, server interfaces and method names.
//
// The services' request and response messages live in fleetlearnv1 with the
// rest of the wire messages, so that code which only encodes messages (the
// SecAgg+ state machines, the device agent's round protocol) does not link
// gRPC. The *.pb.go files are generated from the .proto files in this
// directory; regenerate them with `go generate ./proto/...` from the
// repository root instead of editing them.
package apiv1
