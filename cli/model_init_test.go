package cli

// Internal tests: the command is built by its constructor, as the root
// command registers it.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/train"
)

func modelInitCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newModelInitCommand(&app{getenv: func(string) string { return "" }})
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(t.Context())
	return out.String(), err
}

func readModel(t *testing.T, path string) (*model.Model, []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.ReadSafetensors(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return m, b
}

func TestModelInit(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "base.safetensors")
	out, err := modelInitCLI(t, "--arch", "mlp:784,128,10", "-o", path, "--seed", "3")
	if err != nil {
		t.Fatal(err)
	}
	m, b := readModel(t, path)

	type shape struct {
		name  string
		shape []int
	}
	var got []shape
	for _, ts := range m.Tensors {
		got = append(got, shape{ts.Name, ts.Shape})
	}
	want := []shape{{"fc1.weight", []int{128, 784}}, {"fc1.bias", []int{128}}, {"fc2.weight", []int{10, 128}}, {"fc2.bias", []int{10}}}
	if !slices.EqualFunc(got, want, func(a, b shape) bool { return a.name == b.name && slices.Equal(a.shape, b.shape) }) {
		t.Fatalf("tensors %v, want %v", got, want)
	}
	// The demo's initialisation, value for value.
	ref, err := train.InitMLP([]int{784, 128, 10}, 3)
	if err != nil {
		t.Fatal(err)
	}
	if m.HashHex() != ref.HashHex() {
		t.Error("the file's weights differ from train.InitMLP's for the same seed")
	}
	if sizes, err := train.Layers(m, 784, 10); err != nil || !slices.Equal(sizes, []int{784, 128, 10}) {
		t.Errorf("train.Layers = %v, %v", sizes, err)
	}
	if m.Lineage.Source != "fleetlearn model init --arch mlp:784,128,10 --seed 3" {
		t.Errorf("lineage source %q", m.Lineage.Source)
	}

	sum := sha256.Sum256(b)
	for _, line := range []string{
		"wrote " + path + ": mlp:784,128,10, 101770 parameters in 4 tensors, seed 3 (",
		"  file sha256  " + hex.EncodeToString(sum[:]) + "  of the file's bytes",
		"  content hash " + m.HashHex() + "  of tensor names, shapes and values (and a seq: layer list) alone",
		"next: fleetlearn model import " + path + " --name mnist\n",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("output %q lacks %q", out, line)
		}
	}

	// Deterministic for a seed, different for another.
	again := filepath.Join(dir, "again.safetensors")
	if _, err := modelInitCLI(t, "--arch", "mlp:784,128,10", "-o", again, "--seed", "3"); err != nil {
		t.Fatal(err)
	}
	if _, b2 := readModel(t, again); !bytes.Equal(b, b2) {
		t.Error("same arch and seed gave different files")
	}
	other := filepath.Join(dir, "other.safetensors")
	if _, err := modelInitCLI(t, "--arch", "mlp:784,128,10", "-o", other, "--seed", "4"); err != nil {
		t.Fatal(err)
	}
	if m2, _ := readModel(t, other); m2.HashHex() == m.HashHex() {
		t.Error("seeds 3 and 4 gave the same weights")
	}
}

func TestModelInitDeepAndNamed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "deep model.safetensors")
	out, err := modelInitCLI(t, "--arch", "mlp:20,16,8,3", "-o", path, "--name", "tiny mlp")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := readModel(t, path)
	if sizes, err := train.Layers(m, 20, 3); err != nil || !slices.Equal(sizes, []int{20, 16, 8, 3}) {
		t.Errorf("train.Layers = %v, %v", sizes, err)
	}
	if n := len(m.Flatten()); n != 20*16+16+16*8+8+8*3+3 {
		t.Errorf("%d parameters", n)
	}
	if want := "next: fleetlearn model import '" + path + "' --name 'tiny mlp'\n"; !strings.Contains(out, want) {
		t.Errorf("output %q lacks %q", out, want)
	}
}

func TestModelInitRefusesOverwrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "base.safetensors")
	if _, err := modelInitCLI(t, "--arch", "mlp:4,2", "-o", path, "--seed", "1"); err != nil {
		t.Fatal(err)
	}
	_, before := readModel(t, path)
	_, err := modelInitCLI(t, "--arch", "mlp:4,2", "-o", path, "--seed", "2")
	if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("overwrite without --force: %v", err)
	}
	if _, after := readModel(t, path); !bytes.Equal(before, after) {
		t.Fatal("refused overwrite changed the file")
	}
	if _, err := modelInitCLI(t, "--arch", "mlp:4,2", "-o", path, "--seed", "2", "--force"); err != nil {
		t.Fatal(err)
	}
	if _, after := readModel(t, path); bytes.Equal(before, after) {
		t.Error("--force did not replace the file")
	}
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil || len(entries) != 1 {
		t.Errorf("directory holds %v (%v), want the model alone", entries, err)
	}
}

