package audit

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fleetlearn/fleetlearn/audit/internal/merkle"
	"github.com/fleetlearn/fleetlearn/audit/internal/note"
)

// MaxExportLine bounds one line of an export.
const MaxExportLine = 2 << 20

// VerifyOption configures VerifyExport.
type VerifyOption func(*verifyConfig)

type verifyConfig struct {
	entryKey       ed25519.PublicKey
	vkey           string
	trusted        [][]byte
	allowUncovered bool
	workers        int
	origin         string   // pinned origin, or ""
	witnesses      []string // cosignature verifier keys the latest checkpoint must carry
	witnessMaxAge  time.Duration
	now            func() time.Time
	witnessViews   [][]byte // the witnesses' own newest cosigned checkpoints
	witnessOffline bool
}

// WithEntryKey pins the entry key: the export must carry this key. Without
// it the export's own key is used and Report.KeysPinned is false; compare
// Report.EntryKeyID with the published one.
func WithEntryKey(pub ed25519.PublicKey) VerifyOption {
	return func(c *verifyConfig) { c.entryKey = pub }
}

// WithVerifierKey pins the checkpoint key (a note verifier key string).
func WithVerifierKey(vkey string) VerifyOption {
	return func(c *verifyConfig) { c.vkey = vkey }
}

// WithPin pins everything a pin file (`fleetlearn audit keys`) names: the
// origin, both keys and any witnesses.
func WithPin(p Pin) VerifyOption {
	return func(c *verifyConfig) {
		c.origin, c.entryKey, c.vkey = p.Origin, p.Entry, p.VerifierKey
		for _, w := range p.Witnesses {
			if !slices.Contains(c.witnesses, w) {
				c.witnesses = append(c.witnesses, w)
			}
		}
	}
}

// WithWitness requires the export's latest checkpoint to carry a valid
// cosignature (c2sp.org/tlog-cosignature) of the witness with this
// verifier key. A witness cosigns only checkpoints consistent with every
// one it cosigned before, so a log rolled back, truncated or showing
// another history to someone else cannot get one for what it shows now.
func WithWitness(vkey string) VerifyOption {
	return func(c *verifyConfig) {
		if !slices.Contains(c.witnesses, vkey) {
			c.witnesses = append(c.witnesses, vkey)
		}
	}
}

// WithWitnessMaxAge bounds how old, by now(), the witnesses' own
// checkpoints (WithWitnessCheckpoint) may be, or, offline
// (WithWitnessOffline), the cosignatures in the export. 0 accepts any age.
func WithWitnessMaxAge(d time.Duration, now func() time.Time) VerifyOption {
	return func(c *verifyConfig) { c.witnessMaxAge, c.now = d, now }
}

// WithWitnessCheckpoint gives the newest checkpoint a witness has
// cosigned, as the witness itself keeps it (the file witness.CosignedFile
// of its state folder), fetched before the export was made. It must carry
// the cosignature of a witness the verification requires (WithWitness,
// WithPin) and the log's signature. The export must contain it: at least
// as many entries, and the same root at its size. That is what a rollback
// cannot satisfy: the store an operator restores holds only the
// cosignatures of its own time, while the witness keeps what it saw last.
// Every required witness needs one, unless WithWitnessOffline.
func WithWitnessCheckpoint(note []byte) VerifyOption {
	return func(c *verifyConfig) { c.witnessViews = append(c.witnessViews, note) }
}

// WithWitnessOffline verifies the witnesses' cosignatures in the export
// without a checkpoint from the witnesses themselves. Their age
// (WithWitnessMaxAge) is then the only sign of a rollback: a log rolled
// back to a checkpoint the witness cosigned within that age passes.
func WithWitnessOffline() VerifyOption {
	return func(c *verifyConfig) { c.witnessOffline = true }
}

// WithTrustedCheckpoint adds a checkpoint note the auditor obtained
// independently (from an earlier export, a witness, a monitoring job). The
// export must contain its tree: the same root at its size. A log that
// removed or changed entries after publishing it, or was rolled back to an
// earlier state, fails.
func WithTrustedCheckpoint(note []byte) VerifyOption {
	return func(c *verifyConfig) { c.trusted = append(c.trusted, note) }
}

