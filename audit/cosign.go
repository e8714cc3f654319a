package audit

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/fleetlearn/fleetlearn/audit/internal/note"
	"github.com/fleetlearn/fleetlearn/internal/sqldb"
)

// Witnesses (c2sp.org/tlog-witness, in spirit) follow the log's
// checkpoints, check that each extends the last one they cosigned, and
// cosign it (c2sp.org/tlog-cosignature, the Ed25519 type cosignature/v1).
// An auditor who requires a recent cosignature from a witness it trusts
// catches a rollback or a split view without having kept a checkpoint of
// its own. Package audit/witness is the witness; this file has the format
// and the log's store of cosignatures.

// MaxNoteBytes bounds a checkpoint note with its cosignatures, as the log
// and the verifiers read it.
const MaxNoteBytes = note.MaxNoteSize

// maxCosignatureSkew is how far in the future, by the log's clock, a
// cosignature's time may be: witnesses' clocks differ from the log's, but
// a cosignature dated later than that would look fresh for too long.
const maxCosignatureSkew = 5 * time.Minute

// WitnessKey is a witness's signing key and name. The name should be a
// schema-less URL naming the witness, such as "witness.example.com/w1".
type WitnessKey struct {
	signer note.Cosigner
	seed   []byte
}

// GenerateWitnessKey draws a fresh Ed25519 key for a witness called name.
func GenerateWitnessKey(rand io.Reader, name string) (WitnessKey, error) {
	_, priv, err := ed25519.GenerateKey(rand)
	if err != nil {
		return WitnessKey{}, fmt.Errorf("audit: generate witness key: %w", err)
	}
	return newWitnessKey(name, priv)
}

func newWitnessKey(name string, priv ed25519.PrivateKey) (WitnessKey, error) {
	s, err := note.NewCosigner(name, priv)
	if err != nil {
		return WitnessKey{}, fmt.Errorf("audit: witness key %q: %w: %w", name, ErrInvalidKeys, err)
	}
	return WitnessKey{signer: s, seed: priv.Seed()}, nil
}

const witnessKeyHeader = "fleetlearn-witness-key/v1"

// MarshalText writes the witness key file format:
//
//	fleetlearn-witness-key/v1
//	name: <name>
//	ed25519-seed: <base64>
func (k WitnessKey) MarshalText() ([]byte, error) {
	if k.signer.Name() == "" {
		return nil, fmt.Errorf("audit: witness key: empty key: %w", ErrInvalidKeys)
	}
	return fmt.Appendf(nil, "%s\nname: %s\ned25519-seed: %s\n", witnessKeyHeader, k.signer.Name(),
		base64.StdEncoding.EncodeToString(k.seed)), nil
}

