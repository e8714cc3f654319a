package edge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// Files an agent keeps in its data directory.
const (
	// KeyFile holds the device's nkey seed: its identity. It signs the NATS
	// connection's nonce, update reports and SecAgg messages.
	KeyFile = "device.nk"
	// CredsFile holds the NATS user JWT enrollment issued, with the seed.
	CredsFile = "device.creds"
	// PublishersFile holds the JWKS of module publishers the device trusts.
	PublishersFile = "publishers.jwks"
	// NATSURLFile holds the NATS URL enrollment named.
	NATSURLFile = "nats-url"
	// CAFile holds the aggregator's CA certificate, which also verifies its
	// NATS server when that serves TLS (a tls:// URL).
	CAFile = "ca.pem"
	idFile = "device-id"
)

// EnrollConfig says where and how to enroll.
type EnrollConfig struct {
	API      string // the aggregator's gRPC address
	CAPEM    []byte // the aggregator's CA certificate (PEM); its TLS certificate must chain to it
	Token    string // one-time enrollment token from an operator
	DataDir  string
	DeviceID string // requested id; empty lets the server choose
	Timeout  time.Duration
}

// Enrollment is what a device received.
type Enrollment struct {
	DeviceID string
	KeyID    string
	NATSURL  string
}

// Enroll presents a one-time token and the device's public key to the
// aggregator's EnrollmentService and stores what it gets back in the data
// directory: the device id, NATS credentials, the NATS URL and the trusted
// module publishers. The key is created on first use and never leaves the
// device.
func Enroll(ctx context.Context, cfg EnrollConfig) (*Enrollment, error) {
	if cfg.API == "" || cfg.Token == "" || cfg.DataDir == "" || len(cfg.CAPEM) == 0 {
		return nil, errors.New("edge: enroll: the API address, CA certificate, token and data directory are required")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("edge: enroll: %w", err)
	}
	key, err := identity.LoadOrCreateUserKey(filepath.Join(cfg.DataDir, KeyFile))
	if err != nil {
		return nil, fmt.Errorf("edge: enroll: %w", err)
	}
	tc, err := identity.ClientConfig(cfg.CAPEM, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("edge: enroll: %w", err)
	}
	conn, err := grpc.NewClient(cfg.API, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		return nil, fmt.Errorf("edge: enroll: %w", err)
	}
	defer conn.Close()
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	res, err := apiv1.NewEnrollmentServiceClient(conn).Enroll(ctx, &pb.EnrollRequest{Token: cfg.Token, KeyId: key.ID(),
		DeviceId: cfg.DeviceID, Attributes: &pb.DeviceAttributes{AgentVersion: Version, SupportedAbiVersions: []uint32{1}}})
	if err != nil {
		return nil, fmt.Errorf("edge: enroll: %w", err)
	}
	id := res.GetDevice().GetId()
	if err := wire.CheckToken("device", id); err != nil {
		return nil, fmt.Errorf("edge: enroll: server assigned %w", err)
	}
	write := func(name string, b []byte) error {
		return atomicfile.WriteFile(filepath.Join(cfg.DataDir, name), b, 0o600)
	}
	if res.GetUserJwt() != "" {
		creds, err := identity.FormatCreds(res.GetUserJwt(), key.Seed())
		if err != nil {
			return nil, fmt.Errorf("edge: enroll: %w", err)
		}
		if err := write(CredsFile, creds); err != nil {
			return nil, fmt.Errorf("edge: enroll: %w", err)
		}
	}
	if jwks := res.GetModulePublishersJwks(); len(jwks) > 0 {
		if _, err := identity.ParseTrustedPublishers(jwks); err != nil {
			return nil, fmt.Errorf("edge: enroll: module publishers: %w", err)
		}
		if err := write(PublishersFile, jwks); err != nil {
			return nil, fmt.Errorf("edge: enroll: %w", err)
		}
	}
	if u := res.GetNatsUrl(); u != "" {
		if err := write(NATSURLFile, []byte(u+"\n")); err != nil {
			return nil, fmt.Errorf("edge: enroll: %w", err)
		}
	}
	if err := write(CAFile, cfg.CAPEM); err != nil {
		return nil, fmt.Errorf("edge: enroll: %w", err)
	}
	if err := write(idFile, []byte(id+"\n")); err != nil {
		return nil, fmt.Errorf("edge: enroll: %w", err)
	}
	return &Enrollment{DeviceID: id, KeyID: key.ID(), NATSURL: res.GetNatsUrl()}, nil
}

// readOptional returns a data-directory file's contents, or nil when it is absent.
func readOptional(dir, name string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return b, err
}

// SavedNATSURL returns the NATS URL enrollment stored in dir, or "".
func SavedNATSURL(dir string) string {
	b, _ := readOptional(dir, NATSURLFile)
	return strings.TrimSpace(string(b))
}

// signReport signs what a report claims with the device key.
func (a *Agent) signReport(s identity.ReportStatement) ([]byte, error) {
	return identity.SignReport(a.key.PrivateKey(), s)
}

// checkModule verifies a plan's module signature against the trusted
// publishers, when the device has any: it runs no code the operator's
// publishers did not sign.
func (a *Agent) checkModule(ref *pb.ModuleRef) error {
	if a.publishers == nil {
		return nil
	}
	if _, err := a.publishers.VerifyModuleSHA256(ref.GetSha256(), string(ref.GetSignature())); err != nil {
		return fmt.Errorf("module %s: %w", ref.GetSha256(), err)
	}
	return nil
}

// natsTLS trusts the aggregator's CA from enrollment for a tls:// NATS URL.
func (a *Agent) natsTLS() (*tls.Config, error) {
	pem, err := os.ReadFile(filepath.Join(a.cfg.DataDir, CAFile))
	if err != nil {
		return nil, fmt.Errorf("edge: NATS TLS needs the aggregator's CA (enroll again): %w", err)
	}
	return identity.ClientConfig(pem, nil, nil)
}