// WithUncoveredTail accepts entries after the latest checkpoint (as a
// server killed before its next checkpoint leaves them), counting them in
// Report.Uncovered instead of failing with ErrUncovered.
func WithUncoveredTail() VerifyOption {
	return func(c *verifyConfig) { c.allowUncovered = true }
}

// WithWorkers sets how many goroutines check signatures; n <= 0 uses
// GOMAXPROCS.
func WithWorkers(n int) VerifyOption {
	return func(c *verifyConfig) { c.workers = n }
}

// Report is what VerifyExport established.
type Report struct {
	Origin      string
	Entries     uint64   // entries verified
	Root        [32]byte // root of all of them
	Checkpoint  Checkpoint
	Checkpoints int // checkpoints verified
	Proofs      int // proofs verified
	Trusted     int // trusted checkpoints matched
	EntryKeyID  string
	VerifierKey string
	KeysPinned  bool   // both keys were given by the caller
	Uncovered   uint64 // entries after the latest checkpoint (WithUncoveredTail)
	First, Last time.Time
	Types       map[EventType]uint64
	// Rounds are the committed rounds, each with every event the server
	// records for such a round (see ErrIncomplete).
	Rounds []RoundRecord
	// UncheckedTasks have rounds in the export but no task.created, so
	// what their rounds need is unknown (a log continued under new keys).
	UncheckedTasks []string
	// Witnessed are the pinned witnesses' cosignatures of the latest
	// checkpoint.
	Witnessed []WitnessCosignature
	// IndexChecked is true when the query index was checked against the
	// entries too (VerifyDataDir); an export carries no index.
	IndexChecked bool
}

// VerifyError says where an export failed to verify. Err wraps ErrTampered
// (the contents are wrong), ErrExportFormat (the file is malformed) or
// ErrIncomplete (every entry verifies, but a round's record has a gap), and
// a more specific sentinel such as ErrBadSignature, ErrRootMismatch or
// ErrUncovered.
type VerifyError struct {
	// Index is the first bad entry; when only a range is known (an entry
	// re-signed with the log's key changes the root but no signature) it is
	// the first entry of that range. -1 when no entry is to blame.
	Index int64
	// Checkpoint is the position of the checkpoint involved, or -1.
	Checkpoint int
	// Line is the line of the export file, from 1; 0 when the failure is
	// about the file as a whole.
	Line int
	Err  error
}

func (e *VerifyError) Error() string {
	var where []string
	if e.Index >= 0 {
		where = append(where, fmt.Sprintf("entry %d", e.Index))
	}
	if e.Checkpoint >= 0 {
		where = append(where, fmt.Sprintf("checkpoint %d", e.Checkpoint))
	}
	if e.Line > 0 {
		where = append(where, fmt.Sprintf("line %d", e.Line))
	}
	return "audit: verify: " + strings.Join(where, ", ") + ": " + e.Err.Error()
}

func (e *VerifyError) Unwrap() error { return e.Err }

type verifier struct {
	cfg  verifyConfig
	sc   *bufio.Scanner
	line int
	rep  Report

	cpBySize map[uint64]int // checkpoint position by tree size
	comp     *completeness
}

func (v *verifier) fail(index int64, cp int, err error) error {
	return &VerifyError{Index: index, Checkpoint: cp, Line: v.line, Err: err}
}

func tampered(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrTampered}, args...)...)
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrExportFormat}, args...)...)
}

// next reads one line into v strictly: known members only, one object.
func (v *verifier) next(kind string, dst any) error {
	if !v.sc.Scan() {
		err := v.sc.Err()
		if errors.Is(err, bufio.ErrTooLong) {
			return v.fail(-1, -1, malformed("line %d longer than %d bytes: %w", v.line+1, MaxExportLine, ErrTooLarge))
		}
		if err != nil {
			return v.fail(-1, -1, fmt.Errorf("%w: read: %w", ErrExportFormat, err))
		}
		return v.fail(-1, -1, malformed("ends before the %s record (truncated)", kind))
	}
	v.line++
	if err := v.decodeLine(v.sc.Bytes(), dst); err != nil {
		return v.fail(-1, -1, malformed("%s record: %v", kind, err))
	}
	return nil
}

