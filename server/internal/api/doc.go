// Package api is the aggregator's gRPC surface: it serves TaskService,
// ModelService and ModuleService on top of a backend.Backend, together with
// the standard health and reflection services.
//
// The package owns the boundary and nothing else: it validates requests,
// reassembles and checks streamed uploads, chunks downloads, and maps the
// backend's sentinel errors to gRPC status codes. Everything with state lives
// behind backend.Backend.
package api
