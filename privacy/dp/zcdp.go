package dp

import (
	"crypto/hmac"
	"crypto/sha512"
	"fmt"
	"math"
)

// EpsilonFromZCDP converts ρ-zCDP to (ε, δ)-DP: ρ-zCDP is (α, αρ)-RDP at
// every order α > 1, converted as EpsilonFromRDP does over orders (nil:
// OrdersOpacus, the orders of TF-Privacy's tree-aggregation accounting).
// It returns ε and the order that attains it.
func EpsilonFromZCDP(rho, delta float64, orders []float64) (eps, order float64, err error) {
	if !(rho >= 0) || math.IsInf(rho, 0) {
		return 0, 0, fmt.Errorf("dp: epsilon from zcdp: %w: rho %v, want a finite value ≥ 0", ErrInvalid, rho)
	}
	if orders == nil {
		orders = OrdersOpacus()
	}
	curve := make([]float64, len(orders))
	for i, a := range orders {
		curve[i] = a * rho
	}
	return EpsilonFromRDP(orders, curve, delta)
}

// DerivedSource is a Source whose keystream is a function of secret and
// label alone (HMAC-SHA-512 of label under secret): the same pair gives the
// same noise on any machine and after any restart, and without secret the
// noise is as unpredictable as a Source's. Correlated-noise mechanisms use
// it to regenerate the noise of a round, or of a tree node, instead of
// storing it. secret must hold at least 32 bytes.
func DerivedSource(secret []byte, label string) (*Source, error) {
	if len(secret) < 32 {
		return nil, fmt.Errorf("dp: derived source: %w: a secret of %d bytes, want at least 32", ErrInvalid, len(secret))
	}
	mac := hmac.New(sha512.New, secret)
	mac.Write([]byte(label))
	return newSourceFromSeed(mac.Sum(nil)[:48])
}