// decodeLine decodes one record: one JSON object, known members only.
func (v *verifier) decodeLine(line []byte, dst any) error {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data")
	}
	return nil
}

// VerifyExport reads an export and checks, without trusting the operator:
// the keys (against the pinned ones, if given); every checkpoint's
// signature, origin and growth; every entry's index (contiguous from 0),
// signature (EdDSA pinned, the export's or pinned entry key), signed index,
// canonical event and time order, and stored leaf hash; the Merkle tree
// recomputed from the entries against every checkpoint and trusted
// checkpoint; and every included proof. It stops at the first problem and
// returns a *VerifyError naming it.
func VerifyExport(r io.Reader, opts ...VerifyOption) (Report, error) {
	var cfg verifyConfig
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if cfg.workers <= 0 {
		cfg.workers = runtime.GOMAXPROCS(0)
	}
	if len(cfg.witnesses) > 0 && !cfg.witnessOffline && len(cfg.witnessViews) == 0 {
		// Before reading anything: the verdict would be no verdict.
		return Report{}, fmt.Errorf("audit: verify: witnesses required but none of their own checkpoints given: without them a log rolled back to a checkpoint a witness cosigned cannot be told from a live one; "+
			"give each witness's newest cosigned checkpoint (the file cosigned in its state folder), fetched before the export, or verify offline: %w", ErrNoWitnessCheckpoint)
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxExportLine)
	v := &verifier{cfg: cfg, sc: sc, rep: Report{Types: map[EventType]uint64{}}, cpBySize: map[uint64]int{}, comp: newCompleteness()}
	if err := v.run(); err != nil {
		return v.rep, err
	}
	return v.rep, nil
}

type sizeWatch struct {
	root     *merkle.Hash // filled when the tree reaches the size
	leafAt   []uint64     // leaf hashes wanted (inclusion proofs)
	checkFor []int        // checkpoints of this size
}