// ParseWitnessKey reads the format MarshalText writes.
func ParseWitnessKey(b []byte) (WitnessKey, error) {
	if len(b) > 4096 {
		return WitnessKey{}, fmt.Errorf("audit: witness key: %w", ErrTooLarge)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != 3 || lines[0] != witnessKeyHeader {
		return WitnessKey{}, fmt.Errorf("audit: witness key: not a %s file: %w", witnessKeyHeader, ErrInvalidKeys)
	}
	name, ok := strings.CutPrefix(lines[1], "name: ")
	if !ok {
		return WitnessKey{}, fmt.Errorf("audit: witness key: expected name: %w", ErrInvalidKeys)
	}
	v, ok := strings.CutPrefix(lines[2], "ed25519-seed: ")
	if !ok {
		return WitnessKey{}, fmt.Errorf("audit: witness key: expected ed25519-seed: %w", ErrInvalidKeys)
	}
	seed, err := base64.StdEncoding.Strict().DecodeString(v)
	if err != nil || len(seed) != ed25519.SeedSize {
		return WitnessKey{}, fmt.Errorf("audit: witness key: ed25519-seed: %w", ErrInvalidKeys)
	}
	return newWitnessKey(name, ed25519.NewKeyFromSeed(seed))
}

// Name is the witness's name, the key name of its cosignature lines.
func (k WitnessKey) Name() string { return k.signer.Name() }

// VerifierKey is the witness's verifier key, to pin in auditors and in the
// log's WithWitnesses: "<name>+<hex key id>+base64(0x04 || public key)".
func (k WitnessKey) VerifierKey() string { return k.signer.String() }

// Cosign returns cp.Note with this witness's cosignature of it at time t
// (whole seconds) appended to the signature block, in place of an older
// cosignature of this key; other signature lines are kept. It checks only
// that cp.Note is a well-formed note whose text is cp's checkpoint: that
// the checkpoint is consistent with what the witness saw before is the
// caller's to establish (package audit/witness does).
func (k WitnessKey) Cosign(cp Checkpoint, t time.Time) ([]byte, error) {
	if k.signer.Name() == "" {
		return nil, fmt.Errorf("audit: cosign: empty key: %w", ErrInvalidKeys)
	}
	if t.Unix() < 0 {
		return nil, fmt.Errorf("audit: cosign: time %v before 1970: %w", t, ErrBadCosignature)
	}
	if !bytes.HasPrefix(cp.Note, checkpointText(cp.Origin, cp.Size, cp.Root)) {
		return nil, fmt.Errorf("audit: cosign: note is not the checkpoint of %q at size %d: %w", cp.Origin, cp.Size, ErrBadCheckpoint)
	}
	msg, err := k.signer.Cosign(cp.Note, uint64(t.Unix()))
	if err != nil {
		return nil, fmt.Errorf("audit: cosign: %w: %w", ErrBadCheckpoint, err)
	}
	return msg, nil
}

// VerifyCosignature verifies a cosigned checkpoint note: the log's
// signature with logVKey and the cosignature of the witness witnessVKey. It
// returns the checkpoint (its Note is cosigned as given) and the time the
// witness cosigned it. Errors wrap ErrBadCheckpoint for the log's part,
// ErrNotCosigned when the note has no line of that witness, and
// ErrBadCosignature for a line of that witness that does not verify;
// ErrInvalidKeys for a malformed key.
func VerifyCosignature(cosigned []byte, logVKey, witnessVKey string) (Checkpoint, time.Time, error) {
	w, err := note.ParseCosigVerifier(witnessVKey)
	if err != nil {
		return Checkpoint{}, time.Time{}, fmt.Errorf("audit: witness key: %w: %w", ErrInvalidKeys, err)
	}
	cp, err := ParseCheckpoint(cosigned, logVKey)
	if err != nil {
		return Checkpoint{}, time.Time{}, err
	}
	cs, err := verifyCosig(cosigned, w)
	if err != nil {
		return Checkpoint{}, time.Time{}, err
	}
	return cp, time.Unix(int64(cs.Time), 0).UTC(), nil
}

// verifyCosig checks w's cosignature in a note whose log signature was
// verified, mapping the note package's errors to this package's.
func verifyCosig(msg []byte, w note.CosigVerifier) (note.Cosignature, error) {
	_, cs, err := note.VerifyCosignature(msg, w)
	switch {
	case errors.Is(err, note.ErrUnverified):
		return note.Cosignature{}, fmt.Errorf("audit: cosignature: %w: %s", ErrNotCosigned, w.Name())
	case errors.Is(err, note.ErrInvalidSignature):
		return note.Cosignature{}, fmt.Errorf("audit: cosignature: %w: %w", ErrBadCosignature, err)
	case err != nil:
		return note.Cosignature{}, fmt.Errorf("audit: cosignature: %w: %w", ErrBadCheckpoint, err)
	}
	return cs, nil
}

// parseWitnesses reads WithWitnesses' keys.
func parseWitnesses(vkeys []string) ([]note.CosigVerifier, error) {
	var out []note.CosigVerifier
	for _, k := range vkeys {
		v, err := note.ParseCosigVerifier(k)
		if err != nil {
			return nil, fmt.Errorf("audit: open: witness %q: %w: %w", k, ErrInvalidKeys, err)
		}
		dup := false
		for _, o := range out {
			dup = dup || o.Name() == v.Name() && o.KeyID() == v.KeyID()
		}
		if !dup {
			out = append(out, v)
		}
	}
	return out, nil
}

// Cosignature is a witness's cosignature the log stores.
type Cosignature struct {
	// Witness is the witness's verifier key.
	Witness string
	// Name is the witness's name.
	Name string
	// Size is the tree size of the cosigned checkpoint.
	Size uint64
	// Time is when the witness cosigned, by its clock.
	Time time.Time
}

// AddCosignature stores the cosignature of a witness given to WithWitnesses
// on a checkpoint this log issued (one stored with the same size and root),
// from the note the witness cosigned. Of a witness's cosignatures of one
// checkpoint only the newest is kept; an older one is accepted and
// dropped. It refuses a note that is malformed or not signed by the log
// (ErrBadCheckpoint), one with no cosignature of a configured witness
// (ErrUnknownWitness) or of several, a cosignature that does not verify or
// is dated more than a few minutes ahead of the log's clock
// (ErrBadCosignature), and a checkpoint the log has not issued
// (ErrNotFound): a note signed with the log's key that the log does not
// hold means a lost or forked log, which it also logs as a warning.
// Cosignatures are not events; nothing is appended to the log. A writer
// another has deposed stores nothing (ErrFenced).
func (l *Log) AddCosignature(ctx context.Context, cosigned []byte) (Cosignature, error) {
	const op = "audit: add cosignature"
	if l.readOnly {
		return Cosignature{}, fmt.Errorf("%s: %w", op, ErrReadOnly)
	}
	if len(cosigned) > MaxNoteBytes {
		return Cosignature{}, fmt.Errorf("%s: note of %d bytes, at most %d: %w", op, len(cosigned), MaxNoteBytes, ErrTooLarge)
	}
	cp, err := openCheckpoint(cosigned, l.verifier)
	if err != nil {
		return Cosignature{}, fmt.Errorf("%s: %w", op, err)
	}
	if cp.Origin != l.origin {
		return Cosignature{}, fmt.Errorf("%s: checkpoint for %q in log %q: %w", op, cp.Origin, l.origin, ErrBadCheckpoint)
	}
	var w note.CosigVerifier
	var cs note.Cosignature
	found := 0
	for _, v := range l.witnesses {
		c, err := verifyCosig(cosigned, v)
		if errors.Is(err, ErrNotCosigned) {
			continue
		}
		if err != nil {
			return Cosignature{}, fmt.Errorf("%s: witness %s: %w", op, v.Name(), err)
		}
		w, cs = v, c
		found++
	}
	switch {
	case found == 0:
		names := note.SignatureNames(cosigned)
		return Cosignature{}, fmt.Errorf("%s: no cosignature of a witness this log accepts (signature lines by %s): %w",
			op, strings.Join(names, ", "), ErrUnknownWitness)
	case found > 1:
		return Cosignature{}, fmt.Errorf("%s: cosignatures of %d witnesses in one note; send each witness's own: %w",
			op, found, ErrBadCosignature)
	}
	at := time.Unix(int64(cs.Time), 0).UTC()
	if now := l.cfg.now(); at.After(now.Add(maxCosignatureSkew)) {
		return Cosignature{}, fmt.Errorf("%s: witness %s dated its cosignature %s, %s ahead of the log's clock: %w",
			op, w.Name(), at.Format(time.RFC3339), at.Sub(now).Round(time.Second), ErrBadCosignature)
	}
	out := Cosignature{Witness: w.String(), Name: w.Name(), Size: cp.Size, Time: at}

	// Held shared so that Close cannot close the database under the write.
	l.closeMu.RLock()
	defer l.closeMu.RUnlock()
	if l.closed {
		return Cosignature{}, fmt.Errorf("%s: %w", op, ErrClosed)
	}
	issued := true
	err = l.wdb.Tx(ctx, func(tx *sqldb.Tx) error {
		if err := l.checkFence(ctx, tx); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM checkpoints WHERE size = ? AND root = ?",
			int64(cp.Size), cp.Root[:]).Scan(&n); err != nil {
			return err
		}
		if issued = n > 0; !issued {
			return nil
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO cosignatures(witness, size, root, name, time, sig) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT(witness, size) DO UPDATE SET root = excluded.root, name = excluded.name, time = excluded.time, sig = excluded.sig
		WHERE excluded.time > cosignatures.time`,
			out.Witness, int64(cp.Size), cp.Root[:], w.Name(), int64(cs.Time), cs.Raw)
		return err
	})
	if err != nil {
		return Cosignature{}, fmt.Errorf("%s: %w", op, err)
	}
	if !issued {
		l.cfg.logger.Warn("audit cosignature of a checkpoint this log did not issue", "witness", w.Name(),
			"size", cp.Size, "root", base64.StdEncoding.EncodeToString(cp.Root[:]), "log_size", l.Size())
		return Cosignature{}, fmt.Errorf("%s: the log issued no checkpoint of size %d with root %s: %w",
			op, cp.Size, base64.StdEncoding.EncodeToString(cp.Root[:]), ErrNotFound)
	}
	return out, nil
}

// CosignedNote returns cp.Note with every stored cosignature of that
// checkpoint (same size and root) appended, in the order of the witnesses'
// verifier keys, in place of any line of theirs cp.Note already has; just
// cp.Note when there is none. On a log opened read-only whose database
// predates cosignatures, there is none.
func (l *Log) CosignedNote(ctx context.Context, cp Checkpoint) ([]byte, error) {
	const op = "audit: cosigned note"
	if err := l.live(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if l.readOnly {
		ok, err := hasCosignatures(ctx, l.rdb, l.rdb.Dialect())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if !ok {
			return bytes.Clone(cp.Note), nil
		}
	}
	rows, err := l.rdb.QueryContext(ctx, "SELECT name, sig FROM cosignatures WHERE size = ? AND root = ? ORDER BY witness",
		int64(cp.Size), cp.Root[:])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	defer rows.Close()
	msg := bytes.Clone(cp.Note)
	for rows.Next() {
		var name string
		var sig []byte
		if err := rows.Scan(&name, &sig); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if msg, err = note.AddSignature(msg, name, sig); err != nil {
			return nil, fmt.Errorf("%s: cosignature of %s at size %d: %w: %w", op, name, cp.Size, ErrCorrupt, err)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return msg, nil
}

// Witnesses returns the verifier keys of the witnesses the log accepts
// cosignatures from (WithWitnesses), for publishing with its keys.
func (l *Log) Witnesses() []string {
	out := make([]string, len(l.witnesses))
	for i, w := range l.witnesses {
		out[i] = w.String()
	}
	return out
}
