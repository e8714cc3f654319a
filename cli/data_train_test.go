package cli

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/examples/embedded"
)

// TestDataCSVAndImagesTrainOnEdge: the datasets data csv and data images
// write are ones fleetlearn-edge trains on. Each device dataset is read as
// the agent reads --dataset (data.ReadDir, then Validate) and trained on by
// the demo's update module, loaded into the sandbox under its digest as the
// agent loads a task's module, with an MLP whose input is the features.
func TestDataCSVAndImagesTrainOnEdge(t *testing.T) {
	csvOut := filepath.Join(t.TempDir(), "csv")
	src := writeTestFile(t, filepath.Join(t.TempDir(), "people.csv"), peopleCSV(120))
	if r := execute(t, newDataCSVCommand(&app{}), src, "--label", "outcome", "--key", "user", "--devices", "2", "--out", csvOut); r.err != nil {
		t.Fatal(r.err)
	}
	imgOut := filepath.Join(t.TempDir(), "images")
	if r := execute(t, newDataImagesCommand(&app{}), imageTree(t, 12), "--size", "6x5", "--devices", "2", "--alpha", "0", "--out", imgOut); r.err != nil {
		t.Fatal(r.err)
	}

	ctx := t.Context()
	sb, err := wasm.New()
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(ctx)
	m, err := embedded.Lookup("mlp")
	if err != nil {
		t.Fatal(err)
	}
	code, err := m.Code()
	if err != nil {
		t.Fatal(err)
	}
	mod, err := sb.Load(ctx, code, m.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	defer mod.Close(ctx)
	hyper := json.RawMessage(`{"learning_rate":0.05,"batch_size":8,"epochs":2}`)

	for _, tc := range []struct {
		dir          string
		dim, classes int
	}{{csvOut, 2, 3}, {imgOut, 3 * 6 * 5, 3}} {
		for k := range 2 {
			dir := filepath.Join(tc.dir, fmt.Sprintf("device-%d", k))
			d, err := data.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Validate(); err != nil {
				t.Fatal(err)
			}
			if d.Dim != tc.dim || d.NumClasses != tc.classes {
				t.Fatalf("%s: dim %d, %d classes", dir, d.Dim, d.NumClasses)
			}
			init, err := train.InitMLP([]int{d.Dim, 8, d.NumClasses}, 1)
			if err != nil {
				t.Fatal(err)
			}
			res, err := mod.Train(ctx, wasm.Call{Model: init, Data: d, Hyper: hyper, Seed: 1})
			if err != nil {
				t.Fatalf("%s: train: %v", dir, err)
			}
			if res.Model == nil || res.NumExamples != d.Len() {
				t.Fatalf("%s: trained on %d of %d examples", dir, res.NumExamples, d.Len())
			}
			if res.Model.Hash() == init.Hash() {
				t.Errorf("%s: training left the model unchanged", dir)
			}
		}
	}
}