func (v *verifier) run() error {
	var h exportHeader
	if err := v.next("header", &h); err != nil {
		return err
	}
	if h.Kind != "header" || h.Format != ExportFormat {
		return v.fail(-1, -1, malformed("not a %s file", ExportFormat))
	}
	if h.Version != ExportVersion {
		return v.fail(-1, -1, malformed("version %d, this verifier reads %d", h.Version, ExportVersion))
	}
	pub, err := ParseJWKS(h.EntryKeys)
	if err != nil {
		return v.fail(-1, -1, fmt.Errorf("%w: %w", ErrExportFormat, err))
	}
	nv, err := note.ParseVerifier(h.CheckpointVKey)
	if err != nil {
		return v.fail(-1, -1, malformed("checkpoint key: %v", err))
	}
	if v.cfg.origin != "" && v.cfg.origin != h.Origin {
		return v.fail(-1, -1, tampered("export of log %q, pinned log is %q: %w", h.Origin, v.cfg.origin, ErrKeyMismatch))
	}
	if v.cfg.entryKey != nil && !v.cfg.entryKey.Equal(pub) {
		return v.fail(-1, -1, tampered("entry key is not the pinned one: %w", ErrKeyMismatch))
	}
	if v.cfg.vkey != "" && v.cfg.vkey != h.CheckpointVKey {
		return v.fail(-1, -1, tampered("checkpoint key %s is not the pinned %s: %w", h.CheckpointVKey, v.cfg.vkey, ErrKeyMismatch))
	}
	kid, err := keyID(pub)
	if err != nil {
		return v.fail(-1, -1, fmt.Errorf("%w: %w", ErrExportFormat, err))
	}
	v.rep.Origin, v.rep.EntryKeyID, v.rep.VerifierKey = h.Origin, kid, h.CheckpointVKey
	v.rep.KeysPinned = v.cfg.entryKey != nil && v.cfg.vkey != ""
	if h.Entries > maxLeaves || h.Checkpoints > maxLeaves || h.Proofs > 1<<20 {
		return v.fail(-1, -1, malformed("counts out of range: %w", ErrTooLarge))
	}

	watch := map[uint64]*sizeWatch{}
	want := func(size uint64) *sizeWatch {
		w := watch[size]
		if w == nil {
			w = &sizeWatch{}
			watch[size] = w
		}
		return w
	}

	// Checkpoints, oldest first, each growing the log.
	cps := make([]Checkpoint, 0, min(h.Checkpoints, 1<<16))
	for k := range int(h.Checkpoints) {
		var rec exportCheckpoint
		if err := v.next("checkpoint", &rec); err != nil {
			return err
		}
		if rec.Kind != "checkpoint" {
			return v.fail(-1, k, malformed("%q record where checkpoint %d belongs", rec.Kind, k))
		}
		cp, err := openCheckpoint([]byte(rec.Note), nv)
		if err != nil {
			return v.fail(-1, k, tampered("%w", err))
		}
		if cp.Origin != h.Origin {
			return v.fail(-1, k, tampered("checkpoint for origin %q in an export of %q: %w", cp.Origin, h.Origin, ErrBadCheckpoint))
		}
		if k > 0 && cp.Size <= cps[k-1].Size {
			prev := cps[k-1]
			return v.fail(int64(prev.Size), k, tampered("checkpoint of size %d after one of size %d: an older checkpoint stands where a newer one was, so entries from %d on are not vouched for: %w",
				cp.Size, prev.Size, prev.Size, ErrInconsistent))
		}
		if err := v.checkInlineConsistency(rec.Consistency, cps, cp, k); err != nil {
			return err
		}
		cps = append(cps, cp)
		v.cpBySize[cp.Size] = k
		w := want(cp.Size)
		w.checkFor = append(w.checkFor, k)
	}
	var trusted []Checkpoint
	for i, n := range v.cfg.trusted {
		cp, err := openCheckpoint(n, nv)
		if err != nil {
			return v.fail(-1, -1, tampered("trusted checkpoint %d does not verify with the export's checkpoint key: %w", i, err))
		}
		if cp.Origin != h.Origin {
			return v.fail(-1, -1, tampered("trusted checkpoint %d is for origin %q: %w", i, cp.Origin, ErrBadCheckpoint))
		}
		trusted = append(trusted, cp)
		want(cp.Size)
	}
	views, err := v.openWitnessViews(nv, h.Origin, h.CheckpointVKey)
	if err != nil {
		return err
	}
	for _, wv := range views {
		want(wv.cp.Size)
	}

	// Proofs.
	var proofs []proofRec
	for k := range int(h.Proofs) {
		var rec exportProof
		if err := v.next("proof", &rec); err != nil {
			return err
		}
		p, err := decodeProofRecord(rec)
		if err != nil {
			return v.fail(-1, -1, fmt.Errorf("%w: proof %d: %w", ErrExportFormat, k, err))
		}
		proofs = append(proofs, proofRec{rec: rec, proof: p, line: v.line})
		if rec.Kind == "inclusion" {
			w := want(*rec.Size)
			w.leafAt = append(w.leafAt, *rec.Index)
		} else {
			want(*rec.Size1)
			want(*rec.Size2)
		}
	}
	leaves := map[uint64]merkle.Hash{}
	for _, w := range watch {
		for _, i := range w.leafAt {
			leaves[i] = merkle.Hash{}
		}
	}

	// Entries.
	f := &merkle.Frontier{}
	lastGood := uint64(0) // size of the last checkpoint that matched
	reached := func(size uint64, root merkle.Hash) error {
		w := watch[size]
		if w == nil {
			return nil
		}
		r := root
		w.root = &r
		for _, k := range w.checkFor {
			if cps[k].Root != root {
				return v.fail(int64(lastGood), k, tampered("the root of entries [0, %d) is not the one checkpoint %d signed, so an entry in [%d, %d) was altered after it was signed: %w",
					size, k, lastGood, size, ErrRootMismatch))
			}
			lastGood = size
			v.rep.Checkpoints++
		}
		return nil
	}
	if err := reached(0, merkle.EmptyRoot); err != nil {
		return err
	}
	var lastTime time.Time
	const chunk = 512
	batch := make([]exportEntry, 0, chunk)
	lines := make([]int, 0, chunk)
	results := make([]entryResult, chunk)
	for read := uint64(0); read < h.Entries; {
		batch, lines = batch[:0], lines[:0]
		for read < h.Entries && len(batch) < chunk {
			var rec exportEntry
			if err := v.next("entry", &rec); err != nil {
				return err
			}
			if rec.Kind != "entry" {
				return v.fail(int64(read), -1, malformed("%q record where entry %d belongs", rec.Kind, read))
			}
			batch = append(batch, rec)
			lines = append(lines, v.line)
			read++
		}
		verifyEntries(batch, pub, kid, results[:len(batch)], v.cfg.workers)
		for j, rec := range batch {
			res := results[j]
			i := f.Size()
			v.line = lines[j]
			switch {
			case rec.Index > i:
				return v.fail(int64(i), -1, tampered("entry %d is missing (the next one is %d)", i, rec.Index))
			case rec.Index < i:
				return v.fail(int64(i), -1, tampered("entry %d appears again where entry %d belongs", rec.Index, i))
			case res.err != nil:
				return v.fail(int64(i), -1, tampered("%w", res.err))
			case res.ev.Time.Before(lastTime):
				return v.fail(int64(i), -1, tampered("time %s is before the previous entry's %s: entries out of order",
					formatTime(res.ev.Time), formatTime(lastTime)))
			}
			leaf := merkle.LeafHash([]byte(rec.JWS))
			if rec.LeafHash != "" {
				stored, err := hex.DecodeString(rec.LeafHash)
				if err != nil || !bytes.Equal(stored, leaf[:]) {
					return v.fail(int64(i), -1, tampered("the entry's bytes differ from those the log hashed when it appended it: %w", ErrRootMismatch))
				}
			}
			if _, ok := leaves[i]; ok {
				leaves[i] = leaf
			}
			if err := v.checkInlineInclusion(rec.Inclusion, cps, i, leaf); err != nil {
				return err
			}
			lastTime = res.ev.Time
			if v.rep.First.IsZero() {
				v.rep.First = res.ev.Time
			}
			v.rep.Last = res.ev.Time
			v.rep.Types[res.ev.Type]++
			v.comp.observe(int64(i), res.ev)
			f.Append(leaf, func(merkle.NodeID, merkle.Hash) {})
			if err := reached(f.Size(), f.Root()); err != nil {
				return err
			}
		}
	}
	var end exportEnd
	if err := v.next("end", &end); err != nil {
		return err
	}
	if end.Kind != "end" || end.Entries != h.Entries || end.Checkpoints != h.Checkpoints || end.Proofs != h.Proofs {
		return v.fail(-1, -1, malformed("end record does not match the header"))
	}
	if v.sc.Scan() {
		v.line++
		return v.fail(-1, -1, malformed("data after the end record"))
	}
	v.line = 0
	n := f.Size()
	v.rep.Entries, v.rep.Root = n, f.Root()

	if len(cps) > 0 {
		latest := cps[len(cps)-1]
		if latest.Size > n {
			return v.fail(int64(n), len(cps)-1, tampered("checkpoint %d covers %d entries but the export has %d: entries from %d on were removed",
				len(cps)-1, latest.Size, n, n))
		}
		v.rep.Checkpoint = latest
	}
	if covered := v.rep.Checkpoint.Size; covered < n {
		if !v.cfg.allowUncovered {
			return v.fail(int64(covered), -1, tampered("%d entries from %d on are after the latest checkpoint: %w", n-covered, covered, ErrUncovered))
		}
		v.rep.Uncovered = n - covered
	}
	if err := v.checkWitnesses(cps, h.CheckpointVKey, views, watch, n); err != nil {
		return err
	}
	for i, cp := range trusted {
		if cp.Size > n {
			return v.fail(int64(n), -1, tampered("trusted checkpoint %d covers %d entries but the export has %d: the log lost entries or was rolled back: %w",
				i, cp.Size, n, ErrInconsistent))
		}
		if w := watch[cp.Size]; w.root == nil || *w.root != cp.Root {
			return v.fail(int64(cp.Size), -1, tampered("trusted checkpoint %d (size %d) does not match the exported entries: %w", i, cp.Size, ErrInconsistent))
		}
		v.rep.Trusted++
	}
	for k, p := range proofs {
		v.line = p.line
		if err := p.check(watch, leaves, n); err != nil {
			return v.fail(-1, -1, tampered("proof %d: %w", k, err))
		}
		v.rep.Proofs++
	}
	v.line = 0
	rounds, unchecked, at, err := v.comp.check()
	if err != nil {
		return v.fail(at, -1, err)
	}
	v.rep.Rounds, v.rep.UncheckedTasks = rounds, unchecked
	return nil
}

