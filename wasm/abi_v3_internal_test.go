package wasm

import (
	"bytes"
	"encoding/json"
	"testing"
)

// TestABIV3HyperBytes: the bytes sgd_hyper parses are those of the request
// document's "hyper" field, however the task spelt its JSON, so a module
// reading the document and one asking the host see the same hyper.
func TestABIV3HyperBytes(t *testing.T) {
	for _, raw := range []string{"", "{}", ` { "epochs" : 2 ,"learning_rate":0.1 } `, `{"note":"<a & b>","mu":1e-2}`,
		"{\"s\":\"\\u00e9\\t\u2028\"}", `null`, `[1, 2]`} {
		hyper, err := requestHyper(json.RawMessage(raw))
		if err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		doc, err := json.Marshal(request{ABI: 3, Kind: "train", Hyper: hyper, Seed: 9})
		if err != nil {
			t.Fatal(err)
		}
		field := append(append([]byte(`"hyper":`), hyper...), `,"seed":9,`...)
		if !bytes.Contains(doc, field) {
			t.Errorf("%q: request %s does not carry hyper bytes %s", raw, doc, hyper)
		}
		var back struct{ Hyper json.RawMessage }
		if err := json.Unmarshal(doc, &back); err != nil || !bytes.Equal(back.Hyper, hyper) {
			t.Errorf("%q: document's hyper %s, sgd_hyper parses %s (%v)", raw, back.Hyper, hyper, err)
		}
	}
	if _, err := requestHyper(json.RawMessage(`{"a":`)); err == nil {
		t.Error("requestHyper accepts broken JSON")
	}
}
