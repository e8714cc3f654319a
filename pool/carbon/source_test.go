package carbon

import (
	"bytes"
	"context"
	"errors"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestFileSource(t *testing.T) {
	fs, raw, err := FileSource{Path: "testdata/watttime.json"}.Forecasts(context.Background())
	if err != nil || len(fs) != 1 || fs[0].Zone != "CAISO_NORTH" {
		t.Fatalf("%v, %v", fs, err)
	}
	if !bytes.Equal(raw, readTestdata(t, "watttime.json")) {
		t.Fatal("raw bytes differ from the file")
	}

	dir := t.TempDir()
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, bytes.Repeat([]byte(" "), MaxInputBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := (FileSource{Path: big}).Forecasts(context.Background()); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("big file: %v", err)
	}
	if _, _, err := (FileSource{Path: filepath.Join(dir, "none.json")}).Forecasts(context.Background()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"foo":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := (FileSource{Path: bad}).Forecasts(context.Background()); !errors.Is(err, ErrUnknownFormat) || !strings.Contains(err.Error(), bad) {
		t.Fatalf("bad file: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := (FileSource{Path: "testdata/watttime.json"}).Forecasts(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

// TestNoNetwork shows that planning from a forecast file cannot make a
// network call: nothing in this package, tests included, imports a network
// package. (architecture_test.go enforces the same for all of pool.)
func TestNoNetwork(t *testing.T) {
	banned := []string{"net", "crypto/tls", "google.golang.org/grpc", "github.com/nats-io"}
	files, err := filepath.Glob("*.go")
	if err != nil || len(files) < 5 {
		t.Fatalf("found %d Go files: %v", len(files), err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			for _, b := range banned {
				if p == b || strings.HasPrefix(p, b+"/") {
					t.Errorf("%s imports %s", name, p)
				}
			}
		}
	}
}
