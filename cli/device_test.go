package cli_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/cli"
	"github.com/fleetlearn/fleetlearn/identity"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// TestDeviceCommands: an operator mints an enrollment token, a device
// redeems it, and the operator lists and revokes the device.
func TestDeviceCommands(t *testing.T) {
	h := servertest.New(t)
	tok, err := runServer(t, h, "device", "token", "--group", "north", "--ttl", "15m")
	if err != nil {
		t.Fatal(err)
	}
	key, err := identity.GenerateUserKey()
	if err != nil {
		t.Fatal(err)
	}
	res, err := apiv1.NewEnrollmentServiceClient(h.Dial(t, "")).Enroll(t.Context(), &pb.EnrollRequest{
		Token: strings.TrimSpace(tok), KeyId: key.ID(), Attributes: &pb.DeviceAttributes{DeviceClass: "gateway"}})
	if err != nil {
		t.Fatalf("enroll with the printed token: %v", err)
	}
	id := res.GetDevice().GetId()
	out, err := runServer(t, h, "device", "list")
	if err != nil || !strings.Contains(out, id) || !strings.Contains(out, "north") || !strings.Contains(out, "gateway") {
		t.Fatalf("device list = %q, %v", out, err)
	}
	if _, err := runServer(t, h, "device", "token", "--ttl", "0s"); !errors.Is(err, cli.ErrUsage) {
		t.Errorf("zero ttl: %v", err)
	}
	if _, err := runServer(t, h, "device", "revoke", id); err == nil {
		t.Error("revoke without --reason accepted")
	}
	if out, err := runServer(t, h, "device", "revoke", id, "--reason", "stolen"); err != nil || !strings.Contains(out, "revoked "+id) {
		t.Fatalf("revoke = %q, %v", out, err)
	}
	if out, _ := runServer(t, h, "device", "list"); strings.Contains(out, id) {
		t.Errorf("revoked device listed:\n%s", out)
	}
	if out, _ := runServer(t, h, "device", "list", "--all"); !strings.Contains(out, "stolen") {
		t.Errorf("device list --all:\n%s", out)
	}
}

// TestTokenMint: a token minted offline from the data directory carries
// its roles to the server.
func TestTokenMint(t *testing.T) {
	h := servertest.New(t)
	tok, err := run(t, "", "token", "mint", "--data-dir", h.Dir, "--subject", "audrey", "--role", "auditor", "--ttl", "1h")
	if err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, "audrey.token", []byte(tok))
	as := func(args ...string) (string, error) {
		return runWith(t, []cli.Option{cli.WithTerminal(false)}, "", append([]string{"--server", h.GRPCAddr(),
			"--ca", server.CAFile(h.Dir), "--token-file", path}, args...)...)
	}
	if _, err := as("task", "list"); err != nil {
		t.Errorf("auditor task list: %v", err)
	}
	if _, err := as("device", "token"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("auditor device token: %v", err)
	}
	for _, args := range [][]string{
		{"--subject", "x", "--role", "root"},
		{"--subject", "x", "--role", "admin", "--ttl", "2400h"},
		{"--subject", "", "--role", "admin"},
	} {
		if _, err := run(t, "", append([]string{"token", "mint", "--data-dir", h.Dir}, args...)...); !errors.Is(err, cli.ErrUsage) {
			t.Errorf("mint %v: %v", args, err)
		}
	}
	if _, err := run(t, "", "token", "mint", "--data-dir", t.TempDir(), "--subject", "x", "--role", "admin"); !errors.Is(err, cli.ErrInput) {
		t.Errorf("mint without a key: %v", err)
	}
}

