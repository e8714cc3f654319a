// Package embedded holds Fleetlearn's example update modules (wasm/examples)
// as built WASM, so that the release binaries can hand them out without a Go
// toolchain or the source tree.
//
// The modules are built by `go generate` (internal/gen) with fixed flags
// (GOOS=wasip1 GOARCH=wasm -buildmode=c-shared -trimpath -buildvcs=false
// -ldflags=-buildid=), which makes the build reproducible: the same source
// and Go toolchain give the same bytes on any machine and in any directory.
// CI rebuilds them and fails when the committed bytes differ from what the
// source builds to. They are stored gzip-compressed; the SHA-256 recorded for
// each is that of the WASM bytes, as a server registers them.
package embedded

//go:generate go run ./internal/gen

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
)

// Module is one example update module.
type Module struct {
	Name        string // as in `fleetlearn module example NAME`
	Package     string // import path of its source
	Description string
	SHA256      string // lowercase hex digest of the WASM bytes
	Size        int    // length of the WASM bytes
	gz          []byte
}

// List returns the embedded modules, sorted by name.
func List() []Module {
	return slices.Clone(modules)
}

// Lookup returns the module called name, or an error wrapping [ErrUnknown].
func Lookup(name string) (Module, error) {
	for _, m := range modules {
		if m.Name == name {
			return m, nil
		}
	}
	return Module{}, fmt.Errorf("example module %q: %w", name, ErrUnknown)
}

// Code returns the module's WASM bytes, a fresh copy on every call. Their
// digest is checked against SHA256, so a corrupted embedding never reaches a
// sandbox or a server; a mismatch wraps [ErrCorrupt].
func (m Module) Code() ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(m.gz))
	if err != nil {
		return nil, fmt.Errorf("example module %s: %w: %w", m.Name, ErrCorrupt, err)
	}
	code := make([]byte, 0, m.Size)
	buf := bytes.NewBuffer(code)
	// One byte past Size is enough to tell a longer stream.
	if _, err := io.Copy(buf, io.LimitReader(zr, int64(m.Size)+1)); err != nil {
		return nil, fmt.Errorf("example module %s: %w: %w", m.Name, ErrCorrupt, err)
	}
	code = buf.Bytes()
	sum := sha256.Sum256(code)
	if got := hex.EncodeToString(sum[:]); len(code) != m.Size || got != m.SHA256 {
		return nil, fmt.Errorf("example module %s: %w: %d bytes with sha256 %s, recorded %d bytes with sha256 %s",
			m.Name, ErrCorrupt, len(code), got, m.Size, m.SHA256)
	}
	return code, nil
}
