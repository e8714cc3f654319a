package audit_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"golang.org/x/mod/sumdb/note"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/internal/pgtest"
)

// thirdParty checks an export with --proofs the way an auditor without
// Fleetlearn's code would, from RFC 6962/9162, RFC 8037 and C2SP alone:
// golang.org/x/mod/sumdb/note opens the checkpoints, transparency-dev/merkle
// checks the proofs, crypto/ed25519 the entry signatures. It returns how
// many proofs it checked, or the first failure.
func thirdParty(export []byte) (int, error) {
	sc := bufio.NewScanner(bytes.NewReader(export))
	sc.Buffer(nil, 4<<20)
	type hashes struct {
		FromSize *uint64  `json:"from_size"`
		TreeSize *uint64  `json:"tree_size"`
		Proof    []string `json:"proof"`
	}
	var rec struct {
		Kind           string          `json:"kind"`
		Origin         string          `json:"origin"`
		EntryKeys      json.RawMessage `json:"entry_keys"`
		CheckpointVKey string          `json:"checkpoint_vkey"`
		Note           string          `json:"note"`
		Consistency    *hashes         `json:"consistency"`
		Index          uint64          `json:"index"`
		JWS            string          `json:"jws"`
		Inclusion      *hashes         `json:"inclusion"`
	}
	var verifier note.Verifier
	var entryKey ed25519.PublicKey
	roots := map[uint64][]byte{}
	var prevSize uint64
	checked := 0
	decode := func(hs []string) ([][]byte, error) {
		out := make([][]byte, len(hs))
		for i, h := range hs {
			b, err := hex.DecodeString(h)
			if err != nil {
				return nil, err
			}
			out[i] = b
		}
		return out, nil
	}
	for sc.Scan() {
		rec.Consistency, rec.Inclusion = nil, nil
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return checked, err
		}
		switch rec.Kind {
		case "header":
			v, err := note.NewVerifier(rec.CheckpointVKey)
			if err != nil {
				return checked, err
			}
			verifier = v
			var set struct {
				Keys []struct{ Kty, Crv, X string }
			}
			if err := json.Unmarshal(rec.EntryKeys, &set); err != nil || len(set.Keys) != 1 || set.Keys[0].Crv != "Ed25519" {
				return checked, fmt.Errorf("entry keys %s: %v", rec.EntryKeys, err)
			}
			x, err := base64.RawURLEncoding.DecodeString(set.Keys[0].X)
			if err != nil {
				return checked, err
			}
			entryKey = x
		case "checkpoint":
			n, err := note.Open([]byte(rec.Note), note.VerifierList(verifier))
			if err != nil {
				return checked, fmt.Errorf("checkpoint: %w", err)
			}
			lines := strings.Split(n.Text, "\n")
			if lines[0] != rec.Origin {
				return checked, fmt.Errorf("checkpoint of %q", lines[0])
			}
			size, err := strconv.ParseUint(lines[1], 10, 64)
			if err != nil {
				return checked, err
			}
			root, err := base64.StdEncoding.DecodeString(lines[2])
			if err != nil {
				return checked, err
			}
			if c := rec.Consistency; c != nil {
				p, err := decode(c.Proof)
				if err != nil {
					return checked, err
				}
				if *c.FromSize != prevSize {
					return checked, fmt.Errorf("consistency from %d, previous checkpoint is %d", *c.FromSize, prevSize)
				}
				if err := proof.VerifyConsistency(rfc6962.DefaultHasher, prevSize, size, p, roots[prevSize], root); err != nil {
					return checked, fmt.Errorf("consistency %d→%d: %w", prevSize, size, err)
				}
				checked++
			}
			roots[size], prevSize = root, size
		case "entry":
			parts := strings.Split(rec.JWS, ".")
			sig, err := base64.RawURLEncoding.DecodeString(parts[len(parts)-1])
			if err != nil || len(parts) != 3 || !ed25519.Verify(entryKey, []byte(parts[0]+"."+parts[1]), sig) {
				return checked, fmt.Errorf("entry %d: bad signature", rec.Index)
			}
			if c := rec.Inclusion; c != nil {
				p, err := decode(c.Proof)
				if err != nil {
					return checked, err
				}
				leaf := rfc6962.DefaultHasher.HashLeaf([]byte(rec.JWS))
				if err := proof.VerifyInclusion(rfc6962.DefaultHasher, rec.Index, *c.TreeSize, leaf, p, roots[*c.TreeSize]); err != nil {
					return checked, fmt.Errorf("entry %d: %w", rec.Index, err)
				}
				checked++
			}
		}
	}
	return checked, sc.Err()
}

func TestProofsVerifyWithIndependentCode(t *testing.T) {
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			now := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
			opts := []audit.Option{audit.WithOrigin("fleetlearn.example.com/audit"),
				audit.WithClock(func() time.Time { now = now.Add(time.Millisecond); return now })}
			if backend == "postgres" {
				opts = append(opts, audit.WithDatabase(pgtest.Database(t)))
			}
			lg, err := audit.Open(ctx, t.TempDir(), opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer lg.Close()
			// Checkpoints at sizes 1, 5, 6, 13, 32, 57: odd shapes and a power of two.
			entries, checkpoints := 0, 0
			for _, n := range []int{1, 4, 1, 7, 19, 25} {
				for range n {
					_, err := lg.Record(ctx, audit.Operator("alice"), audit.OperatorAction{Method: "fleetlearn.api.v1.TaskService/StopTask",
						Resource: fmt.Sprintf("tasks/t-%d", entries), Result: audit.ResultDenied, Code: "PERMISSION_DENIED"})
					if err != nil {
						t.Fatal(err)
					}
					entries++
				}
				if _, err := lg.Checkpoint(ctx); err != nil {
					t.Fatal(err)
				}
				checkpoints++
			}
			var buf bytes.Buffer
			if err := lg.Export(ctx, &buf, audit.WithProofs()); err != nil {
				t.Fatal(err)
			}
			export := buf.Bytes()
			checked, err := thirdParty(export)
			if err != nil {
				t.Fatalf("independent verification: %v", err)
			}
			// The first checkpoint is of the empty tree, so every later one has a
			// consistency proof but the one from size 0.
			if want := entries + checkpoints - 1; checked != want {
				t.Fatalf("independent verifier checked %d proofs, want %d", checked, want)
			}
			rep, err := audit.VerifyExport(bytes.NewReader(export))
			if err != nil || rep.Proofs != checked {
				t.Fatalf("VerifyExport: %d proofs, %v", rep.Proofs, err)
			}

			// A changed entry or proof fails the independent check too.
			for _, c := range []struct{ name, old, new, want string }{
				{"entry bytes", `"jws":"ey`, `"jws":"ex`, "entry 40: bad signature"},
				{"inclusion proof", `"proof":["`, `"proof":["0`, "entry 40: "},
			} {
				lines := bytes.Split(bytes.Clone(export), []byte("\n"))
				for i, l := range lines {
					if bytes.Contains(l, []byte(`"index":40,`)) && bytes.Contains(l, []byte(`"kind":"entry"`)) {
						// Keep the hash 64 digits long: drop its last one.
						l = bytes.Replace(l, []byte(c.old), []byte(c.new), 1)
						if c.name == "inclusion proof" {
							j := bytes.Index(l, []byte(`"proof":["`)) + len(`"proof":["`) + 64
							l = append(l[:j:j], l[j+1:]...)
						}
						lines[i] = l
					}
				}
				_, err := thirdParty(bytes.Join(lines, []byte("\n")))
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Errorf("%s of entry 40 changed: %v", c.name, err)
				}
			}
		})
	}
}
