package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetlearn/fleetlearn/identity"
)

// ErrConfig reports unusable connection settings.
var ErrConfig = errors.New("client: bad connection settings")

// DialOption configures Dial.
type DialOption func(*dialConfig)

type dialConfig struct {
	token    string
	caPEM    []byte
	insecure bool
	grpcOpts []grpc.DialOption
}

// WithToken sends token as the bearer token of every call.
func WithToken(token string) DialOption {
	return func(c *dialConfig) { c.token = strings.TrimSpace(token) }
}

// WithCA trusts only the CA certificate(s) in caPEM (a server's
// tls/ca.crt) instead of the system roots.
func WithCA(caPEM []byte) DialOption {
	return func(c *dialConfig) { c.caPEM = caPEM }
}

// WithInsecure connects without TLS, to a server started with
// --grpc-insecure. The bearer token then crosses the network in the clear.
func WithInsecure() DialOption {
	return func(c *dialConfig) { c.insecure = true }
}

// WithGRPCOptions adds options to the underlying grpc.NewClient call.
func WithGRPCOptions(opts ...grpc.DialOption) DialOption {
	return func(c *dialConfig) { c.grpcOpts = append(c.grpcOpts, opts...) }
}

// Dial makes a client connection to a Fleetlearn API at target: TLS
// verified against WithCA's certificate (or the system roots), and the
// WithToken bearer token on every call. Like grpc.NewClient it connects
// lazily.
func Dial(target string, opts ...DialOption) (*grpc.ClientConn, error) {
	var c dialConfig
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	var creds credentials.TransportCredentials
	switch {
	case c.insecure && c.caPEM != nil:
		return nil, fmt.Errorf("%w: a CA certificate and plaintext together", ErrConfig)
	case c.insecure:
		creds = insecure.NewCredentials()
	case c.caPEM != nil:
		cfg, err := identity.ClientConfig(c.caPEM, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		creds = credentials.NewTLS(cfg)
	default:
		creds = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})
	}
	gopts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if c.token != "" {
		gopts = append(gopts, grpc.WithPerRPCCredentials(bearer{token: c.token, secure: !c.insecure}))
	}
	conn, err := grpc.NewClient(target, append(gopts, c.grpcOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("client: dial %s: %w", target, err)
	}
	return conn, nil
}

// bearer is the per-call "authorization: Bearer <token>" metadata.
type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity keeps a token off plaintext connections unless
// WithInsecure asked for them.
func (b bearer) RequireTransportSecurity() bool { return b.secure }

// ReadToken reads a bearer token file (such as a server's admin.token),
// refusing an empty one.
func ReadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("client: token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" || len(tok) > identity.MaxTokenBytes || strings.ContainsAny(tok, " \t\r\n") {
		return "", fmt.Errorf("%w: %s does not hold one token", ErrConfig, path)
	}
	return tok, nil
}
