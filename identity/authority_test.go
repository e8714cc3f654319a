package identity_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	natsjwt "github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/fleetlearn/fleetlearn/identity"
)

func TestAuthorityKeysPersist(t *testing.T) {
	dir := t.TempDir()
	a, err := identity.LoadOrCreateAuthority("fleetlearn", dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := identity.LoadOrCreateAuthority("fleetlearn", dir)
	if err != nil {
		t.Fatal(err)
	}
	if a.OperatorPublicKey() != b.OperatorPublicKey() || a.AccountPublicKey() != b.AccountPublicKey() || a.SystemAccountPublicKey() != b.SystemAccountPublicKey() {
		t.Fatal("keys changed on reload")
	}
	for _, f := range []string{identity.OperatorSeedFile, identity.AccountSeedFile, identity.SystemSeedFile} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", f, err, st)
		}
	}
	if err := os.Chmod(filepath.Join(dir, identity.AccountSeedFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := identity.LoadOrCreateAuthority("fleetlearn", dir); !errors.Is(err, identity.ErrKeyFileMode) {
		t.Fatalf("0644 seed: %v", err)
	}
}

func TestAuthorityJWTs(t *testing.T) {
	a, err := identity.LoadOrCreateAuthority("fleetlearn", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	user, _ := identity.GenerateUserKey()
	revoked, _ := identity.GenerateUserKey()
	at := time.Unix(1_800_000_000, 0)
	acct, err := a.AccountJWT([]identity.Revocation{{UserKey: revoked.ID(), At: at}})
	if err != nil {
		t.Fatal(err)
	}
	ac, err := natsjwt.DecodeAccountClaims(acct)
	if err != nil {
		t.Fatal(err)
	}
	if ac.Issuer != a.OperatorPublicKey() || ac.Name != identity.FleetAccount || !ac.Limits.IsJSEnabled() || !ac.Limits.DisallowBearer ||
		ac.Revocations[revoked.ID()] != at.Unix() || ac.Revocations[user.ID()] != 0 {
		t.Fatalf("account claims %+v", ac)
	}
	dj, err := a.DeviceUserJWT("dev-1", user.ID(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	uc, err := natsjwt.DecodeUserClaims(dj)
	if err != nil {
		t.Fatal(err)
	}
	if uc.Issuer != a.AccountPublicKey() || uc.Subject != user.ID() || uc.Name != "dev-1" || uc.Expires != 0 ||
		!uc.Pub.Allow.Contains("fl.report.*.*.dev-1") || !uc.Pub.Allow.Contains("fl.chunk.*.*.dev-1") || !uc.Sub.Allow.Contains("_INBOX_dev-1.>") {
		t.Fatalf("device claims %+v", uc)
	}
	creds, err := identity.FormatCreds(dj, user.Seed())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := nkeys.ParseDecoratedJWT(creds); err != nil || got != dj {
		t.Fatalf("creds jwt: %v", err)
	}
	if kp, err := nkeys.ParseDecoratedNKey(creds); err != nil {
		t.Fatal(err)
	} else if pub, _ := kp.PublicKey(); pub != user.ID() {
		t.Fatal("creds seed is not the user's")
	}
	conf, err := a.ResolverConfig("/var/lib/nats/jwt", acct)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"operator: ", "system_account: " + a.SystemAccountPublicKey(), "type: full",
		a.AccountPublicKey() + ": " + acct, a.SystemAccountPublicKey() + ": "} {
		if !strings.Contains(conf, want) {
			t.Errorf("resolver config lacks %q:\n%s", want, conf)
		}
	}
}

func TestAuthorityRefuses(t *testing.T) {
	a, err := identity.LoadOrCreateAuthority("fleetlearn", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	user, _ := identity.GenerateUserKey()
	acctKP, _ := nkeys.CreateAccount()
	acctPub, _ := acctKP.PublicKey()
	for name, f := range map[string]func() error{
		"device with dot":     func() error { _, err := a.DeviceUserJWT("dev.1", user.ID(), time.Time{}); return err },
		"device wildcard":     func() error { _, err := a.DeviceUserJWT("*", user.ID(), time.Time{}); return err },
		"device empty":        func() error { _, err := a.DeviceUserJWT("", user.ID(), time.Time{}); return err },
		"account key as user": func() error { _, err := a.DeviceUserJWT("dev-1", acctPub, time.Time{}); return err },
		"expiry in the past":  func() error { _, err := a.DeviceUserJWT("dev-1", user.ID(), time.Now().Add(-time.Hour)); return err },
		"service bad name":    func() error { _, err := a.ServiceUserJWT("a b", user.ID(), time.Time{}); return err },
		"revoke non-user": func() error {
			_, err := a.AccountJWT([]identity.Revocation{{UserKey: acctPub, At: time.Now()}})
			return err
		},
		"revoke without time":  func() error { _, err := a.AccountJWT([]identity.Revocation{{UserKey: user.ID()}}); return err },
		"resolver dir quote":   func() error { _, err := a.ResolverConfig(`a"b`); return err },
		"resolver foreign jwt": func() error { return foreignResolver(t, a) },
	} {
		if err := f(); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	op, _ := nkeys.CreateOperator()
	opSeed, _ := op.Seed()
	acSeed, _ := acctKP.Seed()
	userSeed := user.Seed()
	for name, seeds := range map[string][3][]byte{
		"user as operator":    {userSeed, acSeed, acSeed},
		"same account twice":  {opSeed, acSeed, acSeed},
		"operator as account": {opSeed, opSeed, acSeed},
		"garbage":             {[]byte("x"), acSeed, acSeed},
	} {
		if _, err := identity.NewAuthority("fleetlearn", seeds[0], seeds[1], seeds[2]); !errors.Is(err, identity.ErrBadKey) {
			t.Errorf("%s: %v", name, err)
		}
	}
	sys, _ := nkeys.CreateAccount()
	sysSeed, _ := sys.Seed()
	if _, err := identity.NewAuthority("bad name", opSeed, acSeed, sysSeed); !errors.Is(err, identity.ErrBadInput) {
		t.Errorf("bad name: %v", err)
	}
	if _, err := identity.NewAuthority("ok", opSeed, acSeed, sysSeed); err != nil {
		t.Errorf("valid seeds: %v", err)
	}
}

func foreignResolver(t *testing.T, a *identity.Authority) error {
	other, err := identity.LoadOrCreateAuthority("other", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	j, err := other.AccountJWT(nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.ResolverConfig("/jwt", j)
	return err
}
