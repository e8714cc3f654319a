package identity_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	natsjwt "github.com/nats-io/jwt/v2"

	"github.com/fleetlearn/fleetlearn/identity"
)

// TestToolUserJWT: tool users belong to their role's account, lapse when
// asked, and hold the role's permissions; no tool user may publish on the
// protocol's subjects. The cli tests show a real server enforcing them.
func TestToolUserJWT(t *testing.T) {
	a, err := identity.LoadOrCreateAuthority("fleetlearn", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	key, err := identity.GenerateUserKey()
	if err != nil {
		t.Fatal(err)
	}
	expires := time.Now().Add(time.Hour).Truncate(time.Second)
	for _, role := range identity.NATSToolRoles {
		tok, err := a.ToolUserJWT(role, "tool", key.ID(), expires)
		if err != nil {
			t.Fatalf("%s: %v", role, err)
		}
		c, err := natsjwt.DecodeUserClaims(tok)
		if err != nil {
			t.Fatal(err)
		}
		want := a.AccountPublicKey()
		if role == identity.NATSSystem {
			want = a.SystemAccountPublicKey()
		}
		if c.Issuer != want || c.Subject != key.ID() || c.Expires != expires.Unix() || c.Name != "tool" {
			t.Errorf("%s: issuer %s subject %s expires %d name %q", role, c.Issuer, c.Subject, c.Expires, c.Name)
		}
		perms, _ := identity.ToolPermissions(role)
		if !slices.Equal(c.Pub.Allow, perms.Pub.Allow) || !slices.Equal(c.Sub.Allow, perms.Sub.Allow) {
			t.Errorf("%s: JWT permissions %+v, want %+v", role, c.Permissions, perms)
		}
		for _, p := range c.Pub.Allow {
			if p == ">" || p == "fl.>" || len(p) > 3 && p[:3] == "fl." {
				t.Errorf("%s may publish on %s", role, p)
			}
		}
	}
	for name, call := range map[string]func() (string, error){
		"unknown role": func() (string, error) { return a.ToolUserJWT("root", "tool", key.ID(), expires) },
		"no expiry":    func() (string, error) { return a.ToolUserJWT(identity.NATSObserver, "tool", key.ID(), time.Time{}) },
		"past expiry": func() (string, error) {
			return a.ToolUserJWT(identity.NATSObserver, "tool", key.ID(), time.Now().Add(-time.Minute))
		},
		"dotted name": func() (string, error) { return a.ToolUserJWT(identity.NATSObserver, "a.b", key.ID(), expires) },
	} {
		if _, err := call(); !errors.Is(err, identity.ErrBadInput) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := a.ToolUserJWT(identity.NATSObserver, "tool", a.AccountPublicKey(), expires); !errors.Is(err, identity.ErrBadKey) {
		t.Errorf("account key as user key: %v", err)
	}
}
