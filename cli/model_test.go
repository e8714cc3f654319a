package cli_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/cli"
)

// safetensors returns a safetensors file with one F32 tensor of n values.
func safetensors(n int) []byte {
	header := fmt.Sprintf(`{"w":{"dtype":"F32","shape":[%d],"data_offsets":[0,%d]}}`, n, 4*n)
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	for i := range n {
		b = binary.LittleEndian.AppendUint32(b, uint32(i))
	}
	return b
}

func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestModelImport(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	data := safetensors(650_000) // 2.5 MiB: three chunks
	path := writeFile(t, "m.safetensors", data)
	out, err := run(t, addr, "model", "import", path, "--name", "mnist", "--parent", "base@1", "--description", "pretrained")
	if err != nil {
		t.Fatal(err)
	}
	if out != "mnist@1\n" {
		t.Errorf("output = %q, want the version", out)
	}
	h := f.importHeader
	if h.GetName() != "mnist" || h.GetParentVersion() != "base@1" || h.GetDescription() != "pretrained" ||
		h.GetSizeBytes() != uint64(len(data)) || h.GetSha256() != digest(data) {
		t.Errorf("header = %v", h)
	}
	if f.importChunks != 3 || !bytes.Equal(f.data["mnist@1"], data) {
		t.Errorf("server got %d chunks, %d bytes", f.importChunks, len(f.data["mnist@1"]))
	}

	// The server's refusal is reported.
	_, err = run(t, addr, "model", "import", path, "--name", "mnist", "--version", "mnist@1")
	if status.Code(err) != codes.AlreadyExists || err.Error() != `import model: model "mnist@1": already exists` {
		t.Errorf("duplicate import: %v", err)
	}
}

func TestModelImportRefusesBadFiles(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		path string
		want error
	}{
		{"not safetensors", writeFile(t, "x.safetensors", []byte("PK\x03\x04 a zip file, not a model")), cli.ErrInput},
		{"header longer than file", writeFile(t, "x.safetensors", append(binary.LittleEndian.AppendUint64(nil, 1<<40), '{')), cli.ErrInput},
		{"too short", writeFile(t, "x.safetensors", []byte{1, 0}), cli.ErrInput},
		{"empty", writeFile(t, "x.safetensors", nil), cli.ErrInput},
		{"directory", dir, cli.ErrInput},
		{"missing", filepath.Join(dir, "missing.safetensors"), os.ErrNotExist},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := run(t, addr, "model", "import", tc.path, "--name", "m")
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if f.importHeader != nil {
				t.Fatal("the upload reached the server")
			}
		})
	}
	if _, err := run(t, addr, "model", "import", writeFile(t, "m.safetensors", safetensors(1))); err == nil ||
		!strings.Contains(err.Error(), `"name"`) {
		t.Errorf("import without --name: %v", err)
	}
}

func TestModelExport(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	data := safetensors(10_000)
	f.addModel("mnist", "mnist@3", data)
	dir := t.TempDir()
	path := filepath.Join(dir, "out.safetensors")
	if err := os.WriteFile(path, []byte("old contents"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, addr, "model", "export", "mnist@3", "-o", path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "mnist@3 -> "+path+" (39.1 KiB, sha256 "+digest(data)) {
		t.Errorf("output = %q", out)
	}
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("exported file: %d bytes, %v", len(got), err)
	}
	onlyFile(t, dir, "out.safetensors")

	// A download that does not match its metadata leaves the old file alone.
	f.corruptExport = true
	_, err = run(t, addr, "model", "export", "mnist@3", "-o", path)
	if !errors.Is(err, cli.ErrProtocol) {
		t.Errorf("corrupt export: %v", err)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, data) {
		t.Error("a failed export replaced the file")
	}
	onlyFile(t, dir, "out.safetensors")

	_, err = run(t, addr, "model", "export", "nope@1", "-o", filepath.Join(dir, "nope.safetensors"))
	if status.Code(err) != codes.NotFound {
		t.Errorf("unknown version: %v", err)
	}
	onlyFile(t, dir, "out.safetensors")
	if _, err := run(t, addr, "model", "export", "mnist@3"); err == nil || !strings.Contains(err.Error(), `"output"`) {
		t.Errorf("export without -o: %v", err)
	}
}

// onlyFile fails unless dir holds exactly the file name: no temporary files
// are left behind.
func onlyFile(t *testing.T, dir, name string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != name {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("directory holds %v, want only %s", names, name)
	}
}

func TestModelListGet(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	f.addModel("mnist", "mnist@1", make([]byte, 3<<20))
	f.addModel("mnist", "mnist@2", make([]byte, 100))
	f.addModel("cifar", "cifar@1", make([]byte, 100))
	out, err := run(t, addr, "model", "list", "--name", "mnist")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "VERSION") || !strings.HasPrefix(lines[1], "mnist@2") ||
		!strings.HasPrefix(lines[2], "mnist@1") || !strings.Contains(lines[2], "3.0 MiB") {
		t.Errorf("model list:\n%s", out)
	}
	out, err = run(t, addr, "model", "get", "mnist@1")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"VERSION", "mnist@1", "imported", "3.0 MiB (3145728 bytes)", "7850"} {
		if !strings.Contains(out, s) {
			t.Errorf("model get lacks %q:\n%s", s, out)
		}
	}
	out, err = run(t, addr, "model", "get", "mnist@1", "-o", "json")
	if err != nil || !strings.Contains(out, `"parameter_count"`) {
		t.Errorf("model get -o json: %v\n%s", err, out)
	}
	_, err = run(t, addr, "model", "get", "nope@1")
	if status.Code(err) != codes.NotFound || err.Error() != `get model: model "nope@1": not found` {
		t.Errorf("unknown model: %v", err)
	}
}
