package identity

import (
	"crypto/rand"
	"fmt"
	"io"
	"time"
)

// Option configures the issuers, verifiers and key helpers of this package.
// Each constructor reads the options that concern it and ignores the rest.
type Option func(*config)

type config struct {
	now    func() time.Time
	rand   io.Reader
	leeway time.Duration
	maxTTL time.Duration
}

// Defaults.
const (
	// DefaultLeeway is the clock skew tolerated on token expiry and issue times.
	DefaultLeeway = 30 * time.Second
	// DefaultEnrollmentMaxTTL bounds enrollment token lifetimes: they are
	// bearer secrets, handed out for one installation.
	DefaultEnrollmentMaxTTL = 7 * 24 * time.Hour
	// DefaultAPIMaxTTL bounds API bearer token lifetimes.
	DefaultAPIMaxTTL = 90 * 24 * time.Hour
)

// WithClock sets the clock used for issue times, expiry checks and
// certificate validity (time.Now by default).
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// WithRand sets the source of token ids and generated Ed25519 seeds
// (crypto/rand by default). ECDSA and X.509 generation always use the
// system source: the standard library ignores other readers since Go 1.26.
func WithRand(r io.Reader) Option { return func(c *config) { c.rand = r } }

// WithLeeway sets the clock skew tolerated when checking token times.
func WithLeeway(d time.Duration) Option { return func(c *config) { c.leeway = d } }

// WithMaxTTL sets the longest lifetime an issuer will mint a token with.
func WithMaxTTL(d time.Duration) Option { return func(c *config) { c.maxTTL = d } }

func newConfig(op string, defaultMaxTTL time.Duration, opts []Option) (config, error) {
	c := config{now: time.Now, rand: rand.Reader, leeway: DefaultLeeway, maxTTL: defaultMaxTTL}
	for _, o := range opts {
		o(&c)
	}
	switch {
	case c.now == nil:
		return c, fmt.Errorf("%s: %w: nil clock", op, ErrBadInput)
	case c.rand == nil:
		return c, fmt.Errorf("%s: %w: nil random source", op, ErrBadInput)
	case c.leeway < 0 || c.leeway > 10*time.Minute:
		return c, fmt.Errorf("%s: %w: leeway %v outside [0, 10m]", op, ErrBadInput, c.leeway)
	case c.maxTTL <= 0:
		return c, fmt.Errorf("%s: %w: max ttl %v must be positive", op, ErrBadInput, c.maxTTL)
	}
	return c, nil
}
