package server

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/identity"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
	"github.com/fleetlearn/fleetlearn/server/internal/coord"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// devices implements the fleet registry (backend.Devices).
type devices struct{ s *Server }

var _ backend.Devices = (*devices)(nil)

func (d *devices) CreateEnrollmentToken(ctx context.Context, fleet, group string, ttl time.Duration) (*pb.CreateEnrollmentTokenResponse, error) {
	s := d.s
	if fleet == "" {
		fleet = s.cfg.Fleet
	}
	if fleet != s.cfg.Fleet {
		return nil, invalid("this server enrolls devices into fleet %q, not %q", s.cfg.Fleet, fleet)
	}
	if ttl == 0 {
		ttl = DefaultEnrollmentTTL
	}
	if ttl > identity.DefaultEnrollmentMaxTTL {
		return nil, invalid("ttl %v exceeds the maximum %v: enrollment tokens are short-lived bearer secrets", ttl, identity.DefaultEnrollmentMaxTTL)
	}
	tok, c, err := s.enrollIssuer.Mint(fleet, group, ttl)
	if errors.Is(err, identity.ErrBadInput) {
		return nil, invalid("%v", err)
	}
	if err != nil {
		return nil, err
	}
	return &pb.CreateEnrollmentTokenResponse{Token: tok, TokenId: c.ID, Fleet: c.Fleet, Group: c.Group,
		ExpireTime: timestamppb.New(c.Expires)}, nil
}

// Enroll verifies the token before it looks at the registry, so that a
// caller without a genuine token cannot ask whether a key or device id is
// enrolled; it checks the key and id before redeeming the token, so that a
// request refused for either leaves the token usable.
func (d *devices) Enroll(ctx context.Context, req *pb.EnrollRequest) (*pb.EnrollResponse, error) {
	s := d.s
	key := req.GetKeyId()
	if _, err := identity.ParseUserKeyID(key); err != nil {
		return nil, invalid("key_id: %v", err)
	}
	if _, err := s.enrollVerifier.Verify(req.GetToken()); err != nil {
		return nil, redeemError(err)
	}
	switch row, err := s.store.DeviceByKey(ctx, key); {
	case err == nil && !row.Revoked.IsZero():
		return nil, fmt.Errorf("key %s was revoked; enroll with a new key: %w", key, backend.ErrDenied)
	case err == nil:
		return nil, fmt.Errorf("key %s is already enrolled: %w", key, backend.ErrExists)
	case !errors.Is(err, backend.ErrNotFound):
		return nil, err
	}
	id := req.GetDeviceId()
	if id != "" {
		if _, err := s.store.Device(ctx, id); err == nil {
			return nil, fmt.Errorf("device id %s is taken: %w", id, backend.ErrExists)
		} else if !errors.Is(err, backend.ErrNotFound) {
			return nil, err
		}
	}
	claims, err := s.enrollVerifier.Redeem(ctx, req.GetToken())
	if err != nil {
		return nil, redeemError(err)
	}
	if id == "" {
		id = d.newDeviceID()
	}
	var userJWT string
	if s.natsAuth != nil {
		if userJWT, err = s.natsAuth.DeviceUserJWT(id, key, time.Time{}); err != nil {
			return nil, fmt.Errorf("server: device user JWT: %w", err)
		}
	}
	row := &store.DeviceRow{ID: id, KeyID: key, Fleet: claims.Fleet, Group: claims.Group, Attrs: req.GetAttributes(),
		TokenID: claims.ID, Enrolled: s.o.now()}
	if err := s.store.InsertDevice(ctx, row); err != nil {
		return nil, err
	}
	pseudo, err := s.audit.PseudonymizeDevice(id)
	if err != nil {
		return nil, fmt.Errorf("the device was enrolled but could not be recorded in the audit log: %w", err)
	}
	fp := sha256.Sum256([]byte(key))
	if err := s.record(ctx, audit.Device(pseudo), audit.DeviceEnrolled{Device: pseudo,
		Credential: "sha256:" + hex.EncodeToString(fp[:])}); err != nil {
		return nil, fmt.Errorf("the device was enrolled but could not be recorded in the audit log: %w", err)
	}
	s.o.log.InfoContext(ctx, "device enrolled", "device", id, "key", key, "fleet", claims.Fleet, "group", claims.Group,
		"token", claims.ID)
	return &pb.EnrollResponse{Device: row.Proto(), UserJwt: userJWT, NatsUrl: s.natsURL,
		ModulePublishersJwks: s.cfg.ModulePublishersJWKS}, nil
}