// TestConnectionFlags: without a token or the CA the CLI says what is
// missing; contradictory flags are refused before dialing.
func TestConnectionFlags(t *testing.T) {
	h := servertest.New(t)
	_, err := runWith(t, nil, "", "--server", h.GRPCAddr(), "--ca", server.CAFile(h.Dir), "task", "list")
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "--token-file") {
		t.Errorf("no token: %v", err)
	}
	_, err = runWith(t, nil, "", "--server", h.GRPCAddr(), "--ca", server.CAFile(h.Dir), "--token", "bogus", "task", "list")
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "fleetlearn token mint") {
		t.Errorf("a refused token: %v", err)
	}
	_, err = runWith(t, nil, "", "--server", h.GRPCAddr(), "--token-file", server.AdminTokenPath(h.Dir), "task", "list")
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "--ca") {
		t.Errorf("no CA: %v", err)
	}
	env := map[string]string{cli.CAEnv: server.CAFile(h.Dir), cli.TokenFileEnv: server.AdminTokenPath(h.Dir),
		cli.ServerEnv: h.GRPCAddr()}
	if _, err := runWith(t, []cli.Option{cli.WithGetenv(func(k string) string { return env[k] })}, "", "task", "list"); err != nil {
		t.Errorf("from the environment: %v", err)
	}
	for name, args := range map[string][]string{
		"token and token file": {"--token", "x", "--token-file", server.AdminTokenPath(h.Dir)},
		"insecure and ca":      {"--insecure", "--ca", server.CAFile(h.Dir)},
	} {
		if _, err := runWith(t, nil, "", append(append([]string{"--server", h.GRPCAddr()}, args...), "task", "list")...); !errors.Is(err, cli.ErrUsage) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, args := range map[string][]string{
		"missing token file": {"--token-file", filepath.Join(t.TempDir(), "none")},
		"empty token file":   {"--token-file", writeFile(t, "empty", nil)},
		"ca not PEM":         {"--ca", writeFile(t, "ca.crt", []byte("hello"))},
	} {
		if _, err := runWith(t, nil, "", append(append([]string{"--server", h.GRPCAddr()}, args...), "task", "list")...); !errors.Is(err, cli.ErrInput) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestModuleSigning: a publisher key made by keygen signs modules the
// server trusts once it is given the printed JWK Set.
func TestModuleSigning(t *testing.T) {
	dir := t.TempDir()
	keyPath := filepath.Join(dir, "publisher.pem")
	jwks, err := run(t, "", "module", "keygen", keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(keyPath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	again, err := run(t, "", "module", "publisher-jwks", keyPath)
	if err != nil || again != jwks {
		t.Fatalf("publisher-jwks = %q, %v; keygen printed %q", again, err, jwks)
	}
	h := servertest.New(t, servertest.WithConfig(func(c *server.Config) { c.ModulePublishersJWKS = []byte(jwks) }))
	wasmPath := writeFile(t, "softmax.wasm", wasmtest.Build(t, wasmtest.Softmax))

	if _, err := runServer(t, h, "module", "register", wasmPath, "--name", "softmax"); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), "unsigned") {
		t.Errorf("unsigned: %v", err)
	}
	otherKey := filepath.Join(dir, "other.pem")
	if _, err := run(t, "", "module", "keygen", otherKey); err != nil {
		t.Fatal(err)
	}
	if _, err := runServer(t, h, "module", "register", wasmPath, "--name", "softmax", "--signing-key", otherKey); status.Code(err) != codes.PermissionDenied {
		t.Errorf("untrusted key: %v", err)
	}
	if _, err := runServer(t, h, "module", "register", wasmPath, "--name", "softmax", "--signing-key", filepath.Join(dir, "none.pem")); !errors.Is(err, cli.ErrInput) {
		t.Errorf("missing key: %v", err)
	}
	sig, err := run(t, "", "module", "sign", wasmPath, "--name", "softmax", "--signing-key", keyPath)
	if err != nil {
		t.Fatal(err)
	}
	sigPath := writeFile(t, "softmax.jws", []byte(sig))
	if _, err := runServer(t, h, "module", "register", wasmPath, "--name", "softmax", "--signature", sigPath, "--signing-key", keyPath); !errors.Is(err, cli.ErrUsage) {
		t.Errorf("both --signature and --signing-key: %v", err)
	}
	sha, err := runServer(t, h, "module", "register", wasmPath, "--name", "softmax", "--signature", sigPath)
	if err != nil {
		t.Fatalf("register with a signature file: %v", err)
	}
	out, err := runServer(t, h, "module", "get", strings.TrimSpace(sha))
	if err != nil || !strings.Contains(out, strings.TrimSpace(jwksKeyID(t, keyPath))) {
		t.Errorf("module get = %q, %v", out, err)
	}
}

func jwksKeyID(t *testing.T, keyPath string) string {
	t.Helper()
	b, err := os.ReadFile(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	k, err := identity.ParseSigningKey(b)
	if err != nil {
		t.Fatal(err)
	}
	p, err := identity.NewPublisher(k)
	if err != nil {
		t.Fatal(err)
	}
	return p.KeyID()
}
