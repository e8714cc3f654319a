package audit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"

	"github.com/fleetlearn/fleetlearn/audit/internal/merkle"
	"github.com/fleetlearn/fleetlearn/audit/internal/note"
)

// ExportFormat is the "format" of an export's header line.
const ExportFormat = "fleetlearn-audit-export"

// ExportVersion is the export format version this package writes.
const ExportVersion = 1

// The export format is JSON lines: one JSON object per line, each with a
// "kind", in this order:
//
//	{"kind":"header","format":"fleetlearn-audit-export","version":1,"origin":...,
//	 "entry_keys":<JWKS>,"checkpoint_vkey":...,"entries":N,"checkpoints":K,"proofs":P}
//	K × {"kind":"checkpoint","note":<signed note>,"consistency":{"from_size":a,"proof":[<hex>...]}}
//	                                          oldest first; the last is the latest
//	P × {"kind":"inclusion","index":i,"size":s,"proof":[<hex>...]}
//	  or {"kind":"consistency","size1":a,"size2":b,"proof":[<hex>...]}
//	N × {"kind":"entry","index":i,"jws":<compact JWS>,"leaf_hash":<hex>,
//	     "inclusion":{"tree_size":s,"proof":[<hex>...]}}                in index order
//	{"kind":"end","entries":N,"checkpoints":K,"proofs":P}
//
// leaf_hash is the hash the log stored when it appended the entry (absent
// if the store has none); the verifier recomputes it and names the first
// entry whose bytes no longer match. With WithProofs every checkpoint but
// the first carries the consistency proof from the one before it, and
// every entry its inclusion proof in the tree of the latest checkpoint, so
// that a verifier written from RFC 9162 alone can check any one entry or
// checkpoint on its own. docs/AUDIT.md describes the format.

type exportHeader struct {
	Kind           string          `json:"kind"`
	Format         string          `json:"format"`
	Version        int             `json:"version"`
	Origin         string          `json:"origin"`
	EntryKeys      json.RawMessage `json:"entry_keys"`
	CheckpointVKey string          `json:"checkpoint_vkey"`
	Entries        uint64          `json:"entries"`
	Checkpoints    uint64          `json:"checkpoints"`
	Proofs         uint64          `json:"proofs"`
}

type exportCheckpoint struct {
	Kind        string       `json:"kind"`
	Note        string       `json:"note"`
	Consistency *inlineProof `json:"consistency,omitempty"`
}

// inlineProof is a proof carried by the record it is about: a consistency
// proof from the previous checkpoint (FromSize) on a checkpoint record, an
// inclusion proof in the tree of TreeSize leaves on an entry record.
type inlineProof struct {
	FromSize *uint64  `json:"from_size,omitempty"`
	TreeSize *uint64  `json:"tree_size,omitempty"`
	Proof    []string `json:"proof"`
}

type exportProof struct {
	Kind  string   `json:"kind"`
	Index *uint64  `json:"index,omitempty"`
	Size  *uint64  `json:"size,omitempty"`
	Size1 *uint64  `json:"size1,omitempty"`
	Size2 *uint64  `json:"size2,omitempty"`
	Proof []string `json:"proof"`
}

type exportEntry struct {
	Kind      string       `json:"kind"`
	Index     uint64       `json:"index"`
	JWS       string       `json:"jws"`
	LeafHash  string       `json:"leaf_hash,omitempty"`
	Inclusion *inlineProof `json:"inclusion,omitempty"`
}

type exportEnd struct {
	Kind        string `json:"kind"`
	Entries     uint64 `json:"entries"`
	Checkpoints uint64 `json:"checkpoints"`
	Proofs      uint64 `json:"proofs"`
}

// ExportOption configures Export.
type ExportOption func(*exportConfig)

type exportConfig struct {
	coveredOnly bool // stop at the latest checkpoint (a live log keeps growing)
	latestOnly  bool
	allProofs   bool
	inclusion   []uint64
	consistency []uint64
}

// WithLatestCheckpointOnly exports only the latest checkpoint instead of
// all of them.
func WithLatestCheckpointOnly() ExportOption {
	return func(c *exportConfig) { c.latestOnly = true }
}

// WithProofs adds to every checkpoint but the first the consistency proof
// from the checkpoint before it, and to every entry its inclusion proof in
// the tree of the latest checkpoint. The proofs are computed from the
// stored entries, whatever the stored tree says, so a damaged log exports
// proofs that fail where it is damaged. Memory grows by about 64 bytes per
// entry.
func WithProofs() ExportOption {
	return func(c *exportConfig) { c.allProofs = true }
}

// WithInclusionProofs adds inclusion proofs of these entries in the tree of
// the latest checkpoint.
func WithInclusionProofs(indices ...uint64) ExportOption {
	return func(c *exportConfig) { c.inclusion = append(c.inclusion, indices...) }
}

// WithConsistencyProofs adds consistency proofs from trees of these sizes
// (such as checkpoints an auditor kept) to the tree of the latest
// checkpoint.
func WithConsistencyProofs(sizes ...uint64) ExportOption {
	return func(c *exportConfig) { c.consistency = append(c.consistency, sizes...) }
}