// redeemError classifies a refused enrollment token: one that is not a
// genuine, current token is unauthenticated; a genuine one already used or
// meant for another fleet is denied.
func redeemError(err error) error {
	switch {
	case errors.Is(err, identity.ErrTokenReused), errors.Is(err, identity.ErrWrongFleet):
		return fmt.Errorf("%v: %w", err, backend.ErrDenied)
	case errors.Is(err, identity.ErrMalformedToken), errors.Is(err, identity.ErrUnknownKey),
		errors.Is(err, identity.ErrBadSignature), errors.Is(err, identity.ErrTokenExpired),
		errors.Is(err, identity.ErrInvalidToken):
		return fmt.Errorf("%v: %w", err, backend.ErrUnauthenticated)
	}
	return err
}

// newDeviceID draws an id valid in NATS subjects; "d-" keeps it apart from
// ids that devices choose.
func (d *devices) newDeviceID() string {
	s := d.s
	s.idMu.Lock()
	defer s.idMu.Unlock()
	var b [8]byte
	for i := range b {
		b[i] = byte(s.ids.Uint32())
	}
	return "d-" + hex.EncodeToString(b[:])
}

func (d *devices) ListDevices(ctx context.Context, includeRevoked bool, p backend.Page) ([]*pb.Device, string, error) {
	var after int64
	if p.Token != "" {
		n, err := strconv.ParseInt(p.Token, 10, 64)
		if err != nil || n <= 0 {
			return nil, "", invalid("page token %q", p.Token)
		}
		after = n
	}
	n := pageSize(p)
	rows, last, err := d.s.store.Devices(ctx, includeRevoked, after, n)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(rows) == n {
		next = strconv.FormatInt(last, 10)
	}
	out := make([]*pb.Device, len(rows))
	since := d.s.o.now().Add(-coord.SeenWindow)
	for i, r := range rows {
		out[i] = r.Proto()
		out[i].Online = r.Revoked.IsZero() && !r.LastSeen.Before(since) && !r.LastSeen.IsZero()
	}
	return out, next, nil
}

// RevokeDevice marks the device revoked before telling NATS, so that a
// server restarting in between still builds the account JWT with it.
func (d *devices) RevokeDevice(ctx context.Context, id, reason string) (*pb.Device, error) {
	s := d.s
	if reason == "" {
		reason = "revoked by operator"
	}
	row, err := s.store.RevokeDevice(ctx, id, reason, s.o.now())
	if err != nil {
		return nil, err
	}
	var natsErr error
	if s.natsAuth != nil {
		if natsErr = s.natsAuth.Revoke(ctx, row.KeyID); natsErr != nil {
			s.o.log.ErrorContext(ctx, "device revoked in the registry but not on NATS", "device", id, "err", natsErr)
		}
	}
	pseudo, err := s.audit.PseudonymizeDevice(id)
	if err == nil {
		err = s.record(ctx, serviceActor, audit.DeviceRevoked{Device: pseudo, Reason: reason})
	}
	if err != nil {
		return nil, fmt.Errorf("the device was revoked but could not be recorded in the audit log: %w", err)
	}
	if natsErr != nil {
		return nil, fmt.Errorf("device %s is revoked in the registry, but its NATS connections could not be cut (they will be at the next restart): %v: %w",
			id, natsErr, backend.ErrUnavailable)
	}
	return row.Proto(), nil
}

// errNotEnrolled marks a device the registry does not vouch for.
var errNotEnrolled = errors.New("device is not enrolled")

// deviceKey returns an active enrolled device's public key: the key its
// reports and secure aggregation messages must be signed with.
func (s *Server) deviceKey(ctx context.Context, id string) (ed25519.PublicKey, error) {
	row, err := s.store.Device(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNotEnrolled, err)
	}
	if !row.Revoked.IsZero() {
		return nil, fmt.Errorf("%w at %v: %s", coord.ErrRevoked, row.Revoked.Format(time.RFC3339), row.Reason)
	}
	return identity.ParseUserKeyID(row.KeyID)
}
