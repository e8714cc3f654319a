package edge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/wasm"
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
// module publishers. The key is the one the directory holds, or a new one;
// it never leaves the device.
//
// Nothing is written until the aggregator has answered and its answer has
// been checked, and a write that fails puts back what was there: a failed
// enrollment leaves the data directory as it found it (or absent). Refusals
// wrap ErrTokenRefused, ErrKeyRefused or ErrUnreachable.
func Enroll(ctx context.Context, cfg EnrollConfig) (*Enrollment, error) {
	if cfg.API == "" || cfg.Token == "" || cfg.DataDir == "" || len(cfg.CAPEM) == 0 {
		return nil, errors.New("edge: enroll: the API address, CA certificate, token and data directory are required")
	}
	keyPath := filepath.Join(cfg.DataDir, KeyFile)
	key, newKey, err := enrollmentKey(keyPath)
	if err != nil {
		return nil, fmt.Errorf("edge: enroll: %w", err)
	}
	tc, err := identity.ClientConfig(cfg.CAPEM, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("edge: enroll: CA certificate: %w", err)
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
		DeviceId: cfg.DeviceID, Attributes: &pb.DeviceAttributes{AgentVersion: Version, SupportedAbiVersions: wasm.SupportedABIVersions()}})
	if err != nil {
		return nil, enrollError(err, cfg, keyPath, newKey)
	}
	id := res.GetDevice().GetId()
	if err := wire.CheckToken("device", id); err != nil {
		return nil, fmt.Errorf("edge: enroll: server assigned %w", err)
	}
	var files []stagedFile
	if newKey {
		// First, so that credentials never sit in the directory without their key.
		files = append(files, stagedFile{name: KeyFile, data: append(key.Seed(), '\n'), exclusive: true})
	}
	if res.GetUserJwt() != "" {
		creds, err := identity.FormatCreds(res.GetUserJwt(), key.Seed())
		if err != nil {
			return nil, fmt.Errorf("edge: enroll: %w", err)
		}
		files = append(files, stagedFile{name: CredsFile, data: creds})
	}
	if jwks := res.GetModulePublishersJwks(); len(jwks) > 0 {
		if _, err := identity.ParseTrustedPublishers(jwks); err != nil {
			return nil, fmt.Errorf("edge: enroll: module publishers: %w", err)
		}
		files = append(files, stagedFile{name: PublishersFile, data: jwks})
	}
	if u := res.GetNatsUrl(); u != "" {
		files = append(files, stagedFile{name: NATSURLFile, data: []byte(u + "\n")})
	}
	files = append(files, stagedFile{name: CAFile, data: cfg.CAPEM}, stagedFile{name: idFile, data: []byte(id + "\n")})
	if err := commitFiles(cfg.DataDir, files); err != nil {
		return nil, fmt.Errorf("edge: enroll: enrolled as %s, but could not store the credentials (the token is spent; ask the operator to revoke %s and for a new token): %w", id, id, err)
	}
	return &Enrollment{DeviceID: id, KeyID: key.ID(), NATSURL: res.GetNatsUrl()}, nil
}

// enrollmentKey returns the key in path, or a new one (newKey) that is
// written only once the enrollment succeeds.
func enrollmentKey(path string) (key *identity.UserKey, newKey bool, err error) {
	switch _, err := os.Stat(path); {
	case err == nil:
		key, err := identity.LoadOrCreateUserKey(path)
		return key, false, err
	case !errors.Is(err, fs.ErrNotExist):
		return nil, false, err
	}
	key, err = identity.GenerateUserKey()
	return key, true, err
}

