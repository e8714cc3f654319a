package api_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/identity"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/api"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
)

// devices is a registry that records what reached it and fails with err.
type devices struct {
	calls int
	err   error
}

func (d *devices) CreateEnrollmentToken(_ context.Context, fleet, group string, ttl time.Duration) (*pb.CreateEnrollmentTokenResponse, error) {
	d.calls++
	return &pb.CreateEnrollmentTokenResponse{Token: "t", Fleet: fleet, Group: group}, d.err
}

func (d *devices) Enroll(_ context.Context, req *pb.EnrollRequest) (*pb.EnrollResponse, error) {
	d.calls++
	return &pb.EnrollResponse{Device: &pb.Device{Id: "d-1", KeyId: req.GetKeyId()}}, d.err
}

func (d *devices) ListDevices(context.Context, bool, backend.Page) ([]*pb.Device, string, error) {
	d.calls++
	return nil, "", d.err
}

func (d *devices) RevokeDevice(_ context.Context, id, _ string) (*pb.Device, error) {
	d.calls++
	return &pb.Device{Id: id}, d.err
}

func TestDeviceRequestsRefused(t *testing.T) {
	d := &devices{}
	e := newEnv(t, api.WithDevices(d))
	ctx := testContext(t)
	dc, ec := apiv1.NewDeviceServiceClient(e.conn), apiv1.NewEnrollmentServiceClient(e.conn)
	k, err := identity.GenerateUserKey()
	if err != nil {
		t.Fatal(err)
	}
	key := k.ID()
	for name, call := range map[string]func() error{
		"fleet with a dot": func() error {
			_, err := dc.CreateEnrollmentToken(ctx, &pb.CreateEnrollmentTokenRequest{Fleet: "a.b"})
			return err
		},
		"group with a space": func() error {
			_, err := dc.CreateEnrollmentToken(ctx, &pb.CreateEnrollmentTokenRequest{Group: "a b"})
			return err
		},
		"negative ttl": func() error {
			_, err := dc.CreateEnrollmentToken(ctx, &pb.CreateEnrollmentTokenRequest{Ttl: durationpb.New(-time.Second)})
			return err
		},
		"zero ttl given": func() error {
			_, err := dc.CreateEnrollmentToken(ctx, &pb.CreateEnrollmentTokenRequest{Ttl: durationpb.New(0)})
			return err
		},
		"negative page size": func() error {
			_, err := dc.ListDevices(ctx, &pb.ListDevicesRequest{PageSize: -1})
			return err
		},
		"revoke without id": func() error {
			_, err := dc.RevokeDevice(ctx, &pb.RevokeDeviceRequest{})
			return err
		},
		"reason with control characters": func() error {
			_, err := dc.RevokeDevice(ctx, &pb.RevokeDeviceRequest{DeviceId: "d", Reason: "a\x1bb"})
			return err
		},
		"no token": func() error {
			_, err := ec.Enroll(ctx, &pb.EnrollRequest{KeyId: key})
			return err
		},
		"huge token": func() error {
			_, err := ec.Enroll(ctx, &pb.EnrollRequest{Token: strings.Repeat("a", identity.MaxTokenBytes+1), KeyId: key})
			return err
		},
		"no key": func() error {
			_, err := ec.Enroll(ctx, &pb.EnrollRequest{Token: "t"})
			return err
		},
		"account key instead of user key": func() error {
			_, err := ec.Enroll(ctx, &pb.EnrollRequest{Token: "t", KeyId: "A" + key[1:]})
			return err
		},
		"device id with a dot": func() error {
			_, err := ec.Enroll(ctx, &pb.EnrollRequest{Token: "t", KeyId: key, DeviceId: "a.b"})
			return err
		},
		"device class with a newline": func() error {
			_, err := ec.Enroll(ctx, &pb.EnrollRequest{Token: "t", KeyId: key,
				Attributes: &pb.DeviceAttributes{DeviceClass: "a\nb"}})
			return err
		},
	} {
		if err := call(); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v", name, err)
		}
	}
	if d.calls != 0 {
		t.Errorf("%d refused requests reached the registry", d.calls)
	}
	if _, err := ec.Enroll(ctx, &pb.EnrollRequest{Token: "t", KeyId: key, DeviceId: "edge-1"}); err != nil {
		t.Fatalf("good request: %v", err)
	}
}

func TestDeviceErrorCodes(t *testing.T) {
	d := &devices{}
	e := newEnv(t, api.WithDevices(d))
	ctx := testContext(t)
	k, err := identity.GenerateUserKey()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		err  error
		want codes.Code
	}{
		{fmt.Errorf("token expired: %w", backend.ErrUnauthenticated), codes.Unauthenticated},
		{fmt.Errorf("token reused: %w", backend.ErrDenied), codes.PermissionDenied},
		{fmt.Errorf("key enrolled: %w", backend.ErrExists), codes.AlreadyExists},
		{fmt.Errorf("disk on fire"), codes.Internal},
	} {
		d.err = c.err
		_, err := apiv1.NewEnrollmentServiceClient(e.conn).Enroll(ctx, &pb.EnrollRequest{Token: "t", KeyId: k.ID()})
		if status.Code(err) != c.want || !strings.HasPrefix(status.Convert(err).Message(), "enroll: ") {
			t.Errorf("%v: %v, want %v", c.err, err, c.want)
		}
	}
	if !strings.Contains(e.logs.String(), "disk on fire") {
		t.Error("internal error not logged")
	}
}
