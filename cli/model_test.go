package cli_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/cli"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/train"
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
	parent := f.addModel("base", safetensors(3))
	data := safetensors(650_000) // 2.5 MiB: three chunks
	path := writeFile(t, "m.safetensors", data)
	// --parent takes a model reference and sends the version it names.
	out, err := run(t, addr, "model", "import", path, "--name", "mnist", "--parent", "base@1", "--description", "pretrained")
	if err != nil {
		t.Fatal(err)
	}
	if out != digest(data)+"\n" {
		t.Errorf("output = %q, want the version", out)
	}
	h := f.importHeader
	if h.GetName() != "mnist" || h.GetParentVersion() != parent.GetRef().GetVersion() || h.GetDescription() != "pretrained" ||
		h.GetSizeBytes() != uint64(len(data)) || h.GetSha256() != digest(data) {
		t.Errorf("header = %v", h)
	}
	if f.importChunks != 3 || !bytes.Equal(f.data[digest(data)], data) {
		t.Errorf("server got %d chunks, %d bytes", f.importChunks, len(f.data[digest(data)]))
	}

	// The server's refusal is reported.
	_, err = run(t, addr, "model", "import", path, "--name", "mnist")
	if status.Code(err) != codes.AlreadyExists || err.Error() != "import model: model "+digest(data)+": already exists" {
		t.Errorf("duplicate import: %v", err)
	}
	// A parent that names no model is refused before the upload.
	f.importHeader = nil
	_, err = run(t, addr, "model", "import", writeFile(t, "n.safetensors", safetensors(4)), "--name", "mnist", "--parent", "base@2")
	if !errors.Is(err, cli.ErrUnknownModel) || err.Error() != "--parent: base has 1 version; base@2 does not exist" || f.importHeader != nil {
		t.Errorf("unknown parent: %v (upload %v)", err, f.importHeader)
	}
	// A name that would make NAME@N ambiguous is refused.
	if _, err := run(t, addr, "model", "import", path, "--name", "mnist@2"); !errors.Is(err, cli.ErrUsage) ||
		!strings.Contains(err.Error(), "may not contain @") {
		t.Errorf("--name mnist@2: %v", err)
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
	f.addModel("mnist", safetensors(1))
	f.addModel("mnist", safetensors(2))
	f.addModel("mnist", data)
	dir := t.TempDir()
	path := filepath.Join(dir, "out.safetensors")
	if err := os.WriteFile(path, []byte("old contents"), 0o600); err != nil {
		t.Fatal(err)
	}
	// mnist@3, mnist (the newest), the sha256 and a prefix of it are the same model.
	for _, ref := range []string{"mnist@3", "mnist", digest(data), strings.ToUpper(digest(data)[:12])} {
		out, err := run(t, addr, "model", "export", ref, "-o", path)
		if err != nil {
			t.Fatalf("export %s: %v", ref, err)
		}
		if want := "mnist@3 -> " + path + " (39.1 KiB, file sha256 " + digest(data) + ": the version)\n"; out != want {
			t.Errorf("export %s: output = %q, want %q", ref, out, want)
		}
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("exported file: %d bytes, %v", len(got), err)
		}
	}
	onlyFile(t, dir, "out.safetensors")

	// A download that does not match its metadata leaves the old file alone.
	f.corruptExport = true
	_, err := run(t, addr, "model", "export", "mnist@3", "-o", path)
	if !errors.Is(err, cli.ErrProtocol) {
		t.Errorf("corrupt export: %v", err)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, data) {
		t.Error("a failed export replaced the file")
	}
	onlyFile(t, dir, "out.safetensors")

	_, err = run(t, addr, "model", "export", "nope@1", "-o", filepath.Join(dir, "nope.safetensors"))
	if !errors.Is(err, cli.ErrUnknownModel) || err.Error() != "no model named nope; fleetlearn model list shows the models" {
		t.Errorf("unknown name: %v", err)
	}
	_, err = run(t, addr, "model", "export", strings.Repeat("0", 64), "-o", filepath.Join(dir, "nope.safetensors"))
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
	big, small := make([]byte, 3<<20), safetensors(1)
	v1 := f.addModel("mnist", big).GetRef().GetVersion()
	f.addModel("cifar", safetensors(2))
	v2 := f.addModel("mnist", small).GetRef().GetVersion()
	out, err := run(t, addr, "model", "list", "--name", "mnist")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "MODEL    VERSION") || !strings.HasPrefix(lines[1], "mnist@2  "+v2) ||
		!strings.HasPrefix(lines[2], "mnist@1  "+v1) || !strings.Contains(lines[2], "3.0 MiB") {
		t.Errorf("model list --name mnist:\n%s", out)
	}
	// Without --name the numbers are the same: each counts within its name.
	out, err = run(t, addr, "model", "list")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"mnist@2  " + v2, "cifar@1  ", "mnist@1  " + v1} {
		if !strings.Contains(out, s) {
			t.Errorf("model list lacks %q:\n%s", s, out)
		}
	}
	out, err = run(t, addr, "model", "get", "mnist@1")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"MODEL", "mnist@1", v1, "imported", "3.0 MiB (3145728 bytes)", "7850"} {
		if !strings.Contains(out, s) {
			t.Errorf("model get lacks %q:\n%s", s, out)
		}
	}
	out, err = run(t, addr, "model", "get", "mnist", "-o", "json")
	if err != nil || !strings.Contains(out, `"parameter_count"`) || !strings.Contains(out, v2) {
		t.Errorf("model get mnist -o json: %v\n%s", err, out)
	}
	for ref, want := range map[string]string{
		"nope":         "no model named nope; fleetlearn model list shows the models",
		"mnist@3":      "mnist has 2 versions; mnist@3 does not exist",
		"mnist@0":      "mnist@0 does not exist: versions count from 1 (mnist@1 is the oldest)",
		"abc":          "no model named abc, and a sha256 prefix needs at least 12 hexadecimal digits; fleetlearn model list shows the models",
		"abcdef012345": "no model named abcdef012345 or with a sha256 starting abcdef012345; fleetlearn model list shows the models",
	} {
		_, err = run(t, addr, "model", "get", ref)
		if !errors.Is(err, cli.ErrUnknownModel) || err.Error() != want {
			t.Errorf("model get %s: %v, want %q", ref, err, want)
		}
	}
	_, err = run(t, addr, "model", "get", strings.Repeat("0", 64))
	if status.Code(err) != codes.NotFound || err.Error() != `get model: model "`+strings.Repeat("0", 64)+`": not found` {
		t.Errorf("unknown version: %v", err)
	}
}

