package identity_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"time"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// An operator mints an enrollment token; the server redeems it once and
// certifies the device's key for NATS.
func Example_enrollment() {
	ctx := context.Background()
	key, _ := identity.GenerateSigningKey()
	issuer, _ := identity.NewEnrollmentIssuer(key)
	used, _ := identity.NewMemoryUsedTokens()
	verifier, _ := identity.NewEnrollmentVerifier("fleet-a", used, []ed25519.PublicKey{issuer.PublicKey()})

	token, _, _ := issuer.Mint("fleet-a", "", time.Hour)

	// On the device: a key that never leaves it.
	deviceKey, _ := identity.GenerateUserKey()

	// On the server: redeem, then certify the key as the device.
	claims, err := verifier.Redeem(ctx, token)
	fmt.Println("fleet:", claims.Fleet, err)
	_, err = verifier.Redeem(ctx, token)
	fmt.Println("again:", errors.Is(err, identity.ErrTokenReused))

	auth, _ := identity.NewAuthority("fleetlearn", newSeed("O"), newSeed("A"), newSeed("A"))
	userJWT, _ := auth.DeviceUserJWT("dev-1", deviceKey.ID(), time.Time{})
	creds, _ := identity.FormatCreds(userJWT, deviceKey.Seed())
	fmt.Println("creds:", len(creds) > 0)
	// Output:
	// fleet: fleet-a <nil>
	// again: true
	// creds: true
}

// API tokens carry roles; the policy decides per gRPC method.
func Example_apiToken() {
	key, _ := identity.GenerateSigningKey()
	issuer, _ := identity.NewAPIIssuer(key)
	verifier, _ := identity.NewAPIVerifier([]ed25519.PublicKey{issuer.PublicKey()})
	token, _, _ := issuer.Mint("audrey", []identity.Role{identity.RoleAuditor}, 24*time.Hour)

	p, _ := verifier.Verify(token)
	policy := identity.DefaultPolicy()
	fmt.Println(policy.Authorize("/fleetlearn.api.v1.AuditService/QueryEntries", p))
	fmt.Println(errors.Is(policy.Authorize("/fleetlearn.api.v1.TaskService/CreateTask", p), identity.ErrPermissionDenied))
	// Output:
	// <nil>
	// true
}

// A device signs what it reports; the server verifies with the key its
// user JWT certifies.
func ExampleSignReport() {
	deviceKey, _ := identity.GenerateUserKey()
	s := identity.ReportStatement{Kind: identity.ReportUpdate, Task: "mnist", Round: 4, Device: "dev-1",
		ModelVersion: "v1", ModuleSHA256: wire.SHA256([]byte("module")), PayloadSHA256: wire.SHA256([]byte("update")), NumExamples: 600,
		MetricsSHA256: wire.MetricsSHA256(map[string]float64{"loss": 0.5})}
	sig, _ := identity.SignReport(deviceKey.PrivateKey(), s)

	pub, _ := identity.ParseUserKeyID(deviceKey.ID())
	fmt.Println(identity.VerifyReport(pub, s, sig))
	s.NumExamples = 60000
	fmt.Println(errors.Is(identity.VerifyReport(pub, s, sig), identity.ErrBadSignature))
	// Output:
	// <nil>
	// true
}

// A publisher signs a module; devices trust the publisher's JWK Set.
func ExampleTrustedPublishers_VerifyModule() {
	key, _ := identity.GenerateSigningKey()
	pub, _ := identity.NewPublisher(key)
	module := []byte("\x00asm\x01\x00\x00\x00")
	sig, _ := pub.SignModule("mnist-train", module)

	jwks, _ := identity.PublicJWKS(key.Public().(ed25519.PublicKey))
	trusted, _ := identity.ParseTrustedPublishers(jwks)
	ms, err := trusted.VerifyModule(module, sig)
	fmt.Println(ms.Name, ms.KeyID == pub.KeyID(), err)
	_, err = trusted.VerifyModule([]byte("tampered"), sig)
	fmt.Println(errors.Is(err, identity.ErrHashMismatch))
	// Output:
	// mnist-train true <nil>
	// true
}
