package cli_test

import (
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/cli"
)

// A pin file from audit keys pins the keys for verify; an export with
// --proofs carries a proof per entry, from the server and from a data
// directory; verify --data-dir checks the query index an export lacks.
func TestAuditKeysProofsAndDataDir(t *testing.T) {
	h, _ := auditServer(t, 5)
	dir := t.TempDir()

	pin := filepath.Join(dir, "audit.pin")
	if out, err := runServer(t, h, "audit", "keys", "-o", pin); err != nil || out != "wrote "+pin+"\n" {
		t.Fatalf("keys = %q, %v", out, err)
	}
	b, err := os.ReadFile(pin)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := audit.ParsePin(b); err != nil || p.Origin != audit.DefaultOrigin || !strings.Contains(string(b), "SHA-256") {
		t.Fatalf("pin file %s: %v", b, err)
	}

	export := filepath.Join(dir, "proofs.jsonl")
	if _, err := runServer(t, h, "audit", "export", "--proofs", "-o", export); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "", "audit", "verify", export, "--pin", pin)
	if err != nil {
		t.Fatal(err)
	}
	rep := parseReport(out)
	if !strings.HasPrefix(rep["proofs:"], "5 ") && !strings.HasPrefix(rep["proofs:"], "6 ") {
		t.Errorf("proofs from the server: %q\n%s", rep["proofs:"], out)
	}
	for _, want := range []string{"(pinned)", "not in an export", "a rollback to an earlier checkpoint would pass"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if _, err := run(t, "", "audit", "verify", export, "--pin", pin, "--jwks", pin); !errors.Is(err, cli.ErrUsage) {
		t.Errorf("--pin with --jwks: %v", err)
	}

	if err := h.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	offline := filepath.Join(dir, "offline.jsonl")
	if _, err := run(t, "", "audit", "export", "--data-dir", h.Dir, "--proofs", "-o", offline); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "", "audit", "verify", offline, "--pin", pin); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, "", "audit", "verify", "--data-dir", h.Dir, "--pin", pin)
	if err != nil || !strings.Contains(out, "every row matches its signed entry") {
		t.Fatalf("verify --data-dir = %q, %v", out, err)
	}
	if _, err := run(t, "", "audit", "verify", offline, "--data-dir", h.Dir); !errors.Is(err, cli.ErrUsage) {
		t.Errorf("EXPORT with --data-dir: %v", err)
	}

	// An edited query column passes an export's verification, which
	// cannot see it, but not the data directory's.
	db, err := sql.Open("sqlite", filepath.Join(h.Dir, "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE entries SET actor = 'mallory' WHERE idx = 2"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	_, err = run(t, "", "audit", "verify", "--data-dir", h.Dir, "--pin", pin)
	var ve *audit.VerifyError
	if !errors.As(err, &ve) || ve.Index != 2 || !errors.Is(err, audit.ErrIndexMismatch) || !strings.Contains(err.Error(), "column actor") {
		t.Fatalf("edited actor column: %v", err)
	}
}

// parseReport splits verify's "name: value" rows.
func parseReport(out string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, " "); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}
