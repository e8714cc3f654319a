package model_test

import (
	"bytes"
	"errors"
	"math"
	"testing"
	"testing/iotest"

	"github.com/fleetlearn/fleetlearn/model"
)

var sentinels = []error{
	model.ErrNilModel, model.ErrInvalidName, model.ErrDuplicateName, model.ErrInvalidShape,
	model.ErrShapeMismatch, model.ErrNonFinite, model.ErrInvalidLineage, model.ErrInvalidHeader,
	model.ErrTruncated, model.ErrTooLarge, model.ErrUnsupportedDType, model.ErrInvalidOffsets,
}

// FuzzReadSafetensors checks that decoding never panics, that every refusal
// wraps a sentinel, and that whatever decodes survives a write and a second
// decode unchanged.
func FuzzReadSafetensors(f *testing.F) {
	f.Add([]byte(goldenPyTorch))
	f.Add(stFile(`{}`))
	f.Add(stFile(`{"__metadata__":{"fleetlearn.round":"2","fleetlearn.task":"t"},"w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}`, u16le(0x3c00, 0x0001)))
	f.Add(stFile(`{"a":{"dtype":"BF16","shape":[1,0],"data_offsets":[0,0]},"b":{"dtype":"F64","shape":[],"data_offsets":[0,8]}}`, f64le(0.1)))
	f.Add(stFile(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, f32le(1, float32(math.NaN()))))
	f.Add(stFile(`{"w":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}`, f32le(1)))
	if m, err := model.New(model.Tensor{Name: `esc"\` + "\n", Shape: []int{2, 1}, Data: []float32{-1, 2}}); err == nil {
		m.Lineage = model.Lineage{Version: "v", Parent: "p", Job: "j", Source: "s", Round: -1}
		var buf bytes.Buffer
		if err := model.WriteSafetensors(&buf, m); err == nil {
			f.Add(buf.Bytes())
		}
	}

	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := model.DecodeSafetensors(b, model.WithMaxTensorBytes(1<<20))
		checkStreamingAgrees(t, b, m, err)
		if err != nil {
			for _, s := range sentinels {
				if errors.Is(err, s) {
					return
				}
			}
			t.Fatalf("error wraps no sentinel: %v", err)
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("decoded model is invalid: %v", err)
		}
		var buf bytes.Buffer
		if err := model.WriteSafetensors(&buf, m); err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		again, err := model.DecodeSafetensors(buf.Bytes())
		if err != nil {
			t.Fatalf("decode of re-encoding: %v", err)
		}
		if again.Hash() != m.Hash() || again.Lineage != m.Lineage {
			t.Fatalf("re-encoding changed the model: hash %x -> %x, lineage %+v -> %+v", m.Hash(), again.Hash(), m.Lineage, again.Lineage)
		}
		if !again.Layout().Equal(m.Layout()) {
			t.Fatal("re-encoding changed the layout")
		}
		var buf2 bytes.Buffer
		if err := model.WriteSafetensors(&buf2, again); err != nil || !bytes.Equal(buf.Bytes(), buf2.Bytes()) {
			t.Fatalf("writer is not deterministic (err %v)", err)
		}
	})
}

// checkStreamingAgrees: the streaming paths built on SafetensorsReader
// (WriteCanonical, HashSafetensors) accept exactly the files
// DecodeSafetensors accepts, fail with the same error, and give the bytes
// and hash of the decoded model.
func checkStreamingAgrees(t *testing.T, b []byte, m *model.Model, decodeErr error) {
	t.Helper()
	l := model.Lineage{Parent: "p", Source: "imported"}
	var out bytes.Buffer
	var n int64
	d, err := model.NewSafetensorsReader(bytes.NewReader(b), model.WithMaxTensorBytes(1<<20), model.WithInputSize(int64(len(b))))
	if err == nil {
		n, err = d.WriteCanonical(&out, l)
	}
	sum, hashErr := model.HashSafetensors(iotest.HalfReader(bytes.NewReader(b)), model.WithMaxTensorBytes(1<<20))
	if decodeErr != nil {
		if err == nil || err.Error() != decodeErr.Error() {
			t.Fatalf("WriteCanonical: err = %v, DecodeSafetensors: %v", err, decodeErr)
		}
		if hashErr == nil {
			t.Fatalf("HashSafetensors accepted what DecodeSafetensors refused: %v", decodeErr)
		}
		return
	}
	if err != nil || hashErr != nil {
		t.Fatalf("streaming refused what DecodeSafetensors accepted: %v, %v", err, hashErr)
	}
	if sum != m.Hash() {
		t.Fatal("HashSafetensors differs from Hash")
	}
	c := m.Clone()
	c.Lineage = l
	var want bytes.Buffer
	if err := model.WriteSafetensors(&want, c); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), want.Bytes()) || n != int64(want.Len()) {
		t.Fatalf("WriteCanonical wrote %d bytes (counted %d), WriteSafetensors %d; equal: %v", out.Len(), n, want.Len(), bytes.Equal(out.Bytes(), want.Bytes()))
	}
}
