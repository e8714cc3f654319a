package audit

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fleetlearn/fleetlearn/audit/internal/note"
)

// Checkpoint is a signed commitment to the log's first Size entries, a
// c2sp.org/tlog-checkpoint body ("<origin>\n<size>\n<base64 root>\n") in a
// c2sp.org/signed-note signed with the log's checkpoint key.
type Checkpoint struct {
	Origin string
	Size   uint64
	Root   [32]byte
	// Note is the signed note exactly as signed and stored.
	Note []byte
	// Signed is when the log signed it, as the log's clock read. It is
	// not part of the signed text.
	Signed time.Time
}

// checkpointText is the note body the log signs.
func checkpointText(origin string, size uint64, root [32]byte) []byte {
	return fmt.Appendf(nil, "%s\n%d\n%s\n", origin, size, base64.StdEncoding.EncodeToString(root[:]))
}

// ParseCheckpoint verifies a checkpoint note with the verifier key (vkey)
// and decodes its body. Extension lines after the root are allowed and
// ignored, as c2sp.org/tlog-checkpoint says.
func ParseCheckpoint(msg []byte, vkey string) (Checkpoint, error) {
	v, err := note.ParseVerifier(vkey)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("audit: checkpoint: %w: %w", ErrInvalidKeys, err)
	}
	return openCheckpoint(msg, v)
}

func openCheckpoint(msg []byte, v note.Verifier) (Checkpoint, error) {
	text, _, err := note.Open(msg, v)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("audit: checkpoint: %w: %w", ErrBadCheckpoint, err)
	}
	lines := strings.Split(strings.TrimSuffix(string(text), "\n"), "\n")
	if len(lines) < 3 || lines[0] == "" {
		return Checkpoint{}, fmt.Errorf("audit: checkpoint: %d lines: %w", len(lines), ErrBadCheckpoint)
	}
	size, err := strconv.ParseUint(lines[1], 10, 64)
	if err != nil || strconv.FormatUint(size, 10) != lines[1] {
		return Checkpoint{}, fmt.Errorf("audit: checkpoint: size %q: %w", lines[1], ErrBadCheckpoint)
	}
	root, err := base64.StdEncoding.Strict().DecodeString(lines[2])
	if err != nil || len(root) != 32 {
		return Checkpoint{}, fmt.Errorf("audit: checkpoint: root hash %q: %w", lines[2], ErrBadCheckpoint)
	}
	cp := Checkpoint{Origin: lines[0], Size: size, Note: bytes.Clone(msg)}
	copy(cp.Root[:], root)
	return cp, nil
}
