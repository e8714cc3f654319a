package model

// Default limits for reading safetensors from untrusted sources.
const (
	DefaultMaxHeaderBytes = 100 << 20 // the JSON header
	DefaultMaxTensorBytes = 4 << 30   // the byte buffer, in the file's dtypes
)

// ReadOption configures ReadSafetensors and DecodeSafetensors.
type ReadOption func(*readConfig)

type readConfig struct {
	maxHeaderBytes int64
	maxTensorBytes int64
}

func newReadConfig(opts []ReadOption) readConfig {
	c := readConfig{maxHeaderBytes: DefaultMaxHeaderBytes, maxTensorBytes: DefaultMaxTensorBytes}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

// WithMaxHeaderBytes caps the JSON header length; larger headers fail with
// ErrTooLarge before being read. n <= 0 keeps DefaultMaxHeaderBytes.
func WithMaxHeaderBytes(n int64) ReadOption {
	return func(c *readConfig) {
		if n > 0 {
			c.maxHeaderBytes = n
		}
	}
}

// WithMaxTensorBytes caps the byte buffer the header may describe, counted in
// the file's dtypes (an F16 buffer takes twice its size once converted to
// float32). Larger files fail with ErrTooLarge before any data is read.
// n <= 0 keeps DefaultMaxTensorBytes.
func WithMaxTensorBytes(n int64) ReadOption {
	return func(c *readConfig) {
		if n > 0 {
			c.maxTensorBytes = n
		}
	}
}