// Export writes the whole log in the export format: the public keys, the
// checkpoints, any requested proofs and every entry, from one consistent
// snapshot. A writable log first signs a checkpoint and exports the entries
// it covers, so that the export verifies even while appends go on. A
// read-only log exports every stored row as it is, damaged or not covered
// by a checkpoint, for VerifyExport to judge. A writer another has deposed
// cannot sign (ErrFenced): export from the new writer or read-only.
func (l *Log) Export(ctx context.Context, w io.Writer, opts ...ExportOption) error {
	if err := l.live(); err != nil {
		return fmt.Errorf("audit: export: %w", err)
	}
	var cfg exportConfig
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if !l.readOnly {
		if _, err := l.Checkpoint(ctx); err != nil {
			return fmt.Errorf("audit: export: %w", err)
		}
		cfg.coveredOnly = true
	}
	tx, err := beginSnapshot(ctx, l.rdb)
	if err != nil {
		return fmt.Errorf("audit: export: %w", err)
	}
	defer tx.Rollback()
	bw := bufio.NewWriterSize(w, 1<<16)
	if err := l.export(ctx, tx, bw, cfg); err != nil {
		return fmt.Errorf("audit: export: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("audit: export: %w", err)
	}
	return nil
}

func (l *Log) export(ctx context.Context, tx snapshot, w *bufio.Writer, cfg exportConfig) error {
	q := "SELECT note FROM checkpoints ORDER BY seq"
	if cfg.latestOnly {
		q = "SELECT note FROM (SELECT seq, note FROM checkpoints ORDER BY seq DESC LIMIT 1) AS latest"
	}
	notes, err := queryBlobs(ctx, tx, q)
	if err != nil {
		return err
	}
	if notes, err = l.withCosignatures(ctx, tx, notes); err != nil {
		return err
	}
	var latest *Checkpoint
	if len(notes) > 0 {
		cp, err := openCheckpoint(notes[len(notes)-1], l.verifier)
		if err != nil && (cfg.coveredOnly || len(cfg.inclusion)+len(cfg.consistency) > 0) {
			return err
		}
		if err == nil {
			latest = &cp
		}
	}
	limit := int64(math.MaxInt64)
	if cfg.coveredOnly {
		if latest == nil {
			return fmt.Errorf("no checkpoint to export up to: %w", ErrNotFound)
		}
		limit = int64(latest.Size)
	}
	var entries uint64
	if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM entries WHERE idx < ?", limit).Scan(&entries); err != nil {
		return err
	}
	var tree *merkle.Tree
	if cfg.allProofs {
		if latest == nil {
			return fmt.Errorf("proofs need a checkpoint: %w", ErrNotFound)
		}
		if tree, err = leafTree(ctx, tx, limit, entries); err != nil {
			return err
		}
	}
	var proofs []exportProof
	if len(cfg.inclusion)+len(cfg.consistency) > 0 {
		if latest == nil {
			return fmt.Errorf("proofs need a checkpoint: %w", ErrNotFound)
		}
		if proofs, err = exportProofs(ctx, tx, latest.Size, cfg); err != nil {
			return err
		}
	}
	jwks, err := l.pub.JWKS()
	if err != nil {
		return err
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(exportHeader{Kind: "header", Format: ExportFormat, Version: ExportVersion, Origin: l.origin,
		EntryKeys: jwks, CheckpointVKey: l.pub.VerifierKey, Entries: entries,
		Checkpoints: uint64(len(notes)), Proofs: uint64(len(proofs))}); err != nil {
		return err
	}
	prev := uint64(0)
	for _, n := range notes {
		rec := exportCheckpoint{Kind: "checkpoint", Note: string(n)}
		if tree != nil {
			// A note that does not open is exported as it is, without a
			// proof, for the verifier to name.
			if cp, err := openCheckpoint(n, l.verifier); err == nil {
				if p, ok := tree.ConsistencyProof(prev, cp.Size); ok && prev < cp.Size {
					rec.Consistency = &inlineProof{FromSize: ptr(prev), Proof: hexList(p)}
				}
				prev = cp.Size
			}
		}
		if err := enc.Encode(rec); err != nil {
			return err
		}
	}
	for _, p := range proofs {
		if err := enc.Encode(p); err != nil {
			return err
		}
	}
	// Stored leaf hashes come from the nodes table, level 0.
	rows, err := tx.QueryContext(ctx, "SELECT e.idx, e.data, n.hash FROM entries e LEFT JOIN nodes n ON n.id = e.idx WHERE e.idx < ? ORDER BY e.idx", limit)
	if err != nil {
		return err
	}
	defer rows.Close()
	var n uint64
	for rows.Next() {
		var idx int64
		var data, leaf []byte
		if err := rows.Scan(&idx, &data, &leaf); err != nil {
			return err
		}
		rec := exportEntry{Kind: "entry", Index: uint64(idx), JWS: string(data)}
		if leaf != nil {
			rec.LeafHash = hex.EncodeToString(leaf)
		}
		if tree != nil {
			if p, ok := tree.InclusionProof(uint64(idx), latest.Size); ok {
				rec.Inclusion = &inlineProof{TreeSize: ptr(latest.Size), Proof: hexList(p)}
			}
		}
		if err := enc.Encode(rec); err != nil {
			return err
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if n != entries {
		return fmt.Errorf("%d entry rows, counted %d: %w", n, entries, ErrCorrupt)
	}
	return enc.Encode(exportEnd{Kind: "end", Entries: entries, Checkpoints: uint64(len(notes)), Proofs: uint64(len(proofs))})
}

// withCosignatures appends to each checkpoint note the witnesses'
// cosignatures stored for it, as CosignedNote does, with one read for all.
func (l *Log) withCosignatures(ctx context.Context, tx snapshot, notes [][]byte) ([][]byte, error) {
	if ok, err := hasCosignatures(ctx, tx, tx.d); err != nil || !ok {
		return notes, err // a database from before cosignatures has none
	}
	rows, err := tx.QueryContext(ctx, "SELECT size, root, name, sig FROM cosignatures ORDER BY size, witness")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	type cosig struct {
		root      []byte
		name      string
		signature []byte
	}
	bySize := map[uint64][]cosig{}
	for rows.Next() {
		var size int64
		var c cosig
		if err := rows.Scan(&size, &c.root, &c.name, &c.signature); err != nil {
			return nil, err
		}
		bySize[uint64(size)] = append(bySize[uint64(size)], c)
	}
	if err := rows.Err(); err != nil || len(bySize) == 0 {
		return notes, err
	}
	out := make([][]byte, len(notes))
	for i, msg := range notes {
		out[i] = msg
		cp, err := openCheckpoint(msg, l.verifier)
		if err != nil {
			continue // exported as it is, for the verifier to name
		}
		for _, c := range bySize[cp.Size] {
			if !bytes.Equal(c.root, cp.Root[:]) {
				continue
			}
			if out[i], err = note.AddSignature(out[i], c.name, c.signature); err != nil {
				return nil, fmt.Errorf("cosignature of %s at size %d: %w: %w", c.name, cp.Size, ErrCorrupt, err)
			}
		}
	}
	return out, nil
}

// leafTree hashes the first entries below limit into a tree, in the
// export's snapshot.
func leafTree(ctx context.Context, tx snapshot, limit int64, entries uint64) (*merkle.Tree, error) {
	rows, err := tx.QueryContext(ctx, "SELECT data FROM entries WHERE idx < ? ORDER BY idx", limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	leaves := make([]merkle.Hash, 0, entries)
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			return nil, err
		}
		leaves = append(leaves, merkle.LeafHash(data))
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return merkle.NewTree(leaves), nil
}

func queryBlobs(ctx context.Context, tx snapshot, q string) ([][]byte, error) {
	rows, err := tx.QueryContext(ctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out [][]byte
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

func exportProofs(ctx context.Context, tx snapshot, size uint64, cfg exportConfig) ([]exportProof, error) {
	var out []exportProof
	for _, i := range cfg.inclusion {
		if i >= size {
			return nil, fmt.Errorf("inclusion proof of %d in size %d: %w: %w", i, size, ErrInvalidProof, ErrIndexRange)
		}
		hs, err := rangeHashes(ctx, tx, merkle.InclusionRanges(i, size))
		if err != nil {
			return nil, err
		}
		out = append(out, exportProof{Kind: "inclusion", Index: ptr(i), Size: ptr(size), Proof: hexList(hs)})
	}
	for _, s := range cfg.consistency {
		if s == 0 || s > size {
			return nil, fmt.Errorf("consistency proof from %d to %d: %w: %w", s, size, ErrInvalidProof, ErrTreeSize)
		}
		hs, err := rangeHashes(ctx, tx, merkle.ConsistencyRanges(s, size))
		if err != nil {
			return nil, err
		}
		out = append(out, exportProof{Kind: "consistency", Size1: ptr(s), Size2: ptr(size), Proof: hexList(hs)})
	}
	return out, nil
}

func ptr(v uint64) *uint64 { return &v }

func hexList(hs []merkle.Hash) []string {
	out := make([]string, len(hs))
	for i := range hs {
		out[i] = hex.EncodeToString(hs[i][:])
	}
	return out
}

// DecodeProof decodes the hex hashes of a proof as the export format writes
// them, checking that each is 32 bytes.
func DecodeProof(hashes []string) ([][]byte, error) {
	if len(hashes) > 128 {
		return nil, fmt.Errorf("audit: proof of %d hashes: %w: %w", len(hashes), ErrInvalidProof, ErrProofLength)
	}
	out := make([][]byte, len(hashes))
	for i, h := range hashes {
		b, err := hex.DecodeString(h)
		if err != nil {
			return nil, fmt.Errorf("audit: proof[%d] is not hex: %w: %w", i, ErrInvalidProof, ErrHashSize)
		}
		if len(b) != merkle.HashSize {
			return nil, fmt.Errorf("audit: proof[%d] of %d bytes: %w: %w", i, len(b), ErrInvalidProof, ErrHashSize)
		}
		out[i] = b
	}
	return out, nil
}