// checkInlineConsistency checks the proof a checkpoint record carries that
// it extends the checkpoint before it, against both signed roots.
func (v *verifier) checkInlineConsistency(p *inlineProof, cps []Checkpoint, cp Checkpoint, k int) error {
	if p == nil {
		return nil
	}
	if p.FromSize == nil || p.TreeSize != nil {
		return v.fail(-1, k, malformed("checkpoint %d: a consistency proof needs from_size only", k))
	}
	if k == 0 || *p.FromSize != cps[k-1].Size {
		return v.fail(-1, k, malformed("checkpoint %d: consistency proof from size %d, not from the checkpoint before it", k, *p.FromSize))
	}
	proof, err := DecodeProof(p.Proof)
	if err == nil {
		prev := cps[k-1]
		err = VerifyConsistency(prev.Size, cp.Size, proof, prev.Root[:], cp.Root[:])
	}
	if err != nil {
		return v.fail(int64(cps[k-1].Size), k, tampered("checkpoint %d does not provably extend checkpoint %d: %w", k, k-1, err))
	}
	v.rep.Proofs++
	return nil
}

// checkInlineInclusion checks the proof an entry record carries that the
// entry is in the tree a checkpoint of the export signed.
func (v *verifier) checkInlineInclusion(p *inlineProof, cps []Checkpoint, index uint64, leaf merkle.Hash) error {
	if p == nil {
		return nil
	}
	if p.TreeSize == nil || p.FromSize != nil {
		return v.fail(int64(index), -1, malformed("entry %d: an inclusion proof needs tree_size only", index))
	}
	k, ok := v.cpBySize[*p.TreeSize]
	if !ok {
		return v.fail(int64(index), -1, malformed("entry %d: inclusion proof in a tree of %d entries, which no checkpoint of the export signs", index, *p.TreeSize))
	}
	proof, err := DecodeProof(p.Proof)
	if err == nil {
		err = VerifyInclusion(index, cps[k].Size, leaf[:], proof, cps[k].Root[:])
	}
	if err != nil {
		return v.fail(int64(index), k, tampered("entry %d is not provably in the tree checkpoint %d signed: %w", index, k, err))
	}
	v.rep.Proofs++
	return nil
}

