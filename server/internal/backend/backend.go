// Package backend is the seam between the aggregator's gRPC API and its core:
// the API layer translates requests and errors; the core implements Backend.
package backend

import (
	"context"
	"errors"
	"io"
	"time"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Sentinel errors; the API maps them to gRPC status codes.
var (
	ErrNotFound     = errors.New("not found")           // codes.NotFound
	ErrInvalid      = errors.New("invalid argument")    // codes.InvalidArgument
	ErrExists       = errors.New("already exists")      // codes.AlreadyExists
	ErrPrecondition = errors.New("failed precondition") // codes.FailedPrecondition
	ErrTooLarge     = errors.New("too large")           // codes.ResourceExhausted
	ErrUnavailable  = errors.New("unavailable")         // codes.Unavailable
	// ErrUnauthenticated reports a credential in the request (an
	// enrollment token) that is malformed, expired or not genuine.
	ErrUnauthenticated = errors.New("unauthenticated") // codes.Unauthenticated
	// ErrDenied reports a genuine credential or signature that does not
	// allow the request: a reused or foreign-fleet enrollment token, a
	// revoked key, a module signed by an untrusted publisher.
	ErrDenied = errors.New("permission denied") // codes.PermissionDenied
)

// Page is a request for one page of a listing.
type Page struct {
	Size  int    // 0 means the default; the backend caps it
	Token string // opaque, from a previous response
}

// Backend is what the aggregator service offers its API.
type Backend interface {
	// CreateTask creates a task and says, in warnings, what its rounds
	// will run into (a fleet too small for its cohort).
	CreateTask(ctx context.Context, t *pb.Task) (task *pb.Task, warnings []string, err error)
	GetTask(ctx context.Context, id string) (*pb.Task, error)
	ListTasks(ctx context.Context, state pb.TaskState, p Page) ([]*pb.Task, string, error)
	// StopTask stops a running or paused task.
	StopTask(ctx context.Context, id, reason string) (*pb.Task, error)
	// ResumeTask runs a paused task's rounds again; a task that is not
	// paused is ErrPrecondition.
	ResumeTask(ctx context.Context, id string) (*pb.Task, error)
	// WatchTask streams the task's round events from now on, and the task
	// when it pauses, until ctx ends or the task finishes or pauses (then
	// the channel closes).
	WatchTask(ctx context.Context, id string) (<-chan *pb.WatchTaskResponse, error)
	ListRounds(ctx context.Context, taskID string, p Page) ([]*pb.RoundSummary, string, error)

	// ImportModel stores the safetensors file r holds as a base model
	// version. r is the upload as it arrives: it ends with io.EOF only once
	// the whole upload has arrived and matched the header's declared size
	// and digest (h.SizeBytes and h.Sha256, either of which may be unset),
	// and with an error otherwise. An implementation must read r to io.EOF
	// before it keeps anything, and should not hold the whole file in
	// memory: an upload may be as large as the API's limit.
	ImportModel(ctx context.Context, h *pb.ImportModelHeader, r io.Reader) (*pb.Model, error)
	// ExportModel returns a model version's metadata and safetensors bytes.
	ExportModel(ctx context.Context, version string) (*pb.Model, []byte, error)
	GetModel(ctx context.Context, version string) (*pb.Model, error)
	ListModels(ctx context.Context, name string, p Page) ([]*pb.Model, string, error)

	// RegisterModule stores a WASM update module after validating it in the sandbox.
	RegisterModule(ctx context.Context, h *pb.RegisterModuleHeader, code []byte) (*pb.Module, error)
	GetModule(ctx context.Context, sha256 string) (*pb.Module, error)
	ListModules(ctx context.Context, name string, p Page) ([]*pb.Module, string, error)
}

// Devices is the fleet registry behind DeviceService and EnrollmentService.
type Devices interface {
	// CreateEnrollmentToken mints a token admitting one device to fleet
	// ("" for the server's) and group within ttl (0 for the default).
	CreateEnrollmentToken(ctx context.Context, fleet, group string, ttl time.Duration) (*pb.CreateEnrollmentTokenResponse, error)
	// Enroll redeems the request's token for its device key.
	Enroll(ctx context.Context, req *pb.EnrollRequest) (*pb.EnrollResponse, error)
	ListDevices(ctx context.Context, includeRevoked bool, p Page) ([]*pb.Device, string, error)
	// RevokeDevice withdraws a device's credentials for good.
	RevokeDevice(ctx context.Context, id, reason string) (*pb.Device, error)
}
