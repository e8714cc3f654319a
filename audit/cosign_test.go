package audit

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	sumnote "golang.org/x/mod/sumdb/note"

	"github.com/fleetlearn/fleetlearn/audit/internal/note"
)

func testWitness(t testing.TB, name string, seed byte) WitnessKey {
	t.Helper()
	k, err := GenerateWitnessKey(seeded(seed), name)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// grownCheckpoint appends n events and signs a checkpoint.
func grownCheckpoint(t testing.TB, lg *Log, n int) Checkpoint {
	t.Helper()
	appendN(t, lg, n)
	cp, err := lg.Checkpoint(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

func TestWitnessKeyFile(t *testing.T) {
	k := testWitness(t, "witness.example/w1", 3)
	text, err := k.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(text), "fleetlearn-witness-key/v1\nname: witness.example/w1\ned25519-seed: ") {
		t.Fatalf("key file:\n%s", text)
	}
	back, err := ParseWitnessKey(text)
	if err != nil || back.VerifierKey() != k.VerifierKey() || back.Name() != k.Name() {
		t.Fatalf("parse: %v %v", back.VerifierKey(), err)
	}
	if !strings.HasPrefix(k.VerifierKey(), "witness.example/w1+") {
		t.Fatalf("vkey %s", k.VerifierKey())
	}
	for _, bad := range []string{
		"",
		strings.Replace(string(text), "fleetlearn-witness-key/v1", "fleetlearn-audit-keys/v1", 1),
		strings.Replace(string(text), "name: witness.example/w1", "name: two words", 1),
		strings.Replace(string(text), "name: ", "nom: ", 1),
		string(text[:len(text)-5]) + "\n",
		string(text) + "extra: 1\n",
	} {
		if _, err := ParseWitnessKey([]byte(bad)); !errors.Is(err, ErrInvalidKeys) {
			t.Errorf("parse %q: %v", bad, err)
		}
	}
	if _, err := GenerateWitnessKey(seeded(1), "a+b"); !errors.Is(err, ErrInvalidKeys) {
		t.Errorf("name with '+': %v", err)
	}
	var zero WitnessKey
	if _, err := zero.MarshalText(); !errors.Is(err, ErrInvalidKeys) {
		t.Errorf("zero key: %v", err)
	}
}

func TestCosignAndVerify(t *testing.T) {
	lg, _, _ := openTest(t)
	cp := grownCheckpoint(t, lg, 7)
	vkey := lg.PublicKeys().VerifierKey
	w := testWitness(t, "witness.example/w1", 3)
	at := time.Unix(1767322000, 999e6) // sub-second part dropped
	cosigned, err := w.Cosign(cp, at)
	if err != nil {
		t.Fatal(err)
	}
	got, when, err := VerifyCosignature(cosigned, vkey, w.VerifierKey())
	if err != nil || got.Size != 7 || got.Root != cp.Root || !when.Equal(time.Unix(1767322000, 0)) {
		t.Fatalf("verify: %+v %v %v", got, when, err)
	}
	// Cosigning again replaces the witness's line, so the note never
	// grows by more than one line per witness.
	again, err := w.Cosign(Checkpoint{Origin: got.Origin, Size: got.Size, Root: got.Root, Note: cosigned}, at.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(again), "\n— "); n != 2 {
		t.Fatalf("%d signature lines after re-cosigning:\n%s", n, again)
	}
	if _, when, err := VerifyCosignature(again, vkey, w.VerifierKey()); err != nil || !when.Equal(at.Add(time.Hour).Truncate(time.Second)) {
		t.Fatalf("re-cosigned: %v %v", when, err)
	}

	// Tampering, one part at a time.
	lines := strings.Split(strings.TrimSuffix(string(cosigned), "\n"), "\n")
	last := lines[len(lines)-1]
	raw, err := base64.StdEncoding.DecodeString(last[strings.LastIndexByte(last, ' ')+1:])
	if err != nil || len(raw) != 76 {
		t.Fatalf("cosignature of %d bytes: %v", len(raw), err)
	}
	withRaw := func(f func([]byte)) []byte {
		r := bytes.Clone(raw)
		f(r)
		return []byte(strings.Join(lines[:len(lines)-1], "\n") + "\n— " + w.Name() + " " + base64.StdEncoding.EncodeToString(r) + "\n")
	}
	other := testWitness(t, "witness.example/w2", 4)
	for _, tc := range []struct {
		name     string
		msg      []byte
		witness  string
		want     error
		wantNot  error
		logVKeys string
	}{
		{name: "body", msg: bytes.Replace(cosigned, []byte("\n7\n"), []byte("\n8\n"), 1), want: ErrBadCheckpoint},
		{name: "timestamp", msg: withRaw(func(r []byte) { r[11]++ }), want: ErrBadCosignature},
		{name: "signature", msg: withRaw(func(r []byte) { r[40] ^= 1 }), want: ErrBadCosignature},
		{name: "key id", msg: withRaw(func(r []byte) { r[0] ^= 1 }), want: ErrNotCosigned},
		{name: "other witness", msg: cosigned, witness: other.VerifierKey(), want: ErrNotCosigned},
		{name: "not cosigned", msg: cp.Note, want: ErrNotCosigned},
		{name: "witness key as log key", msg: cosigned, logVKeys: w.VerifierKey(), want: ErrInvalidKeys},
		{name: "log key as witness key", msg: cosigned, witness: vkey, want: ErrInvalidKeys},
	} {
		wk, lk := w.VerifierKey(), vkey
		if tc.witness != "" {
			wk = tc.witness
		}
		if tc.logVKeys != "" {
			lk = tc.logVKeys
		}
		if _, _, err := VerifyCosignature(tc.msg, lk, wk); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}

	// Cosign checks that the note is the checkpoint it claims to be.
	wrong := cp
	wrong.Size++
	if _, err := w.Cosign(wrong, at); !errors.Is(err, ErrBadCheckpoint) {
		t.Errorf("cosign a note of another size: %v", err)
	}
	if _, err := w.Cosign(cp, time.Unix(-1, 0)); !errors.Is(err, ErrBadCosignature) {
		t.Errorf("cosign before 1970: %v", err)
	}
}

// TestCosignatureInterop: a cosigned note still opens with the log's key in
// golang.org/x/mod/sumdb/note, which leaves the cosignature unverified,
// and the cosignature verifies with crypto/ed25519 from the byte layout of
// c2sp.org/tlog-cosignature, written out here.
func TestCosignatureInterop(t *testing.T) {
	lg, _, _ := openTest(t)
	cp := grownCheckpoint(t, lg, 3)
	w := testWitness(t, "witness.example/w1", 3)
	const ts = 1767322000
	cosigned, err := w.Cosign(cp, time.Unix(ts, 0))
	if err != nil {
		t.Fatal(err)
	}
	v, err := sumnote.NewVerifier(lg.PublicKeys().VerifierKey)
	if err != nil {
		t.Fatal(err)
	}
	n, err := sumnote.Open(cosigned, sumnote.VerifierList(v))
	if err != nil {
		t.Fatalf("x/mod note: %v", err)
	}
	if len(n.Sigs) != 1 || n.Sigs[0].Name != lg.Origin() || len(n.UnverifiedSigs) != 1 || n.UnverifiedSigs[0].Name != w.Name() {
		t.Fatalf("x/mod note: sigs %+v, unverified %+v", n.Sigs, n.UnverifiedSigs)
	}
	if n.Text != string(checkpointText(cp.Origin, cp.Size, cp.Root)) {
		t.Fatalf("x/mod note text %q", n.Text)
	}

	// The witness's public key, from its vkey: name+id+base64(0x04 || pub).
	parts := strings.SplitN(w.VerifierKey(), "+", 3)
	keyBytes, err := base64.StdEncoding.DecodeString(parts[2])
	if err != nil || len(keyBytes) != 33 || keyBytes[0] != 0x04 {
		t.Fatalf("vkey key %x: %v", keyBytes, err)
	}
	pub := ed25519.PublicKey(keyBytes[1:])
	id := sha256.Sum256(append([]byte(w.Name()+"\n\x04"), pub...))
	if parts[1] != hex.EncodeToString(id[:4]) {
		t.Fatalf("vkey id %s, want %x", parts[1], id[:4])
	}
	sig, err := base64.StdEncoding.DecodeString(n.UnverifiedSigs[0].Base64)
	if err != nil || len(sig) != 4+8+64 {
		t.Fatalf("signature of %d bytes: %v", len(sig), err)
	}
	if !bytes.Equal(sig[:4], id[:4]) || binary.BigEndian.Uint64(sig[4:12]) != ts {
		t.Fatalf("key id %x, timestamp %d", sig[:4], binary.BigEndian.Uint64(sig[4:12]))
	}
	msg := "cosignature/v1\ntime " + strconv.Itoa(ts) + "\n" + n.Text
	if !ed25519.Verify(pub, []byte(msg), sig[12:]) {
		t.Fatal("cosignature does not verify with crypto/ed25519")
	}
}

func TestAddCosignature(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		w1, w2, stranger := testWitness(t, "witness.example/w1", 3), testWitness(t, "witness.example/w2", 4), testWitness(t, "stranger.example/w", 5)
		lg, dir, clk := openTest(t, WithWitnesses(w1.VerifierKey(), w2.VerifierKey(), w1.VerifierKey()))
		cp1 := grownCheckpoint(t, lg, 5)
		cp2 := grownCheckpoint(t, lg, 4)
		now := clk.Now()
		cosign := func(w WitnessKey, cp Checkpoint, at time.Time) []byte {
			t.Helper()
			b, err := w.Cosign(cp, at)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}

		// Nothing stored yet: the cosigned note is the signed one.
		if got, err := lg.CosignedNote(ctx, cp2); err != nil || !bytes.Equal(got, cp2.Note) {
			t.Fatalf("no cosignatures: %q, %v", got, err)
		}
		cs, err := lg.AddCosignature(ctx, cosign(w1, cp2, now.Add(-time.Minute)))
		if err != nil {
			t.Fatal(err)
		}
		if cs.Witness != w1.VerifierKey() || cs.Name != w1.Name() || cs.Size != 9 || !cs.Time.Equal(now.Add(-time.Minute).Truncate(time.Second)) {
			t.Fatalf("cosignature %+v", cs)
		}
		if _, err := lg.AddCosignature(ctx, cosign(w2, cp2, now)); err != nil {
			t.Fatal(err)
		}
		// An older checkpoint this log issued is accepted too.
		if _, err := lg.AddCosignature(ctx, cosign(w1, cp1, now)); err != nil {
			t.Fatal(err)
		}
		got, err := lg.CosignedNote(ctx, cp2)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range []WitnessKey{w1, w2} {
			if _, when, err := VerifyCosignature(got, lg.PublicKeys().VerifierKey, w.VerifierKey()); err != nil || when.After(now) {
				t.Fatalf("served note, witness %s: %v %v", w.Name(), when, err)
			}
		}
		if !bytes.HasPrefix(got, cp2.Note) {
			t.Fatalf("cosigned note does not extend the signed one:\n%s", got)
		}

		// Only the newest cosignature per witness and checkpoint is kept.
		if _, err := lg.AddCosignature(ctx, cosign(w1, cp2, now.Add(-time.Hour))); err != nil {
			t.Fatalf("older cosignature: %v", err)
		}
		got, _ = lg.CosignedNote(ctx, cp2)
		if _, when, _ := VerifyCosignature(got, lg.PublicKeys().VerifierKey, w1.VerifierKey()); !when.Equal(now.Add(-time.Minute).Truncate(time.Second)) {
			t.Fatalf("an older cosignature replaced a newer one: %v", when)
		}
		if _, err := lg.AddCosignature(ctx, cosign(w1, cp2, now.Add(time.Minute))); err != nil {
			t.Fatal(err)
		}
		got, _ = lg.CosignedNote(ctx, cp2)
		if _, when, _ := VerifyCosignature(got, lg.PublicKeys().VerifierKey, w1.VerifierKey()); !when.Equal(now.Add(time.Minute).Truncate(time.Second)) {
			t.Fatalf("a newer cosignature was dropped: %v", when)
		}
		if n := strings.Count(string(got), "\n— "); n != 3 {
			t.Fatalf("%d signature lines:\n%s", n, got)
		}
		var rows int
		if err := lg.rdb.QueryRow("SELECT count(*) FROM cosignatures").Scan(&rows); err != nil || rows != 3 {
			t.Fatalf("%d rows, want 3 (two witnesses on one checkpoint, one on another): %v", rows, err)
		}
		// A cosigned note handed back (with the log's lines and others) keeps
		// one line per witness.
		if again, err := lg.CosignedNote(ctx, Checkpoint{Size: cp2.Size, Root: cp2.Root, Note: got}); err != nil || !bytes.Equal(again, got) {
			t.Fatalf("cosigned note of a cosigned note:\n%s\n%v", again, err)
		}

		// Refusals.
		keys, err := os.ReadFile(filepath.Join(dir, KeysFile))
		if err != nil {
			t.Fatal(err)
		}
		k, err := ParseKeys(keys)
		if err != nil {
			t.Fatal(err)
		}
		logSigner, err := note.NewSigner(lg.Origin(), k.Checkpoint)
		if err != nil {
			t.Fatal(err)
		}
		forged, err := logSigner.Sign(checkpointText(lg.Origin(), 99, cp2.Root))
		if err != nil {
			t.Fatal(err)
		}
		forkedRoot := cp1.Root
		forked, err := logSigner.Sign(checkpointText(lg.Origin(), cp2.Size, forkedRoot))
		if err != nil {
			t.Fatal(err)
		}
		otherLog, _, _ := openTest(t, WithKeys(testKeys(t, 9)))
		foreign := grownCheckpoint(t, otherLog, 9)
		cosigned := cosign(w1, cp2, now)
		tampered := bytes.Replace(cosigned, []byte(cp2.Note[len(cp2.Note)-10:]), []byte("AAAAAAAAA\n"), 1)
		if bytes.Equal(tampered, cosigned) {
			t.Fatal("tampering changed nothing")
		}
		both := cosign(w2, Checkpoint{Origin: cp2.Origin, Size: cp2.Size, Root: cp2.Root, Note: cosigned}, now)
		for _, tc := range []struct {
			name string
			note []byte
			want error
		}{
			{"unknown witness", cosign(stranger, cp2, now), ErrUnknownWitness},
			{"no cosignature", cp2.Note, ErrUnknownWitness},
			{"not issued: beyond the log", cosign(w1, Checkpoint{Origin: lg.Origin(), Size: 99, Root: cp2.Root, Note: forged}, now), ErrNotFound},
			{"not issued: another root", cosign(w1, Checkpoint{Origin: lg.Origin(), Size: cp2.Size, Root: forkedRoot, Note: forked}, now), ErrNotFound},
			{"another log's checkpoint", cosign(w1, foreign, now), ErrBadCheckpoint},
			{"log signature broken", tampered, ErrBadCheckpoint},
			{"bad cosignature", bytes.Replace(cosigned, []byte(cp2.Note), cp1.Note, 1), ErrBadCosignature},
			{"far in the future", cosign(w1, cp2, now.Add(time.Hour)), ErrBadCosignature},
			{"two witnesses at once", both, ErrBadCosignature},
			{"too large", append(bytes.Repeat([]byte("x"), MaxNoteBytes), cosigned...), ErrTooLarge},
		} {
			if _, err := lg.AddCosignature(ctx, tc.note); !errors.Is(err, tc.want) {
				t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
			}
		}
		if err := lg.rdb.QueryRow("SELECT count(*) FROM cosignatures").Scan(&rows); err != nil || rows != 3 {
			t.Fatalf("refusals stored rows: %d, %v", rows, err)
		}
		// The log's own append-only state is untouched by cosignatures.
		if lg.Size() != 9 {
			t.Fatalf("size %d", lg.Size())
		}
	})
}

