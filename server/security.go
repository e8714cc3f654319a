package server

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/internal/api"
	"github.com/fleetlearn/fleetlearn/server/internal/authz"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
	"github.com/fleetlearn/fleetlearn/server/internal/blobs"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
)

// Files and directories the server keeps its credentials in, under DataDir.
const (
	// TLSDir holds the CA and the server certificate (identity.LoadOrCreateTLS).
	TLSDir = "tls"
	// KeysDir holds the API and enrollment token signing keys.
	KeysDir = "keys"
	// APIKeyFile signs API bearer tokens (inside KeysDir).
	APIKeyFile = "api.key"
	// EnrollKeyFile signs enrollment tokens (inside KeysDir).
	EnrollKeyFile = "enroll.key"
	// AdminTokenFile is the admin bearer token the server mints on first
	// start (mode 0600), for bootstrapping the CLI.
	AdminTokenFile = "admin.token"
)

// Security defaults.
const (
	// DefaultFleet is the fleet a server enrolls devices into unless
	// Config.Fleet names another.
	DefaultFleet = "default"
	// AdminTokenTTL is the lifetime of the admin token; it is renewed at
	// start once it is within AdminTokenRenew of its expiry.
	AdminTokenTTL   = 365 * 24 * time.Hour
	AdminTokenRenew = 30 * 24 * time.Hour
	// AdminSubject names the admin token's holder in the audit log.
	AdminSubject = "admin"
	// DefaultEnrollmentTTL is an enrollment token's lifetime when the
	// request names none.
	DefaultEnrollmentTTL = 24 * time.Hour
)

// CAFile is where a server with data directory dataDir keeps the CA
// certificate clients must trust (PEM).
func CAFile(dataDir string) string { return filepath.Join(dataDir, TLSDir, identity.CACertFile) }

// AdminTokenPath is where a server with data directory dataDir writes its
// admin token.
func AdminTokenPath(dataDir string) string { return filepath.Join(dataDir, AdminTokenFile) }

// APIKeyPath is the API token signing key of a server with data directory
// dataDir; whoever can read it can mint tokens for any role.
func APIKeyPath(dataDir string) string { return filepath.Join(dataDir, KeysDir, APIKeyFile) }

// deviceAuthority certifies enrolled devices on NATS and withdraws them.
// The NATS wiring sets it (Server.natsAuth) when the server runs NATS in
// operator mode; without it devices enroll but get no user JWT.
type deviceAuthority interface {
	// DeviceUserJWT certifies userKey as device, until expires (zero:
	// until revoked).
	DeviceUserJWT(device, userKey string, expires time.Time) (string, error)
	// Revoke withdraws every JWT of userKey from the NATS servers. The
	// key is already marked revoked in the store (Store.Revocations lists
	// it) when Revoke is called.
	Revoke(ctx context.Context, userKey string) error
}

// security is the server's identity and access state, built at Start.
type security struct {
	tlsCA          *identity.TLS
	apiIssuer      *identity.APIIssuer
	apiVerifier    *identity.APIVerifier
	enrollIssuer   *identity.EnrollmentIssuer
	enrollVerifier *identity.EnrollmentVerifier
	publishers     *identity.TrustedPublishers // nil: no module is accepted
	adminToken     string
	natsAuth       deviceAuthority
}

// checkSecurityConfig fills in the security defaults and refuses bad values
// before anything is created.
func checkSecurityConfig(cfg *Config) error {
	if cfg.Fleet == "" {
		cfg.Fleet = DefaultFleet
	}
	if err := wire.CheckToken("fleet", cfg.Fleet); err != nil {
		return fmt.Errorf("server: fleet: %w", err)
	}
	if len(cfg.ModulePublishersJWKS) > 0 {
		if _, err := identity.ParseTrustedPublishers(cfg.ModulePublishersJWKS); err != nil {
			return fmt.Errorf("server: module publishers: %w", err)
		}
	}
	return nil
}

