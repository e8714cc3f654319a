package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/identity"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
)

// Lifetimes of the NATS credentials NATSService issues for people's tools.
// Nothing withdraws them before they lapse (they are not in the device
// registry, whose revocations the account JWT carries), so they are short.
const (
	DefaultNATSCredentialsTTL = 24 * time.Hour
	MaxNATSCredentialsTTL     = 30 * 24 * time.Hour
)

// toolRoles maps the API's roles to the authority's.
var toolRoles = map[pb.NATSRole]identity.NATSToolRole{
	pb.NATSRole_NATS_ROLE_OBSERVER: identity.NATSObserver,
	pb.NATSRole_NATS_ROLE_OPERATOR: identity.NATSOperator,
	pb.NATSRole_NATS_ROLE_SYSTEM:   identity.NATSSystem,
}

// natsCredentials implements NATSService on the server's NATS authority.
type natsCredentials struct{ s *Server }

// IssueCredentials signs a user JWT for the caller's public key. The API
// layer has checked the key, role and name are well formed.
func (c *natsCredentials) IssueCredentials(ctx context.Context, req *pb.IssueCredentialsRequest) (*pb.IssueCredentialsResponse, error) {
	s := c.s
	n := s.natsAuthority
	if n == nil {
		return nil, fmt.Errorf("this server runs NATS without authorization (--insecure-nats): any client connects without credentials: %w",
			backend.ErrPrecondition)
	}
	role, ok := toolRoles[req.GetRole()]
	if !ok {
		return nil, invalid("role %v: want observer, operator or system", req.GetRole())
	}
	ttl := DefaultNATSCredentialsTTL
	if req.GetTtl() != nil {
		ttl = req.GetTtl().AsDuration()
	}
	if ttl <= 0 {
		return nil, invalid("ttl %v must be positive", ttl)
	}
	if ttl > MaxNATSCredentialsTTL {
		return nil, invalid("ttl %v exceeds the maximum %v: nothing withdraws tool credentials before they expire", ttl, MaxNATSCredentialsTTL)
	}
	name := req.GetName()
	if name == "" {
		name = string(role)
	}
	// A second granularity, as in the JWT: the response says exactly when
	// the server stops accepting it.
	expires := s.o.now().Add(ttl).Truncate(time.Second)
	jwt, err := n.auth.ToolUserJWT(role, name, req.GetPublicKey(), expires)
	if errors.Is(err, identity.ErrBadInput) || errors.Is(err, identity.ErrBadKey) {
		return nil, invalid("%v", err)
	}
	if err != nil {
		return nil, err
	}
	account := n.auth.AccountPublicKey()
	if role == identity.NATSSystem {
		account = n.auth.SystemAccountPublicKey()
	}
	s.o.log.InfoContext(ctx, "issued NATS tool credentials", "role", role, "name", name, "key", req.GetPublicKey(),
		"expires", expires.Format(time.RFC3339))
	return &pb.IssueCredentialsResponse{UserJwt: jwt, Role: req.GetRole(), ExpireTime: timestamppb.New(expires),
		NatsUrl: s.natsURL, Account: account}, nil
}