// WitnessCosignature is a witness's cosignature the verifier checked.
type WitnessCosignature struct {
	Witness string // verifier key
	Size    uint64 // tree size of the checkpoint it cosigned
	Time    time.Time
	// Own is the witness's own newest checkpoint the log was held to
	// (WithWitnessCheckpoint); zero offline.
	OwnSize uint64
	OwnTime time.Time
}

// witnessView is a witness's own newest cosigned checkpoint
// (WithWitnessCheckpoint).
type witnessView struct {
	witness string
	cp      Checkpoint
	at      time.Time
}

// openWitnessViews checks the witnesses' own checkpoints: each signed by
// the log, for its origin, and cosigned by a required witness.
func (v *verifier) openWitnessViews(nv note.Verifier, origin, logVKey string) ([]witnessView, error) {
	if len(v.cfg.witnessViews) > 0 && len(v.cfg.witnesses) == 0 {
		return nil, fmt.Errorf("audit: verify: %d witness checkpoints given but no witness required: name the witnesses whose checkpoints they are: %w",
			len(v.cfg.witnessViews), ErrNoWitnessCheckpoint)
	}
	// The files are the auditor's, not lines of the export.
	defer func(line int) { v.line = line }(v.line)
	v.line = 0
	var out []witnessView
	for i, n := range v.cfg.witnessViews {
		if len(n) > MaxNoteBytes {
			return nil, fmt.Errorf("audit: verify: witness checkpoint %d of %d bytes, at most %d: %w", i, len(n), MaxNoteBytes, ErrTooLarge)
		}
		cp, err := openCheckpoint(n, nv)
		if err != nil {
			return nil, v.fail(-1, -1, tampered("witness checkpoint %d does not verify with the log's checkpoint key %s: it is another log's, or this log's key changed since the witness saw it (check the file came from this log's witness): %w",
				i, logVKey, err))
		}
		if cp.Origin != origin {
			return nil, v.fail(-1, -1, tampered("witness checkpoint %d is for origin %q, the export for %q: %w", i, cp.Origin, origin, ErrBadCheckpoint))
		}
		found := false
		for _, w := range v.cfg.witnesses {
			_, at, err := VerifyCosignature(n, logVKey, w)
			if errors.Is(err, ErrNotCosigned) {
				continue
			}
			if err != nil {
				return nil, v.fail(-1, -1, fmt.Errorf("%w: witness checkpoint %d: the cosignature of witness %s does not verify (a damaged or forged file; fetch it from the witness again): %w",
					ErrTampered, i, w, err))
			}
			out = append(out, witnessView{witness: w, cp: cp, at: at})
			found = true
		}
		if !found {
			return nil, fmt.Errorf("audit: verify: witness checkpoint %d carries no cosignature of a witness you require (signature lines by %s): give each required witness's own checkpoint: %w",
				i, strings.Join(note.SignatureNames(n), ", "), ErrNoWitnessCheckpoint)
		}
	}
	return out, nil
}