// loadSecurity loads or creates the TLS CA and server certificate, the
// token signing keys and the admin token. It needs the store (redeemed
// enrollment tokens live there).
func (s *Server) loadSecurity() error {
	const op = "server: security"
	dir := s.cfg.DataDir
	clock := identity.WithClock(s.o.now)
	var err error
	if s.tlsCA, err = identity.LoadOrCreateTLS(filepath.Join(dir, TLSDir), s.tlsHosts(), clock); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	apiKey, err := identity.LoadOrCreateSigningKey(APIKeyPath(dir))
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if s.apiIssuer, err = identity.NewAPIIssuer(apiKey, clock, identity.WithMaxTTL(AdminTokenTTL)); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if s.apiVerifier, err = identity.NewAPIVerifier([]ed25519.PublicKey{s.apiIssuer.PublicKey()}, clock); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	enrollKey, err := identity.LoadOrCreateSigningKey(filepath.Join(dir, KeysDir, EnrollKeyFile))
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if s.enrollIssuer, err = identity.NewEnrollmentIssuer(enrollKey, clock); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	used := s.store.UsedTokens(s.o.now, identity.DefaultLeeway)
	if s.enrollVerifier, err = identity.NewEnrollmentVerifier(s.cfg.Fleet, used,
		[]ed25519.PublicKey{s.enrollIssuer.PublicKey()}, clock); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if len(s.cfg.ModulePublishersJWKS) > 0 {
		if s.publishers, err = identity.ParseTrustedPublishers(s.cfg.ModulePublishersJWKS); err != nil {
			return fmt.Errorf("%s: module publishers: %w", op, err)
		}
	} else {
		s.o.log.Warn("no trusted module publishers configured: every module registration will be refused")
	}
	return s.loadAdminToken()
}

// tlsHosts are the names the server certificate covers: loopback, the
// gRPC and embedded NATS listen hosts (the machine's hostname when they
// listen on every interface), and Config.TLSHosts.
func (s *Server) tlsHosts() []string {
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	add := func(h string) {
		if h != "" && !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	for _, addr := range []string{s.cfg.GRPCAddr, s.cfg.NATSListen} {
		h, _, err := net.SplitHostPort(addr)
		if err != nil {
			continue
		}
		if everyInterface(h) {
			add(machineName())
			continue
		}
		add(h)
	}
	for _, h := range s.cfg.TLSHosts {
		add(h)
	}
	return hosts
}

// machineName is the host's name as the certificate covers it for
// listeners on every interface (lower case), or "" if it has none.
func machineName() string {
	name, err := os.Hostname()
	if err != nil {
		return ""
	}
	return strings.ToLower(name)
}

// loadAdminToken keeps the admin token in DataDir, minting a new one when
// there is none, it no longer verifies (the signing key changed) or it
// expires within AdminTokenRenew.
func (s *Server) loadAdminToken() error {
	path := AdminTokenPath(s.cfg.DataDir)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		tok := strings.TrimSpace(string(b))
		if p, verr := s.apiVerifier.Verify(tok); verr == nil && p.Has(identity.RoleAdmin) &&
			p.Expires.After(s.o.now().Add(AdminTokenRenew)) {
			s.adminToken = tok
			return nil
		}
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("server: admin token: %w", err)
	}
	tok, p, err := s.apiIssuer.Mint(AdminSubject, []identity.Role{identity.RoleAdmin}, AdminTokenTTL)
	if err != nil {
		return fmt.Errorf("server: admin token: %w", err)
	}
	if err := atomicfile.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		return fmt.Errorf("server: admin token: %w", err)
	}
	s.adminToken = tok
	s.o.log.Info("minted the admin API token", "file", path, "expires", p.Expires.Format(time.RFC3339),
		"ca", CAFile(s.cfg.DataDir))
	return nil
}

// newGRPCServer builds the API server: TLS unless Config.GRPCInsecure,
// bearer-token authentication, the audit interceptor, then the role policy,
// so that refused calls by known callers are recorded under their names.
// maxAPIMessage bounds one message of the gRPC API, received or, by a
// standby forwarding to the leader, passed on.
const maxAPIMessage = 8 << 20

