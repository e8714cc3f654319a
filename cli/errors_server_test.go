package cli_test

import (
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/identity"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// TestServerErrorsSayEachThingOnce: refusals that come from package
// identity through the server to an agent or the CLI name the package and
// the condition once.
func TestServerErrorsSayEachThingOnce(t *testing.T) {
	h := servertest.New(t)
	once := func(t *testing.T, what, msg string, words ...string) {
		t.Helper()
		if strings.Count(msg, "identity") > 1 || strings.Contains(msg, "rpc error") {
			t.Errorf("%s: %q", what, msg)
		}
		t.Logf("%s: %s", what, msg)
		for _, w := range words {
			if n := strings.Count(msg, w); n != 1 {
				t.Errorf("%s: %q says %q %d times", what, msg, w, n)
			}
		}
	}

	// What an agent hears when its token was used before.
	key, err := identity.GenerateUserKey()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := h.Devices.CreateEnrollmentToken(t.Context(), &pb.CreateEnrollmentTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	enroll := apiv1.NewEnrollmentServiceClient(h.Conn)
	if _, err := enroll.Enroll(t.Context(), &pb.EnrollRequest{Token: tok.GetToken(), KeyId: key.ID()}); err != nil {
		t.Fatal(err)
	}
	other, err := identity.GenerateUserKey()
	if err != nil {
		t.Fatal(err)
	}
	_, err = enroll.Enroll(t.Context(), &pb.EnrollRequest{Token: tok.GetToken(), KeyId: other.ID()})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("reused token: %v", err)
	}
	once(t, "reused token", status.Convert(err).Message(), identity.ErrTokenReused.Error(), "enroll:")

	// What the CLI prints for a module signed by a key the server does not trust.
	dir := t.TempDir()
	stranger := filepath.Join(dir, "stranger.pem")
	if _, err := run(t, "", "module", "keygen", stranger); err != nil {
		t.Fatal(err)
	}
	_, err = runServer(t, h, "module", "register", writeFile(t, "m.wasm", wasmtest.Trivial()), "--name", "m", "--signing-key", stranger)
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("untrusted publisher: %v", err)
	}
	once(t, "untrusted publisher", err.Error(), identity.ErrUntrustedPublisher.Error())
}