// checkWitnesses holds the log to what the witnesses saw last: it must
// contain each witness's own checkpoint (a smaller log was rolled back or
// truncated since, another root at that size is a fork), that checkpoint
// must be recent, and the latest checkpoint, which covers every entry,
// must carry each witness's cosignature. Offline, the cosignatures in the
// export stand in for the witnesses' own checkpoints.
func (v *verifier) checkWitnesses(cps []Checkpoint, logVKey string, views []witnessView, watch map[uint64]*sizeWatch, n uint64) error {
	if len(v.cfg.witnesses) == 0 {
		return nil
	}
	b64 := base64.StdEncoding.EncodeToString
	for _, wv := range views {
		when := wv.at.UTC().Format(time.RFC3339)
		if wv.cp.Size > n {
			return v.fail(int64(n), -1, tampered("witness %s cosigned a checkpoint of size %d at %s, but this log has only %d entries: "+
				"it was rolled back or truncated after the witness saw it, or you fetched the witness's checkpoint after making the export "+
				"(fetch it first, then export and verify again); if it fails again keep both files as evidence: %w",
				wv.witness, wv.cp.Size, when, n, ErrInconsistent))
		}
		if w := watch[wv.cp.Size]; w.root == nil || *w.root != wv.cp.Root {
			got := "unknown"
			if w.root != nil {
				got = b64(w.root[:])
			}
			return v.fail(int64(wv.cp.Size), -1, tampered("witness %s cosigned the tree of size %d with root %s at %s, but this log's first %d entries have root %s: "+
				"the log shows you another history than the one the witness saw (a fork); keep both files as evidence: %w",
				wv.witness, wv.cp.Size, b64(wv.cp.Root[:]), when, wv.cp.Size, got, ErrInconsistent))
		}
	}
	if len(cps) == 0 {
		return v.fail(-1, -1, tampered("no checkpoint for the witnesses to vouch for: %w", ErrNotCosigned))
	}
	k := len(cps) - 1
	latest := cps[k]
	maxAge := func(t time.Time) (time.Duration, bool) {
		if v.cfg.witnessMaxAge <= 0 || v.cfg.now == nil {
			return 0, false
		}
		age := v.cfg.now().Sub(t)
		return age, age > v.cfg.witnessMaxAge
	}
	for _, w := range v.cfg.witnesses {
		var newest *witnessView
		_, t, err := VerifyCosignature(latest.Note, logVKey, w)
		if err != nil {
			return v.fail(int64(latest.Size), k, tampered("the latest checkpoint (size %d) has no valid cosignature of witness %s: the log may have been rolled back or be showing another history, or the witness has not seen it yet (export again once it has): %w",
				latest.Size, w, err))
		}
		if v.cfg.witnessOffline {
			if age, stale := maxAge(t); stale {
				return v.fail(int64(latest.Size), k, tampered("witness %s last cosigned the latest checkpoint %s ago (at %s), more than the %s allowed: a live log is re-cosigned as the witness polls, so this one may have been rolled back and frozen, or the witness stopped: %w",
					w, age.Round(time.Second), t.UTC().Format(time.RFC3339), v.cfg.witnessMaxAge, ErrNotCosigned))
			}
		} else {
			for i := range views {
				if views[i].witness == w && (newest == nil || views[i].at.After(newest.at)) {
					newest = &views[i]
				}
			}
			if newest == nil {
				return fmt.Errorf("audit: verify: no checkpoint of witness %s's own: without it a log rolled back to a checkpoint the witness cosigned cannot be told from a live one; "+
					"give the newest checkpoint it cosigned (the file cosigned in its state folder), fetched before the export, or verify offline: %w",
					w, ErrNoWitnessCheckpoint)
			}
			if age, stale := maxAge(newest.at); stale {
				return v.fail(int64(latest.Size), k, tampered("witness %s's own checkpoint (size %d) was cosigned %s ago (at %s), more than the %s allowed: a rollback since then would not show. "+
					"Fetch the witness's checkpoint again and export again; if it is no newer, the witness has stopped, which it does when it finds the log inconsistent: ask its operator for its evidence files: %w",
					w, newest.cp.Size, age.Round(time.Second), newest.at.UTC().Format(time.RFC3339), v.cfg.witnessMaxAge, ErrNotCosigned))
			}
		}
		wc := WitnessCosignature{Witness: w, Size: latest.Size, Time: t}
		if !v.cfg.witnessOffline {
			wc.OwnSize, wc.OwnTime = newest.cp.Size, newest.at
		}
		v.rep.Witnessed = append(v.rep.Witnessed, wc)
	}
	return nil
}

