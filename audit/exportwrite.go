package audit

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"

	"github.com/fleetlearn/fleetlearn/audit/internal/merkle"
	"github.com/fleetlearn/fleetlearn/audit/internal/note"
)

// ExportWriter writes the export format from parts, for a client that
// assembles an export from the log's API (keys, checkpoints and entries
// fetched separately) rather than from the database. VerifyExport reads
// what it writes exactly as it reads what (*Log).Export writes; nothing
// here vouches for the parts, the verifier judges them.
type ExportWriter struct {
	bw          *bufio.Writer
	enc         *json.Encoder
	entries     uint64 // announced in the header
	written     uint64
	checkpoints uint64
	tree        *merkle.Tree // with WithLeafHashes: proofs for every entry
	proveSize   uint64       // tree size of the latest checkpoint
	err         error        // sticky: a writer that failed once writes nothing more
}

// WriterOption configures an ExportWriter.
type WriterOption func(*writerConfig)

type writerConfig struct {
	leaves []merkle.Hash
	proofs bool
}

// WithLeafHashes makes the writer add proofs as (*Log).Export does with
// WithProofs: consistency between consecutive checkpoints, and each
// entry's inclusion in the tree of the latest checkpoint. leaves are the
// hashes of all entries to be written (LeafHash of each entry's bytes, as
// a first pass over the entries computes them); WriteEntry refuses an entry
// whose hash differs, as it would if the source changed between passes.
func WithLeafHashes(leaves [][32]byte) WriterOption {
	return func(c *writerConfig) { c.leaves, c.proofs = leaves, true }
}

// NewExportWriter writes the header for an export of the given number of
// entries with keys pub, followed by the checkpoint notes, oldest first
// (the last is the latest). The export has no proofs.
func NewExportWriter(w io.Writer, pub PublicKeys, checkpoints [][]byte, entries uint64, opts ...WriterOption) (*ExportWriter, error) {
	var cfg writerConfig
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	jwks, err := pub.JWKS()
	if err != nil {
		return nil, fmt.Errorf("audit: export writer: %w", err)
	}
	if pub.Origin == "" || pub.VerifierKey == "" {
		return nil, fmt.Errorf("audit: export writer: origin and verifier key are required: %w", ErrInvalidKeys)
	}
	if entries > maxLeaves {
		return nil, fmt.Errorf("audit: export writer: %d entries: %w", entries, ErrTooLarge)
	}
	x := &ExportWriter{bw: bufio.NewWriterSize(w, 1<<16), entries: entries, checkpoints: uint64(len(checkpoints))}
	var sizes []uint64
	if cfg.proofs {
		if uint64(len(cfg.leaves)) != entries {
			return nil, fmt.Errorf("audit: export writer: %d leaf hashes for %d entries: %w", len(cfg.leaves), entries, ErrExportFormat)
		}
		v, err := note.ParseVerifier(pub.VerifierKey)
		if err != nil {
			return nil, fmt.Errorf("audit: export writer: %w: %w", ErrInvalidKeys, err)
		}
		for i, n := range checkpoints {
			cp, err := openCheckpoint(n, v)
			if err != nil {
				return nil, fmt.Errorf("audit: export writer: checkpoint %d: %w", i, err)
			}
			sizes = append(sizes, cp.Size)
		}
		if len(sizes) == 0 || sizes[len(sizes)-1] > entries {
			return nil, fmt.Errorf("audit: export writer: proofs need a latest checkpoint within the %d entries: %w", entries, ErrExportFormat)
		}
		x.tree, x.proveSize = merkle.NewTree(cfg.leaves), sizes[len(sizes)-1]
	}
	x.enc = json.NewEncoder(x.bw)
	x.enc.SetEscapeHTML(false)
	err = x.enc.Encode(exportHeader{Kind: "header", Format: ExportFormat, Version: ExportVersion, Origin: pub.Origin,
		EntryKeys: jwks, CheckpointVKey: pub.VerifierKey, Entries: entries, Checkpoints: x.checkpoints})
	for i, n := range checkpoints {
		if err != nil {
			break
		}
		if len(n) == 0 {
			return nil, fmt.Errorf("audit: export writer: checkpoint %d is empty: %w", i, ErrExportFormat)
		}
		rec := exportCheckpoint{Kind: "checkpoint", Note: string(n)}
		if x.tree != nil && i > 0 {
			if p, ok := x.tree.ConsistencyProof(sizes[i-1], sizes[i]); ok && sizes[i-1] < sizes[i] {
				rec.Consistency = &inlineProof{FromSize: ptr(sizes[i-1]), Proof: hexList(p)}
			}
		}
		err = x.enc.Encode(rec)
	}
	if err != nil {
		return nil, fmt.Errorf("audit: export writer: %w", err)
	}
	return x, nil
}

// WriteEntry writes the next entry. Entries must come in index order from
// 0, no more than announced. leafHash is the hash the log reported for the
// entry (32 bytes), or nil to leave it out.
func (x *ExportWriter) WriteEntry(e Entry, leafHash []byte) error {
	if x.err != nil {
		return x.err
	}
	switch {
	case x.written == x.entries:
		return x.fail(fmt.Errorf("entry %d beyond the %d announced: %w", e.Index, x.entries, ErrExportFormat))
	case e.Index != x.written:
		return x.fail(fmt.Errorf("entry %d where %d is next: %w", e.Index, x.written, ErrExportFormat))
	case leafHash != nil && len(leafHash) != len(LeafHash(nil)):
		return x.fail(fmt.Errorf("entry %d: leaf hash of %d bytes: %w", e.Index, len(leafHash), ErrExportFormat))
	case len(e.Data) == 0 || len(e.Data) > MaxEntryBytes:
		return x.fail(fmt.Errorf("entry %d of %d bytes: %w", e.Index, len(e.Data), ErrMalformedEntry))
	}
	rec := exportEntry{Kind: "entry", Index: e.Index, JWS: string(e.Data)}
	if leafHash != nil {
		rec.LeafHash = hex.EncodeToString(leafHash)
	}
	if x.tree != nil {
		if merkle.LeafHash(e.Data) != x.tree.Leaf(e.Index) {
			return x.fail(fmt.Errorf("entry %d differs from the one its proofs were computed from: %w", e.Index, ErrExportFormat))
		}
		if p, ok := x.tree.InclusionProof(e.Index, x.proveSize); ok {
			rec.Inclusion = &inlineProof{TreeSize: ptr(x.proveSize), Proof: hexList(p)}
		}
	}
	if err := x.enc.Encode(rec); err != nil {
		return x.fail(err)
	}
	x.written++
	return nil
}

// Close checks that every announced entry was written, writes the trailer
// and flushes. It does not close the underlying writer.
func (x *ExportWriter) Close() error {
	if x.err != nil {
		return x.err
	}
	if x.written != x.entries {
		return x.fail(fmt.Errorf("%d of %d announced entries written: %w", x.written, x.entries, ErrExportFormat))
	}
	if err := x.enc.Encode(exportEnd{Kind: "end", Entries: x.entries, Checkpoints: x.checkpoints}); err != nil {
		return x.fail(err)
	}
	if err := x.bw.Flush(); err != nil {
		return x.fail(err)
	}
	x.err = fmt.Errorf("audit: export writer: written and closed: %w", ErrClosed)
	return nil
}

func (x *ExportWriter) fail(err error) error {
	x.err = fmt.Errorf("audit: export writer: %w", err)
	return x.err
}