func TestCosignaturesAcrossOpens(t *testing.T) {
	ctx := context.Background()
	w := testWitness(t, "witness.example/w1", 3)
	if _, err := Open(ctx, t.TempDir(), WithWitnesses("witness.example/w1+00000000+AAAA")); !errors.Is(err, ErrInvalidKeys) {
		t.Fatalf("open with a malformed witness key: %v", err)
	}
	if _, err := Open(ctx, t.TempDir(), WithWitnesses(w.VerifierKey()[:len(w.VerifierKey())-4]+"AAA=")); !errors.Is(err, ErrInvalidKeys) {
		t.Fatalf("open with a witness key whose id does not match: %v", err)
	}

	dir := t.TempDir()
	clk := newStepClock()
	opts := []Option{WithClock(clk.Now), WithRand(seeded(1)), WithOrigin("test.fleetlearn/audit")}
	lg, err := Open(ctx, dir, opts...)
	if err != nil {
		t.Fatal(err)
	}
	cp := grownCheckpoint(t, lg, 3)
	// A log without witnesses accepts no cosignature.
	if _, err := lg.AddCosignature(ctx, mustCosign(t, w, cp, clk.Now())); !errors.Is(err, ErrUnknownWitness) {
		t.Fatalf("log without witnesses: %v", err)
	}
	lg.Close()

	// A log made before cosignatures: no table. Open adds it.
	db, err := sql.Open("sqlite", filepath.Join(dir, DBFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("DROP TABLE cosignatures"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	ro, err := OpenReadOnly(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	latest, err := ro.Latest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ro.CosignedNote(ctx, latest); err != nil || !bytes.Equal(got, latest.Note) {
		t.Fatalf("read-only, no table: %q %v", got, err)
	}
	if _, err := ro.AddCosignature(ctx, latest.Note); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("read-only add: %v", err)
	}
	ro.Close()

	lg, err = Open(ctx, dir, append(opts, WithWitnesses(w.VerifierKey()))...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lg.AddCosignature(ctx, mustCosign(t, w, cp, clk.Now())); err != nil {
		t.Fatal(err)
	}
	if err := lg.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := lg.AddCosignature(ctx, mustCosign(t, w, cp, clk.Now())); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed log: %v", err)
	}

	// Read-only, with the table: the stored cosignature is served.
	ro, err = OpenReadOnly(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	latest, err = ro.Latest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ro.CosignedNote(ctx, latest)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := VerifyCosignature(got, ro.PublicKeys().VerifierKey, w.VerifierKey()); err != nil {
		t.Fatalf("read-only cosigned note: %v\n%s", err, got)
	}
}

func mustCosign(t testing.TB, w WitnessKey, cp Checkpoint, at time.Time) []byte {
	t.Helper()
	b, err := w.Cosign(cp, at)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