type proofRec struct {
	rec   exportProof
	proof [][]byte
	line  int
}

// check verifies a proof against the roots and leaves seen while reading
// the entries.
func (p proofRec) check(watch map[uint64]*sizeWatch, leaves map[uint64]merkle.Hash, n uint64) error {
	if p.rec.Kind == "inclusion" {
		size, index := *p.rec.Size, *p.rec.Index
		if size > n || index >= size {
			return fmt.Errorf("inclusion of %d in size %d, export has %d entries: %w: %w", index, size, n, ErrInvalidProof, ErrIndexRange)
		}
		leaf, root := leaves[index], watch[size].root
		return VerifyInclusion(index, size, leaf[:], p.proof, root[:])
	}
	size1, size2 := *p.rec.Size1, *p.rec.Size2
	if size2 > n {
		return fmt.Errorf("consistency to size %d, export has %d entries: %w: %w", size2, n, ErrInvalidProof, ErrTreeSize)
	}
	r1, r2 := watch[size1].root, watch[size2].root
	if r1 == nil {
		return fmt.Errorf("consistency from size %d: %w: %w", size1, ErrInvalidProof, ErrTreeSize)
	}
	return VerifyConsistency(size1, size2, p.proof, r1[:], r2[:])
}

type entryResult struct {
	ev  Event
	err error
}

// verifyEntries checks signatures and events of a chunk in parallel.
func verifyEntries(batch []exportEntry, pub ed25519.PublicKey, kid string, out []entryResult, workers int) {
	workers = max(1, min(workers, len(batch)/16))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := w; j < len(batch); j += workers {
				ev, err := verifyEntry(Entry{Index: batch[j].Index, Data: []byte(batch[j].JWS)}, pub, kid)
				out[j] = entryResult{ev: ev, err: err}
			}
		}()
	}
	wg.Wait()
}

func decodeProofRecord(rec exportProof) ([][]byte, error) {
	switch rec.Kind {
	case "inclusion":
		if rec.Index == nil || rec.Size == nil || rec.Size1 != nil || rec.Size2 != nil {
			return nil, errors.New("inclusion proof needs index and size only")
		}
	case "consistency":
		if rec.Size1 == nil || rec.Size2 == nil || rec.Index != nil || rec.Size != nil {
			return nil, errors.New("consistency proof needs size1 and size2 only")
		}
	default:
		return nil, fmt.Errorf("%q record where a proof belongs", rec.Kind)
	}
	return DecodeProof(rec.Proof)
}
