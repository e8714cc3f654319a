// Package fleetlearnv1 is the generated Go code for the fleetlearn.v1
// Protocol Buffers package: the NATS messages exchanged between the
// aggregator and device agents (CheckIn, RoundPlan, UpdateReport, the SecAgg+
// stages) and the gRPC TaskService, ModelService, ModuleService,
// AuditService, DeviceService and EnrollmentService.
//
// The *.pb.go files are generated from the .proto files in this directory;
// regenerate them with `go generate ./proto/...` from the repository root
// instead of editing them.
package fleetlearnv1
