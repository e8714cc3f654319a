package edge

import (
	"bytes"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/internal/natstest"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// TestBlobIntegrity: the agent uses a model or module only if its bytes hash
// to the name it was asked for, whatever the object store holds under it; a
// model is decoded as it streams in, so the check comes after decoding and
// must still keep a substituted model from being used or cached.
func TestBlobIntegrity(t *testing.T) {
	ctx := t.Context()
	js := natstest.JetStream(t)
	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: wire.BlobBucket})
	if err != nil {
		t.Fatal(err)
	}
	safetensors := func(v float32) []byte {
		m, err := model.New(model.Tensor{Name: "w", Shape: []int{3}, Data: []float32{v, v, v}})
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := model.WriteSafetensors(&b, m); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	good, other := safetensors(1), safetensors(2)
	goodSHA := wire.SHA256(good)
	// Under the good model's name, another valid model: decodes, must not be used.
	if _, err := obs.PutBytes(ctx, goodSHA, other); err != nil {
		t.Fatal(err)
	}
	mod := wasmtest.Trivial()
	modSHA := wire.SHA256(mod)
	if _, err := obs.PutBytes(ctx, modSHA, append(bytes.Clone(mod), 0)); err != nil {
		t.Fatal(err)
	}

	d := &data.Dataset{Dim: 1, NumClasses: 2, Features: []float32{0, 1}, Labels: []uint8{0, 1}}
	a, err := New(Config{DataDir: t.TempDir(), DeviceID: "dev-1", InsecureNATS: true}, WithDataset(d))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.close)
	if _, err := a.model(ctx, js, goodSHA); err == nil || !strings.Contains(err.Error(), "content hashes to "+wire.SHA256(other)) {
		t.Fatalf("substituted model: err = %v, want a hash mismatch", err)
	}
	if _, err := a.module(ctx, js, modSHA); err == nil || !strings.Contains(err.Error(), "content hashes to") {
		t.Fatalf("altered module: err = %v, want a hash mismatch", err)
	}

	// Once the right bytes are there, both load, and the model is the one named.
	if err := obs.Delete(ctx, goodSHA); err != nil {
		t.Fatal(err)
	}
	if _, err := obs.PutBytes(ctx, goodSHA, good); err != nil {
		t.Fatal(err)
	}
	m, err := a.model(ctx, js, goodSHA)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Tensors[0].Data[0]; got != 1 {
		t.Fatalf("model value %v, want 1", got)
	}
	if _, err := obs.PutBytes(ctx, modSHA, mod); err != nil {
		t.Fatal(err)
	}
	if _, err := a.module(ctx, js, modSHA); err != nil {
		t.Fatal(err)
	}
}