// TestModelRefPrefix: a sha256 prefix names the one version that has it;
// one that two versions share, or that is also a name, is refused.
func TestModelRefPrefix(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	a, b := f.addModel("x", safetensors(1)), f.addModel("y", safetensors(2))
	// Two versions with a common 12-digit prefix, as a collision would give.
	const prefix = "0123456789ab"
	f.mu.Lock()
	a.Ref.Version = prefix + a.Ref.Version[12:]
	b.Ref.Version = prefix + b.Ref.Version[12:]
	f.mu.Unlock()
	out, err := run(t, addr, "model", "get", a.Ref.Version[:13])
	if err != nil || !strings.Contains(out, "x@1") {
		t.Errorf("unique prefix: %v\n%s", err, out)
	}
	_, err = run(t, addr, "model", "get", prefix)
	if !errors.Is(err, cli.ErrUnknownModel) || !strings.Contains(err.Error(), "sha256 prefix "+prefix+" matches 2 models") {
		t.Errorf("shared prefix: %v", err)
	}
	f.addModel(a.Ref.Version[:13], safetensors(3))
	_, err = run(t, addr, "model", "get", a.Ref.Version[:13])
	if !errors.Is(err, cli.ErrUnknownModel) || !strings.Contains(err.Error(), "both a model name and a sha256 prefix") {
		t.Errorf("name and prefix: %v", err)
	}
}

func TestModelExportMergeLoRA(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	base, err := train.InitLM(train.LMConfig{Vocab: 5, Context: 4, Dim: 8, Layers: 1}, 1)
	if err != nil {
		t.Fatal(err)
	}
	lora, err := train.AddLoRA(base, 2, []string{"attn.q"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	// Non-zero B, so that the merge changes the query weight.
	for i := range lora.Tensors {
		if strings.HasSuffix(lora.Tensors[i].Name, ".lora_b") {
			for j := range lora.Tensors[i].Data {
				lora.Tensors[i].Data[j] = 0.5
			}
		}
	}
	encode := func(m *model.Model) []byte {
		var buf bytes.Buffer
		if err := model.WriteSafetensors(&buf, m); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	f.addModel("tuned", encode(lora))
	f.addModel("plain", encode(base))
	path := filepath.Join(t.TempDir(), "merged.safetensors")
	if _, err := run(t, addr, "model", "export", "tuned", "--merge-lora", "-o", path); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := model.ReadSafetensors(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	want, err := train.MergeLoRA(lora)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Tensors) != len(base.Tensors) || got.Layout().Size() != want.Layout().Size() {
		t.Fatalf("merged export has %d tensors, want %d", len(got.Tensors), len(base.Tensors))
	}
	for i := range want.Tensors {
		if !slices.Equal(got.Tensors[i].Data, want.Tensors[i].Data) {
			t.Fatalf("%s differs from train.MergeLoRA", want.Tensors[i].Name)
		}
	}
	if _, err := run(t, addr, "model", "export", "plain", "--merge-lora", "-o", path+".2"); !errors.Is(err, cli.ErrUsage) ||
		!strings.Contains(err.Error(), "no LoRA adapters") {
		t.Fatalf("merging a model without adapters: %v", err)
	}
}

// TestDataAndModelExamples: every data and model command shows examples in
// its help.
func TestDataAndModelExamples(t *testing.T) {
	root := cli.NewRootCommand()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Example == "" && !c.Hidden {
			t.Errorf("%s has no examples", c.CommandPath())
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	for _, name := range []string{"data", "model"} {
		c, _, err := root.Find([]string{name})
		if err != nil || c.Name() != name {
			t.Fatalf("no %s command: %v", name, err)
		}
		walk(c)
	}
}
