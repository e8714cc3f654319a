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
	size           int64 // input length if known, else -1
}

func newReadConfig(opts []ReadOption) readConfig {
	c := readConfig{maxHeaderBytes: DefaultMaxHeaderBytes, maxTensorBytes: DefaultMaxTensorBytes, size: -1}
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

// WithInputSize tells ReadSafetensors that its input is exactly n bytes, as
// a download's metadata states: a header that disagrees is refused before any
// tensor is read, and tensors are allocated at full size instead of growing
// as bytes arrive. n < 0 means unknown (the default).
func WithInputSize(n int64) ReadOption {
	return func(c *readConfig) { c.size = max(n, -1) }
}
