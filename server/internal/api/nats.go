package api

import (
	"context"
	"fmt"
	"strings"

	"github.com/nats-io/nkeys"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/audit"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// NATSCredentials signs NATS user JWTs for people's tools: the backend of
// NATSService.
type NATSCredentials interface {
	// IssueCredentials certifies req's public key in req's role; the
	// request has been checked to be well formed.
	IssueCredentials(ctx context.Context, req *pb.IssueCredentialsRequest) (*pb.IssueCredentialsResponse, error)
}

// WithNATSCredentials adds NATSService backed by n.
func WithNATSCredentials(n NATSCredentials) Option {
	return func(c *config) { c.natsCreds = n }
}

type natsServer struct {
	apiv1.UnimplementedNATSServiceServer
	*service
	n NATSCredentials
}

func (s *natsServer) IssueCredentials(ctx context.Context, req *pb.IssueCredentialsRequest) (*pb.IssueCredentialsResponse, error) {
	const op = "issue nats credentials"
	if err := checkUserPublicKey(op, req.GetPublicKey()); err != nil {
		return nil, err
	}
	switch req.GetRole() {
	case pb.NATSRole_NATS_ROLE_OBSERVER, pb.NATSRole_NATS_ROLE_OPERATOR, pb.NATSRole_NATS_ROLE_SYSTEM:
	case pb.NATSRole_NATS_ROLE_UNSPECIFIED:
		return nil, invalid(op, "role is required: observer, operator or system")
	default:
		return nil, invalid(op, fmt.Sprintf("unknown role %d: want observer, operator or system", req.GetRole()))
	}
	if d := req.GetTtl(); d != nil && (d.CheckValid() != nil || d.AsDuration() <= 0) {
		return nil, invalid(op, fmt.Sprintf("ttl %v must be positive", d.AsDuration()))
	}
	if name := req.GetName(); name != "" {
		if err := wire.CheckToken("name", name); err != nil {
			return nil, invalid(op, err.Error())
		}
	}
	res, err := s.n.IssueCredentials(ctx, req)
	if err != nil {
		return nil, s.toStatus(ctx, op, err)
	}
	return res, nil
}

// checkUserPublicKey accepts an nkey user public key ("U..."). A seed is
// refused without being echoed: it is the secret the caller was to keep.
func checkUserPublicKey(op, key string) error {
	switch {
	case key == "":
		return invalid(op, "public_key is required: the tool's nkey user public key (U...)")
	case len(key) > maxKeyIDLen:
		return invalid(op, fmt.Sprintf("public_key is longer than %d bytes", maxKeyIDLen))
	case strings.HasPrefix(key, "S"):
		if _, _, err := nkeys.DecodeSeed([]byte(key)); err == nil {
			return invalid(op, "public_key is an nkey seed: keep the seed secret and send its public key (U...)")
		}
	}
	if !nkeys.IsValidPublicUserKey(key) {
		return invalid(op, fmt.Sprintf("public_key %q is not an nkey user public key (U...)", truncate(key)))
	}
	return nil
}

// describeIssueCredentials names the credentials in the audit log by role
// and public key: the key is what the servers' connection reports show,
// and it is no secret.
func describeIssueCredentials(req, res proto.Message, a *audit.OperatorAction) {
	in, _ := req.(*pb.IssueCredentialsRequest)
	out, _ := res.(*pb.IssueCredentialsResponse)
	role := out.GetRole()
	if role == pb.NATSRole_NATS_ROLE_UNSPECIFIED {
		role = in.GetRole()
	}
	name := strings.ToLower(strings.TrimPrefix(role.String(), "NATS_ROLE_"))
	if _, known := pb.NATSRole_name[int32(role)]; !known || role == pb.NATSRole_NATS_ROLE_UNSPECIFIED {
		name = "unknown"
	}
	a.Resource = "nats-credentials/" + name
	if key := in.GetPublicKey(); nkeys.IsValidPublicUserKey(key) {
		a.Resource += "/" + key
	}
}