func TestModelInitRefusesBadArch(t *testing.T) {
	seventeen := "mlp:" + strings.Repeat("2,", 16) + "2"
	for _, tc := range []struct{ arch, want string }{
		{"", "want mlp:SIZES"},
		{"784,128,10", "want mlp:SIZES"},
		{"cnn:784,10", "want mlp:SIZES"},
		{"MLP:784,10", "want mlp:SIZES"},
		{"mlp:", "1 layer sizes, want 2 to 16"},
		{"mlp:784", "1 layer sizes, want 2 to 16"},
		{seventeen, "17 layer sizes, want 2 to 16"},
		{"mlp:784,,10", `layer size ""`},
		{"mlp:784,128,", `layer size ""`},
		{"mlp:0,10", `layer size "0"`},
		{"mlp:65537,10", `layer size "65537"`},
		{"mlp:-1,10", `layer size "-1"`},
		{"mlp:+5,10", `layer size "+5"`},
		{"mlp: 5,10", `layer size " 5"`},
		{"mlp:1.5,10", `layer size "1.5"`},
		{"mlp:1e3,10", `layer size "1e3"`},
		{"mlp:99999999999999999999,10", `layer size "99999999999999999999"`},
		{"mlp:65536,65536,65536", "8590065664 parameters"},
	} {
		t.Run(tc.arch, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "m.safetensors")
			_, err := modelInitCLI(t, "--arch", tc.arch, "-o", path)
			if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrUsage saying %q", err, tc.want)
			}
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("refused arch left a file: %v", err)
			}
		})
	}
	// The bounds themselves are accepted, without building the model.
	sixteen := "mlp:" + strings.Repeat("2,", 15) + "2"
	for _, arch := range []string{"mlp:1,1", "mlp:65536,1", "mlp:0784,10", sixteen} {
		if _, _, err := parseArch(arch); err != nil {
			t.Errorf("parseArch(%q): %v", arch, err)
		}
	}
}

func TestModelInitRefusesBadFlags(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no output", []string{"--arch", "mlp:4,2"}, `"output" not set`},
		{"no arch", []string{"-o", filepath.Join(dir, "m")}, `"arch" not set`},
		{"empty name", []string{"--arch", "mlp:4,2", "-o", filepath.Join(dir, "m"), "--name", ""}, "--name"},
		{"control character in name", []string{"--arch", "mlp:4,2", "-o", filepath.Join(dir, "m"), "--name", "a\nb"}, "--name"},
		{"missing directory", []string{"--arch", "mlp:4,2", "-o", filepath.Join(dir, "no", "m")}, "model init:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := modelInitCLI(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("refused commands left %v", entries)
	}
}

func TestModelInitLMAndLoRA(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "lm.safetensors")
	out, err := modelInitCLI(t, "--arch", "lm:d=16,layers=2,context=8", "-o", base)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "--name gocode-init\n") {
		t.Errorf("output %q does not suggest the gocode name", out)
	}
	m, _ := readModel(t, base)
	if !train.IsLM(m) || len(m.Tensors) != 2+2*12+3 {
		t.Fatalf("%d tensors, LM %v", len(m.Tensors), train.IsLM(m))
	}
	for _, bad := range []string{"lm:d=16,layers=2", "lm:d=16,layers=2,context=8,d=4", "lm:d=16,layers=x,context=8",
		"lm:d=16,layers=2,context=8,heads=2", "lm:d=0,layers=2,context=8", "lm:"} {
		if _, err := modelInitCLI(t, "--arch", bad, "-o", filepath.Join(dir, "bad")); !errors.Is(err, ErrUsage) {
			t.Errorf("--arch %s: %v, want ErrUsage", bad, err)
		}
	}
	run := func(args ...string) (string, error) {
		cmd := newModelLoRACommand(&app{getenv: func(string) string { return "" }})
		var o bytes.Buffer
		cmd.SetOut(&o)
		cmd.SetErr(&o)
		cmd.SetArgs(args)
		err := cmd.ExecuteContext(t.Context())
		return o.String(), err
	}
	lora := filepath.Join(dir, "lora.safetensors")
	if _, err := run("add", base, "--rank", "2", "--targets", "attn.q,mlp.fc", "-o", lora); err != nil {
		t.Fatal(err)
	}
	lm, _ := readModel(t, lora)
	if got := len(train.LoRAParams(lm)); got != 2*2*2 {
		t.Fatalf("%d adapter tensors, want 8", got)
	}
	if _, err := run("add", base, "--targets", "attn.x", "-o", filepath.Join(dir, "x")); !errors.Is(err, ErrUsage) {
		t.Errorf("unknown target: %v", err)
	}
	if _, err := run("add", lora, "--targets", "attn.q", "-o", filepath.Join(dir, "y")); !errors.Is(err, ErrUsage) {
		t.Errorf("adapting twice: %v", err)
	}
	merged := filepath.Join(dir, "merged.safetensors")
	if _, err := run("merge", lora, "-o", merged); err != nil {
		t.Fatal(err)
	}
	mm, _ := readModel(t, merged)
	if len(mm.Tensors) != len(m.Tensors) || len(train.LoRAParams(mm)) != 0 {
		t.Fatalf("merged model has %d tensors", len(mm.Tensors))
	}
}
