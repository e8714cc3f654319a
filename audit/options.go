package audit

import (
	"io"
	"log/slog"
	"time"
)

// DefaultOrigin names a new log when WithOrigin is not given.
const DefaultOrigin = "fleetlearn/audit"

// DefaultMaxBatch caps how many entries one group commit writes.
const DefaultMaxBatch = 4096

// Option configures Open.
type Option func(*config)

type config struct {
	now      func() time.Time
	logger   *slog.Logger
	rand     io.Reader
	keys     *Keys
	origin   string
	maxBatch int
	// database is WithDatabase's PostgreSQL URL; empty for the SQLite file.
	database string
	// witnesses are the witness verifier keys of WithWitnesses.
	witnesses []string
}

func newConfig(opts []Option) config {
	c := config{now: time.Now, logger: slog.New(slog.DiscardHandler), maxBatch: DefaultMaxBatch}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

// WithClock sets the clock that stamps events and checkpoints.
func WithClock(now func() time.Time) Option {
	return func(c *config) {
		if now != nil {
			c.now = now
		}
	}
}

// WithLogger sets where the log reports what it does; by default nowhere.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.logger = l
		}
	}
}

// WithRand sets the randomness for generating keys on first open; by
// default crypto/rand.
func WithRand(r io.Reader) Option {
	return func(c *config) { c.rand = r }
}

// WithKeys supplies the keys instead of the keys file in the log's folder
// (for keys kept in a secret store). They must be the keys the log was
// created with.
func WithKeys(k Keys) Option {
	return func(c *config) { c.keys = &k }
}

// WithOrigin names a new log; its checkpoints start with this line and its
// checkpoint key carries this name. An existing log must be opened with the
// same origin or none. The origin should be a schema-less URL naming the
// deployment, such as "fleetlearn.example.com/audit".
func WithOrigin(origin string) Option {
	return func(c *config) { c.origin = origin }
}

// WithMaxBatch caps the entries of one group commit; n <= 0 keeps
// DefaultMaxBatch.
func WithMaxBatch(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.maxBatch = n
		}
	}
}

// WithWitnesses names the witnesses whose cosignatures of its checkpoints
// the log accepts and stores (AddCosignature), by their verifier keys
// ("<name>+<hex key id>+<base64 of 0x04 and the Ed25519 public key>", as
// WitnessKey.VerifierKey writes them). Open refuses a malformed key.
func WithWitnesses(vkeys ...string) Option {
	return func(c *config) { c.witnesses = append(c.witnesses, vkeys...) }
}

// WithDatabase keeps the log's tables in the PostgreSQL database at url
// (postgres://user:password@host/db?..., or postgresql://) instead of in
// DBFile in the log's folder, so that the aggregators of a replicated
// deployment write one log: the folder then holds only the keys file,
// which every replica needs a copy of. One of them writes at a time; the
// last to Open deposes the one before it (see Open and ErrFenced).
// OpenReadOnly takes it too. The URL is a secret: the log never prints it.
func WithDatabase(url string) Option {
	return func(c *config) { c.database = url }
}