// enrollError says, once, why the aggregator refused an enrollment and what
// to do about it. The server's status messages repeat their causes'
// prefixes; they are matched against the identity package's sentinels and
// reworded rather than passed on.
func enrollError(err error, cfg EnrollConfig, keyPath string, newKey bool) error {
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("edge: enroll: %w", err)
	}
	msg := st.Message()
	has := func(e error) bool { return strings.Contains(msg, e.Error()) }
	const newToken = "ask the operator for a new one ('fleetlearn device token')"
	switch code := st.Code(); {
	case has(identity.ErrTokenReused):
		return fmt.Errorf("%w: it was already used; %s", ErrTokenRefused, newToken)
	case has(identity.ErrTokenExpired):
		return fmt.Errorf("%w: it has expired; %s", ErrTokenRefused, newToken)
	case has(identity.ErrWrongFleet):
		return fmt.Errorf("%w: it is for another fleet; %s", ErrTokenRefused, newToken)
	case has(identity.ErrMalformedToken), has(identity.ErrUnknownKey), has(identity.ErrBadSignature), has(identity.ErrInvalidToken):
		return fmt.Errorf("%w: the server at %s did not issue it, or it was not copied whole; check --api, or %s",
			ErrTokenRefused, cfg.API, newToken)
	case code == codes.PermissionDenied && strings.Contains(msg, "revoked"):
		return fmt.Errorf("%w: this device's key (%s) was revoked; enroll into a new, empty data directory (the token is still good)",
			ErrKeyRefused, keyPath)
	case code == codes.AlreadyExists && cfg.DeviceID != "" && strings.Contains(msg, "device id"):
		return fmt.Errorf("edge: enroll: device id %s is taken; choose another, or let the server assign one (the token is still good)", cfg.DeviceID)
	case code == codes.AlreadyExists && !newKey:
		return fmt.Errorf("%w: this device's key (%s) is already enrolled; run the agent with this data directory, or enroll into a new, empty one",
			ErrKeyRefused, keyPath)
	case code == codes.Unavailable && (strings.Contains(msg, "x509") || strings.Contains(msg, "handshake")):
		return fmt.Errorf("%w: the TLS certificate of %s does not verify (%s); use the server's tls/ca.crt as the CA, and an address its certificate names (fleetlearn-server --tls-hosts)",
			ErrUnreachable, cfg.API, dialDetail(msg))
	case code == codes.Unavailable, code == codes.DeadlineExceeded:
		return fmt.Errorf("%w: %s (%s); check the address, that fleetlearn-server is running and that its API (--grpc-addr) is reachable from this device",
			ErrUnreachable, cfg.API, dialDetail(msg))
	}
	return fmt.Errorf("edge: enroll: %s (%s)", msg, st.Code())
}

// dialDetail is the cause inside a gRPC transport error's message, without
// the transport's own wrapping.
func dialDetail(msg string) string {
	for _, p := range []string{"transport: Error while dialing: ", "transport: authentication handshake failed: "} {
		if _, after, ok := strings.Cut(msg, p); ok {
			return strings.TrimSuffix(after, `"`)
		}
	}
	return msg
}

// stagedFile is a file an enrollment writes into the data directory.
type stagedFile struct {
	name      string
	data      []byte
	exclusive bool // must not exist yet (the device key)
}

// commitFiles writes files into dir, creating it if need be. On a failure it
// puts back what it replaced and removes what it created, dir included.
func commitFiles(dir string, files []stagedFile) (err error) {
	created, err := mkdirAll(dir)
	if err != nil {
		return err
	}
	type undo struct {
		path string
		old  []byte // nil: the file did not exist
	}
	var undos []undo
	defer func() {
		if err == nil {
			return
		}
		for _, u := range slices.Backward(undos) {
			if u.old == nil {
				os.Remove(u.path)
			} else {
				atomicfile.WriteFile(u.path, u.old, 0o600)
			}
		}
		for _, d := range slices.Backward(created) {
			os.Remove(d) // only if empty: nothing of anyone else's goes
		}
	}()
	for _, f := range files {
		path := filepath.Join(dir, f.name)
		if f.exclusive {
			if err := atomicfile.WriteNew(path, f.data, 0o600); err != nil {
				return err
			}
			undos = append(undos, undo{path: path})
			continue
		}
		old, err := os.ReadFile(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			old = nil
		case err != nil:
			return err
		case old == nil:
			old = []byte{}
		}
		if err := atomicfile.WriteFile(path, f.data, 0o600); err != nil {
			return err
		}
		undos = append(undos, undo{path: path, old: old})
	}
	return nil
}

// mkdirAll is os.MkdirAll (mode 0700) that returns the directories it
// created, outermost first.
func mkdirAll(dir string) ([]string, error) {
	var missing []string
	for d := filepath.Clean(dir); ; {
		if _, err := os.Stat(d); err == nil {
			break
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		missing = append(missing, d)
		parent := filepath.Dir(d)
		if parent == d {
			break
		}
		d = parent
	}
	slices.Reverse(missing)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return missing, nil
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
