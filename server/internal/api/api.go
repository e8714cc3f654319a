package api

import (
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/internal/slots"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
)

// Limits on what one request may carry.
const (
	DefaultMaxModelBytes  = 1 << 30  // one ImportModel upload
	DefaultMaxModuleBytes = 64 << 20 // one RegisterModule upload
	// ChunkBytes is the largest chunk an upload may send in one message and
	// the size of the chunks ExportModel sends.
	ChunkBytes = 1 << 20
	// MaxPageSize caps page_size; larger requests get this many items.
	MaxPageSize = 1000
)

// Option configures Register.
type Option func(*config)

type config struct {
	log            *slog.Logger
	maxModelBytes  int64
	maxModuleBytes int64
	health         *health.Server
	audit          *audit.Log
	devices        backend.Devices
	cosignatures   func(result string) // WithCosignatureCounter
	natsCreds      NATSCredentials     // WithNATSCredentials
	caller         Identity            // WithCaller
	uploadsPer     int                 // WithUploadLimits
	uploads        int
}

func newConfig(opts []Option) config {
	c := config{maxModelBytes: DefaultMaxModelBytes, maxModuleBytes: DefaultMaxModuleBytes,
		uploadsPer: DefaultUploadsPerCaller, uploads: DefaultUploads}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.health == nil {
		c.health = health.NewServer()
	}
	return c
}

// WithLogger sets where failures that clients only see as "internal error"
// are logged in full. By default nothing is logged.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.log = l }
}

// WithMaxModelBytes caps the size of one ImportModel upload; n <= 0 keeps
// DefaultMaxModelBytes.
func WithMaxModelBytes(n int64) Option {
	return func(c *config) {
		if n > 0 {
			c.maxModelBytes = n
		}
	}
}

// WithMaxModuleBytes caps the size of one RegisterModule upload; n <= 0
// keeps DefaultMaxModuleBytes.
func WithMaxModuleBytes(n int64) Option {
	return func(c *config) {
		if n > 0 {
			c.maxModuleBytes = n
		}
	}
}

// WithUploadLimits bounds the uploads (ImportModel and RegisterModule
// streams) in flight: perCaller for one caller, total for everyone; more
// are refused with RESOURCE_EXHAUSTED. n <= 0 keeps DefaultUploadsPerCaller
// and DefaultUploads.
func WithUploadLimits(perCaller, total int) Option {
	return func(c *config) {
		if perCaller > 0 {
			c.uploadsPer = perCaller
		}
		if total > 0 {
			c.uploads = total
		}
	}
}

// WithCaller names the caller a call counts against for per-caller limits
// (an authentication layer's principal); by default, and where it returns
// "", the caller's network address (PeerIdentity).
func WithCaller(id Identity) Option {
	return func(c *config) { c.caller = id }
}

// WithHealthServer registers h as the health service instead of a private
// one, so that the caller can report NOT_SERVING (h.Shutdown) while draining.
func WithHealthServer(h *health.Server) Option {
	return func(c *config) { c.health = h }
}

// serviceNames are the services Register adds and reports as SERVING.
var serviceNames = []string{
	apiv1.TaskService_ServiceDesc.ServiceName,
	apiv1.ModelService_ServiceDesc.ServiceName,
	apiv1.ModuleService_ServiceDesc.ServiceName,
}

// Register adds TaskService, ModelService and ModuleService backed by b to s,
// plus the gRPC health service (SERVING for "" and each service) and
// server reflection; with WithAudit also AuditService, with WithDevices
// DeviceService and EnrollmentService, with WithNATSCredentials
// NATSService. Call it before s.Serve.
func Register(s *grpc.Server, b backend.Backend, opts ...Option) {
	c := newConfig(opts)
	core := &service{b: b, cfg: c, uploads: slots.New(c.uploads, c.uploadsPer)}
	apiv1.RegisterTaskServiceServer(s, &taskServer{service: core})
	apiv1.RegisterModelServiceServer(s, &modelServer{service: core})
	apiv1.RegisterModuleServiceServer(s, &moduleServer{service: core})
	names := serviceNames
	if c.audit != nil {
		apiv1.RegisterAuditServiceServer(s, &auditServer{service: core, lg: c.audit})
		names = append(names[:len(names):len(names)], apiv1.AuditService_ServiceDesc.ServiceName)
	}
	if c.devices != nil {
		apiv1.RegisterDeviceServiceServer(s, &deviceServer{service: core, d: c.devices})
		apiv1.RegisterEnrollmentServiceServer(s, &enrollmentServer{service: core, d: c.devices})
		names = append(names[:len(names):len(names)], apiv1.DeviceService_ServiceDesc.ServiceName,
			apiv1.EnrollmentService_ServiceDesc.ServiceName)
	}
	if c.natsCreds != nil {
		apiv1.RegisterNATSServiceServer(s, &natsServer{service: core, n: c.natsCreds})
		names = append(names[:len(names):len(names)], apiv1.NATSService_ServiceDesc.ServiceName)
	}

	c.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	for _, name := range names {
		c.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	healthpb.RegisterHealthServer(s, c.health)
	reflection.Register(s)
}

// service is the state the three service implementations share. They are
// separate types because each must embed its own Unimplemented server.
type service struct {
	b       backend.Backend
	cfg     config
	uploads *slots.Pool
}
