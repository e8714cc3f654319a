package demo

import (
	"crypto/ed25519"
	"fmt"

	"github.com/fleetlearn/fleetlearn/identity"
)

// newPublisher makes the demo's module publisher: a key that lives only
// for the run, and the JWK Set that makes the demo's server trust it.
func newPublisher() (*identity.Publisher, []byte, error) {
	key, err := identity.GenerateSigningKey()
	if err != nil {
		return nil, nil, fmt.Errorf("publisher key: %w", err)
	}
	p, err := identity.NewPublisher(key)
	if err != nil {
		return nil, nil, fmt.Errorf("publisher: %w", err)
	}
	jwks, err := identity.PublicJWKS(key.Public().(ed25519.PublicKey))
	if err != nil {
		return nil, nil, fmt.Errorf("publisher: %w", err)
	}
	return p, jwks, nil
}
