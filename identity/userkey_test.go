package identity_test

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/fleetlearn/fleetlearn/identity"
)

func TestUserKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys", "device.nk")
	k, err := identity.LoadOrCreateUserKey(path, identity.WithRand(newDetRand("dev")))
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", st.Mode())
	}
	again, err := identity.LoadOrCreateUserKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if again.ID() != k.ID() || !bytes.Equal(again.PrivateKey(), k.PrivateKey()) {
		t.Fatal("reloaded key differs")
	}
	// The nkey and the Ed25519 view agree: an nkeys signature verifies with
	// the Ed25519 public key and the other way round.
	kp, err := nkeys.FromSeed(k.Seed())
	if err != nil {
		t.Fatal(err)
	}
	if pub, _ := kp.PublicKey(); pub != k.ID() || k.ID()[0] != 'U' {
		t.Fatalf("id %s, nkey %s", k.ID(), pub)
	}
	msg := []byte("nonce")
	sig, _ := kp.Sign(msg)
	if !ed25519.Verify(k.PublicKey(), msg, sig) {
		t.Fatal("nkey signature does not verify with the Ed25519 key")
	}
	own, _ := k.Sign(msg)
	if err := kp.Verify(msg, own); err != nil {
		t.Fatal(err)
	}
	pub, err := identity.ParseUserKeyID(k.ID())
	if err != nil || !pub.Equal(k.PublicKey()) {
		t.Fatalf("ParseUserKeyID: %v", err)
	}
	// Too open a file is refused.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := identity.LoadOrCreateUserKey(path); !errors.Is(err, identity.ErrKeyFileMode) {
		t.Fatalf("0644 key: %v", err)
	}
}

func TestUserKeyBadInput(t *testing.T) {
	op, _ := nkeys.CreateOperator()
	opSeed, _ := op.Seed()
	opPub, _ := op.PublicKey()
	for name, seed := range map[string][]byte{
		"empty": nil, "garbage": []byte("SUXXXX"), "operator seed": opSeed, "public key": []byte(opPub),
	} {
		if _, err := identity.ParseUserKey(seed); !errors.Is(err, identity.ErrBadKey) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, id := range []string{"", opPub, "U123", "UAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"} {
		if _, err := identity.ParseUserKeyID(id); !errors.Is(err, identity.ErrBadKey) {
			t.Errorf("ParseUserKeyID(%q): %v", id, err)
		}
	}
	path := filepath.Join(t.TempDir(), "bad.nk")
	if err := os.WriteFile(path, []byte("not a seed"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := identity.LoadOrCreateUserKey(path); !errors.Is(err, identity.ErrBadKey) {
		t.Errorf("corrupt file: %v", err)
	}
}

func TestSigningKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.key")
	k, err := identity.LoadOrCreateSigningKey(path)
	if err != nil {
		t.Fatal(err)
	}
	again, err := identity.LoadOrCreateSigningKey(path)
	if err != nil || !again.Equal(k) {
		t.Fatalf("reload: %v", err)
	}
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := identity.LoadOrCreateSigningKey(path); !errors.Is(err, identity.ErrKeyFileMode) {
		t.Fatalf("0640: %v", err)
	}
	for name, b := range map[string][]byte{"empty": nil, "not pem": []byte("x"),
		"two blocks": append(append([]byte(nil), mustRead(t, path)...), mustRead(t, path)...)} {
		if _, err := identity.ParseSigningKey(b); !errors.Is(err, identity.ErrBadKey) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestKeyIDIsJWKThumbprint(t *testing.T) {
	// RFC 8037 appendix A.3: the thumbprint of its example Ed25519 key.
	x := []byte{0xd7, 0x5a, 0x98, 0x01, 0x82, 0xb1, 0x0a, 0xb7, 0xd5, 0x4b, 0xfe, 0xd3, 0xc9, 0x64, 0x07, 0x3a,
		0x0e, 0xe1, 0x72, 0xf3, 0xda, 0xa6, 0x23, 0x25, 0xaf, 0x02, 0x1a, 0x68, 0xf7, 0x07, 0x51, 0x1a}
	if got := identity.KeyID(ed25519.PublicKey(x)); got != "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k" {
		t.Fatalf("KeyID = %s", got)
	}
}
