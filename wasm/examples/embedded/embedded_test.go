package embedded

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/seq"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/wasm"
)

func TestListIsSortedAndComplete(t *testing.T) {
	var names []string
	for _, m := range List() {
		names = append(names, m.Name)
		if m.Description == "" || !strings.HasPrefix(m.Package, "github.com/fleetlearn/fleetlearn/wasm/examples/") {
			t.Errorf("%s: description %q, package %q", m.Name, m.Description, m.Package)
		}
	}
	if !slices.IsSorted(names) || !slices.Contains(names, "mlp") || !slices.Contains(names, "softmax") {
		t.Errorf("names %v: want sorted, with mlp and softmax", names)
	}
	if !strings.HasPrefix(GoVersion, "go1.") {
		t.Errorf("GoVersion %q", GoVersion)
	}
}

func TestCodeMatchesRecordedDigest(t *testing.T) {
	for _, m := range List() {
		code, err := m.Code()
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(code)
		if hex.EncodeToString(sum[:]) != m.SHA256 || len(code) != m.Size || !strings.HasPrefix(string(code), "\x00asm") {
			t.Errorf("%s: %d bytes, want %d with sha256 %s", m.Name, len(code), m.Size, m.SHA256)
		}
		// The MLP is assembled without a runtime; the others are Go-built.
		if strings.HasSuffix(m.Package, "/mlpasm") {
			if m.Size > 64<<10 {
				t.Errorf("%s: %d bytes: the assembled module should be a few KB", m.Name, m.Size)
			}
		} else if m.Size < 100_000 || m.Size > 16<<20 {
			t.Errorf("%s: %d bytes: not a Go-built module?", m.Name, m.Size)
		}
	}
}

func TestLookup(t *testing.T) {
	m, err := Lookup("mlp")
	if err != nil || m.Name != "mlp" {
		t.Fatalf("Lookup(mlp) = %+v, %v", m, err)
	}
	if _, err := Lookup("resnet"); !errors.Is(err, ErrUnknown) || !strings.Contains(err.Error(), "resnet") {
		t.Errorf("Lookup(resnet): %v", err)
	}
}

func TestCodeRefusesCorruption(t *testing.T) {
	m, err := Lookup("noop")
	if err != nil {
		t.Fatal(err)
	}
	flipped := m
	flipped.SHA256 = strings.Repeat("0", 64)
	if _, err := flipped.Code(); !errors.Is(err, ErrCorrupt) {
		t.Errorf("wrong digest: %v", err)
	}
	truncated := m
	truncated.gz = m.gz[:len(m.gz)/2]
	if _, err := truncated.Code(); !errors.Is(err, ErrCorrupt) {
		t.Errorf("truncated stream: %v", err)
	}
	short := m
	short.Size--
	if _, err := short.Code(); !errors.Is(err, ErrCorrupt) {
		t.Errorf("longer than recorded: %v", err)
	}
}

// TestModulesRunInTheSandbox loads each module the way an agent does, under
// its digest, and evaluates a tiny model: the call goes through the ABI
// version handshake and the module's own evaluate.
func TestModulesRunInTheSandbox(t *testing.T) {
	if testing.Short() {
		t.Skip("compiling a Go-built module takes minutes under the race detector on a loaded machine")
	}
	ctx := context.Background()
	sb, err := wasm.New()
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(ctx)
	d := &data.Dataset{Features: []float32{0, 1, 0, 1, 1, 0, 1, 0, 0.5, 0.5, 0, 0}, Labels: []uint8{0, 1, 1}, Dim: 4, NumClasses: 2}
	archs := map[string][]int{"mlp": {4, 3, 2}, "mlp-go": {4, 3, 2}, "softmax": {4, 2}, "noop": {4, 2}, "lm": nil, "seq": {}}
	for _, m := range List() {
		arch, ok := archs[m.Name]
		if !ok {
			t.Fatalf("%s: no test model for it", m.Name)
		}
		var init *model.Model
		if arch != nil && len(arch) == 0 {
			// A 1×2×2 image through a convolution and a dense layer.
			a, err := seq.Parse("seq:input(1,2,2),conv(2,2,pad=1),relu,maxpool(2),dense(2)")
			if err != nil {
				t.Fatal(err)
			}
			if init, err = train.InitSeq(a, 1); err != nil {
				t.Fatal(err)
			}
		} else if arch == nil {
			// Windows of 4 tokens over a vocabulary of 2.
			if init, err = train.InitLM(train.LMConfig{Vocab: 2, Context: 4, Dim: 8, Layers: 1}, 1); err != nil {
				t.Fatal(err)
			}
		} else if init, err = train.InitMLP(arch, 1); err != nil {
			t.Fatal(err)
		}
		code, err := m.Code()
		if err != nil {
			t.Fatal(err)
		}
		mod, err := sb.Load(ctx, code, m.SHA256)
		if err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		call := wasm.Call{Model: init, Data: d}
		if arch == nil {
			call.Data = &data.Dataset{Features: []float32{0, 1, 0, 1, 1, 0, 1, 0, 1, 1, 0, 0}, Labels: []uint8{0, 1, 1}, Dim: 4, NumClasses: 2}
		}
		res, err := mod.Evaluate(ctx, call)
		if err != nil {
			t.Fatalf("%s: evaluate: %v", m.Name, err)
		}
		if _, ok := res.Metrics["accuracy"]; !ok {
			t.Errorf("%s: metrics %v lack accuracy", m.Name, res.Metrics)
		}
		mod.Close(ctx)
	}
}
