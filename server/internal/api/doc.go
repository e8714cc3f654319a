// Package api is the aggregator's gRPC surface: it serves TaskService,
// ModelService and ModuleService on top of a backend.Backend, AuditService
// on top of the audit log, and the standard health and reflection services;
// an interceptor records every mutating call in the audit log.
//
// The package owns the boundary and nothing else: it validates requests,
// reassembles and checks streamed uploads, chunks downloads, and maps the
// backend's sentinel errors to gRPC status codes. Everything with state lives
// behind backend.Backend.
package api
