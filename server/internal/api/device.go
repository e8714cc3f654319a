package api

import (
	"context"
	"fmt"

	"github.com/fleetlearn/fleetlearn/identity"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
)

// maxKeyIDLen bounds a device key id; an nkey public key is 56 characters.
const maxKeyIDLen = 128

// WithDevices adds DeviceService and EnrollmentService backed by d.
func WithDevices(d backend.Devices) Option {
	return func(c *config) { c.devices = d }
}

type deviceServer struct {
	apiv1.UnimplementedDeviceServiceServer
	*service
	d backend.Devices
}

func (s *deviceServer) CreateEnrollmentToken(ctx context.Context, req *pb.CreateEnrollmentTokenRequest) (*pb.CreateEnrollmentTokenResponse, error) {
	const op = "create enrollment token"
	for _, f := range []struct{ name, v string }{{"fleet", req.GetFleet()}, {"group", req.GetGroup()}} {
		if f.v == "" {
			continue
		}
		if err := wire.CheckToken(f.name, f.v); err != nil {
			return nil, invalid(op, err.Error())
		}
	}
	ttl := req.GetTtl().AsDuration()
	if req.GetTtl() != nil && (req.GetTtl().CheckValid() != nil || ttl <= 0) {
		return nil, invalid(op, fmt.Sprintf("ttl %v must be positive", ttl))
	}
	res, err := s.d.CreateEnrollmentToken(ctx, req.GetFleet(), req.GetGroup(), ttl)
	if err != nil {
		return nil, s.toStatus(ctx, op, err)
	}
	return res, nil
}

func (s *deviceServer) ListDevices(ctx context.Context, req *pb.ListDevicesRequest) (*pb.ListDevicesResponse, error) {
	const op = "list devices"
	p, err := page(op, req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	ds, next, err := s.d.ListDevices(ctx, req.GetIncludeRevoked(), p)
	if err != nil {
		return nil, s.toStatus(ctx, op, err)
	}
	return &pb.ListDevicesResponse{Devices: ds, NextPageToken: next}, nil
}

func (s *deviceServer) RevokeDevice(ctx context.Context, req *pb.RevokeDeviceRequest) (*pb.RevokeDeviceResponse, error) {
	const op = "revoke device"
	if err := checkID(op, "device_id", req.GetDeviceId()); err != nil {
		return nil, err
	}
	if hasControl(req.GetReason()) {
		return nil, invalid(op, "reason contains control characters")
	}
	if err := checkText(op, "reason", req.GetReason(), maxTextLen); err != nil {
		return nil, err
	}
	d, err := s.d.RevokeDevice(ctx, req.GetDeviceId(), req.GetReason())
	if err != nil {
		return nil, s.toStatus(ctx, op, err)
	}
	return &pb.RevokeDeviceResponse{Device: d}, nil
}

type enrollmentServer struct {
	apiv1.UnimplementedEnrollmentServiceServer
	*service
	d backend.Devices
}

func (s *enrollmentServer) Enroll(ctx context.Context, req *pb.EnrollRequest) (*pb.EnrollResponse, error) {
	const op = "enroll"
	if req.GetToken() == "" {
		return nil, invalid(op, "token is required")
	}
	if len(req.GetToken()) > identity.MaxTokenBytes {
		return nil, invalid(op, fmt.Sprintf("token is longer than %d bytes", identity.MaxTokenBytes))
	}
	if req.GetKeyId() == "" {
		return nil, invalid(op, "key_id is required")
	}
	if len(req.GetKeyId()) > maxKeyIDLen {
		return nil, invalid(op, fmt.Sprintf("key_id is longer than %d bytes", maxKeyIDLen))
	}
	if _, err := identity.ParseUserKeyID(req.GetKeyId()); err != nil {
		return nil, invalid(op, fmt.Sprintf("key_id %q is not an nkey user public key", truncate(req.GetKeyId())))
	}
	if id := req.GetDeviceId(); id != "" {
		if err := wire.CheckToken("device_id", id); err != nil {
			return nil, invalid(op, err.Error())
		}
	}
	if a := req.GetAttributes(); hasControl(a.GetDeviceClass()) || hasControl(a.GetAgentVersion()) ||
		len(a.GetDeviceClass()) > maxIDLen || len(a.GetAgentVersion()) > maxIDLen {
		return nil, invalid(op, fmt.Sprintf("attributes.device_class and agent_version must be names of at most %d bytes", maxIDLen))
	}
	res, err := s.d.Enroll(ctx, req)
	if err != nil {
		return nil, s.toStatus(ctx, op, err)
	}
	return res, nil
}