// apiDialOptions are how the server, as a client of an API of its own
// deployment (its dashboard, a standby forwarding to the leader), reaches
// it: TLS under the shared CA, or plaintext with --grpc-insecure.
func (s *Server) apiDialOptions() []client.DialOption {
	if s.cfg.GRPCInsecure {
		return []client.DialOption{client.WithInsecure()}
	}
	return []client.DialOption{client.WithCA(s.CACertPEM())}
}

func (s *Server) newGRPCServer(bl *blobs.Store, m *metrics.M) (*grpc.Server, error) {
	az, err := authz.New(s.apiVerifier, identity.DefaultPolicy())
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	log := s.o.log.With("component", "api")
	recorder := api.NewAuditInterceptor(s.audit, authz.Operator, log)
	opts := []grpc.ServerOption{grpc.MaxRecvMsgSize(maxAPIMessage),
		grpc.ChainUnaryInterceptor(az.AuthenticateUnary, recorder.Unary, az.AuthorizeUnary),
		grpc.ChainStreamInterceptor(az.AuthenticateStream, recorder.Stream, az.AuthorizeStream)}
	if s.cfg.GRPCInsecure {
		s.o.log.Warn("gRPC API serves plaintext (--grpc-insecure): bearer tokens cross the network in the clear")
	} else {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.tlsCA.ServerConfig(false))))
	}
	srv := grpc.NewServer(opts...)
	api.Register(srv, &service{s: s, blobs: bl}, api.WithLogger(log), api.WithAudit(s.audit),
		api.WithCaller(authz.Operator),
		api.WithDevices(&devices{s: s}),
		api.WithNATSCredentials(&natsCredentials{s: s}),
		api.WithCosignatureCounter(func(result string) { m.Cosignatures.WithLabelValues(result).Inc() }))
	if s.pool != nil {
		s.pool.Register(srv)
	}
	return srv, nil
}

// CACertPEM is the CA certificate API clients must trust; nil before Start.
func (s *Server) CACertPEM() []byte {
	if s.tlsCA == nil {
		return nil
	}
	return s.tlsCA.CAPEM()
}

// AdminToken is the admin bearer token (also in AdminTokenPath); "" before
// Start.
func (s *Server) AdminToken() string { return s.adminToken }

// MintToken mints an API bearer token for subject holding roles, valid for
// ttl (at most AdminTokenTTL), signed by the server's API key.
func (s *Server) MintToken(subject string, roles []identity.Role, ttl time.Duration) (string, error) {
	if s.apiIssuer == nil {
		return "", errors.New("server: mint token: server not started")
	}
	tok, _, err := s.apiIssuer.Mint(subject, roles, ttl)
	if err != nil {
		return "", fmt.Errorf("server: mint token: %w", err)
	}
	return tok, nil
}

// checkModuleSignature verifies a module's publisher signature over its
// sha256 against the trusted publishers. A missing or unreadable signature
// is invalid; a genuine-looking one this server does not trust, or one over
// other bytes, is denied.
func (v *service) checkModuleSignature(h *pb.RegisterModuleHeader, sha string) (identity.ModuleSignature, error) {
	if v.s.publishers == nil {
		return identity.ModuleSignature{}, fmt.Errorf("no trusted module publishers are configured (fleetlearn-server --module-publishers): %w",
			backend.ErrPrecondition)
	}
	if len(h.GetSignature()) == 0 {
		return identity.ModuleSignature{}, invalid("module is unsigned: sign it with a trusted publisher key (fleetlearn module register --signing-key)")
	}
	sig, err := v.s.publishers.VerifyModuleSHA256(sha, string(h.GetSignature()))
	switch {
	case errors.Is(err, identity.ErrMalformedToken):
		return identity.ModuleSignature{}, invalid("module signature: %v", err)
	case err != nil:
		return identity.ModuleSignature{}, fmt.Errorf("module signature: %v: %w", err, backend.ErrDenied)
	case sig.Name != h.GetName():
		return identity.ModuleSignature{}, invalid("the signature names the module %q, the request %q", sig.Name, h.GetName())
	}
	return sig, nil
}
