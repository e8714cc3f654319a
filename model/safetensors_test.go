package model_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/fleetlearn/fleetlearn/model"
)

// stFile assembles a safetensors file: length prefix, header as given (no
// padding added), data.
func stFile(header string, data ...[]byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	for _, d := range data {
		b = append(b, d...)
	}
	return b
}

func f32le(v ...float32) []byte {
	var b []byte
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

func u16le(v ...uint16) []byte {
	var b []byte
	for _, x := range v {
		b = binary.LittleEndian.AppendUint16(b, x)
	}
	return b
}

func f64le(v ...float64) []byte {
	var b []byte
	for _, x := range v {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
	}
	return b
}

// goldenPyTorch is laid out the way PyTorch's safetensors writer (the Rust
// core) lays out a state dict: tensors sorted by dtype, widest first, then by
// name; header keys in buffer order after "__metadata__"; header padded with
// spaces to a multiple of 8 bytes (272 = 0x110).
const goldenPyTorch = "\x10\x01\x00\x00\x00\x00\x00\x00" +
	`{"__metadata__":{"format":"pt"},` +
	`"scale":{"dtype":"F64","shape":[],"data_offsets":[0,8]},` +
	`"fc.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[8,24]},` +
	`"fc.bias":{"dtype":"BF16","shape":[2],"data_offsets":[24,28]},` +
	`"emb":{"dtype":"F16","shape":[3],"data_offsets":[28,34]}} ` +
	"\x00\x00\x00\x00\x00\x00\xd0\x3f" + // scale: F64 0.25
	"\x00\x00\x80\x3f\x00\x00\x00\xc0\x00\x00\x00\x3f\x00\x00\x40\x40" + // fc.weight: F32 1, -2, 0.5, 3
	"\x49\x40\x00\x80" + // fc.bias: BF16 3.140625, -0
	"\x00\x3c\x01\x00\xff\xfb" // emb: F16 1, 2^-24 (subnormal), -65504

func TestDecodeGoldenPyTorch(t *testing.T) {
	m, err := model.DecodeSafetensors([]byte(goldenPyTorch))
	if err != nil {
		t.Fatal(err)
	}
	want := &model.Model{Tensors: []model.Tensor{
		{Name: "scale", Shape: []int{}, Data: []float32{0.25}},
		{Name: "fc.weight", Shape: []int{2, 2}, Data: []float32{1, -2, 0.5, 3}},
		{Name: "fc.bias", Shape: []int{2}, Data: []float32{3.140625, float32(math.Copysign(0, -1))}},
		{Name: "emb", Shape: []int{3}, Data: []float32{1, float32(math.Ldexp(1, -24)), -65504}},
	}}
	if d := sameModel(m, want); d != "" {
		t.Errorf("decoded golden: %s\ngot %+v", d, m.Tensors)
	}
	if m.Lineage != (model.Lineage{}) {
		t.Errorf("lineage = %+v, want none (only format=pt metadata)", m.Lineage)
	}
	if err := m.Validate(); err != nil {
		t.Error(err)
	}
	// The stream reader must agree with the in-memory decoder.
	s, err := model.ReadSafetensors(iotest.OneByteReader(strings.NewReader(goldenPyTorch)))
	if err != nil {
		t.Fatal(err)
	}
	if d := sameModel(s, m); d != "" {
		t.Errorf("ReadSafetensors differs from DecodeSafetensors: %s", d)
	}
}

func TestWriteSafetensorsExact(t *testing.T) {
	m, err := model.New(
		model.Tensor{Name: "w", Shape: []int{2, 2}, Data: []float32{1, 2, 3, 4}},
		model.Tensor{Name: "b", Shape: []int{2}, Data: []float32{-1, 0.5}},
	)
	if err != nil {
		t.Fatal(err)
	}
	m.Lineage = model.Lineage{Version: "v2", Parent: "v1", Task: "t", Round: 2, Source: "unit"}
	var buf bytes.Buffer
	if err := model.WriteSafetensors(&buf, m); err != nil {
		t.Fatal(err)
	}
	const header = `{"__metadata__":{"fleetlearn.version":"v2","fleetlearn.parent":"v1","fleetlearn.task":"t",` +
		`"fleetlearn.round":"2","fleetlearn.source":"unit"},` +
		`"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},` +
		`"b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}}`
	padded := header + strings.Repeat(" ", (8-len(header)%8)%8)
	want := stFile(padded, f32le(1, 2, 3, 4, -1, 0.5))
	if !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("WriteSafetensors =\n%q\nwant\n%q", buf.Bytes(), want)
	}
}

func TestWriteSafetensorsEmptyLineage(t *testing.T) {
	m, err := model.New(model.Tensor{Name: "s", Data: []float32{1}})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := model.WriteSafetensors(&buf, m); err != nil {
		t.Fatal(err)
	}
	const header = `{"__metadata__":{},"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}`
	want := stFile(header+strings.Repeat(" ", (8-len(header)%8)%8), f32le(1))
	if !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("WriteSafetensors =\n%q\nwant\n%q", buf.Bytes(), want)
	}
}

func TestSafetensorsRoundTrip(t *testing.T) {
	big := make([]float32, 70000) // spans several write and read chunks
	for i := range big {
		big[i] = float32(i%1000)/7 - 50
	}
	for _, tc := range []struct {
		name    string
		tensors []model.Tensor
		lineage model.Lineage
	}{
		{name: "empty model"},
		{name: "empty model with lineage", lineage: model.Lineage{Version: "v", Source: "s"}},
		{
			name: "mlp",
			tensors: []model.Tensor{
				{Name: "fc1.weight", Shape: []int{3, 2}, Data: []float32{1, -2, 3.5, 1e-30, -0, 6}},
				{Name: "fc1.bias", Shape: []int{3}, Data: []float32{0.1, 0.2, 0.3}},
			},
			lineage: model.Lineage{Version: "task-9/4", Parent: "task-9/3", Task: "task-9", Round: 4},
		},
		{
			name: "scalars, zero-size and large",
			tensors: []model.Tensor{
				{Name: "z0", Shape: []int{0}},
				{Name: "s", Shape: []int{}, Data: []float32{math.MaxFloat32}},
				{Name: "big", Shape: []int{70, 1000}, Data: big},
				{Name: "z1", Shape: []int{5, 0, 2}},
				{Name: "tiny", Shape: []int{1}, Data: []float32{math.SmallestNonzeroFloat32}},
			},
			lineage: model.Lineage{Job: "pretrain-1", Source: "pytorch import", Round: -3},
		},
		{
			name: "names and lineage needing escapes",
			tensors: []model.Tensor{
				{Name: `quote"back\slash`, Shape: []int{1}, Data: []float32{1}},
				{Name: "ctl\x01\x1f\t\n\r", Shape: []int{1}, Data: []float32{2}},
				{Name: "ünïcödé €\u2028", Shape: []int{1}, Data: []float32{3}},
				{Name: "<html>&", Shape: []int{1}, Data: []float32{4}},
			},
			lineage: model.Lineage{Version: "a\"b", Parent: "\\", Task: "\x00", Source: "line1\nline2 ✓"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := model.New(tc.tensors...)
			if err != nil {
				t.Fatal(err)
			}
			m.Lineage = tc.lineage
			var buf bytes.Buffer
			if err := model.WriteSafetensors(&buf, m); err != nil {
				t.Fatal(err)
			}
			file := buf.Bytes()
			n := binary.LittleEndian.Uint64(file)
			if n%8 != 0 {
				t.Errorf("header length %d is not a multiple of 8", n)
			}
			// An independent JSON parser must read the header and find every tensor.
			var hdr map[string]json.RawMessage
			if err := json.Unmarshal(file[8:8+n], &hdr); err != nil {
				t.Fatalf("header is not JSON: %v", err)
			}
			if _, ok := hdr["__metadata__"]; !ok || len(hdr) != len(tc.tensors)+1 {
				t.Errorf("header has keys %d, want __metadata__ and %d tensors", len(hdr), len(tc.tensors))
			}
			for _, tt := range tc.tensors {
				if _, ok := hdr[tt.Name]; !ok {
					t.Errorf("header lacks tensor %q", tt.Name)
				}
			}

			got, err := model.DecodeSafetensors(file)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if d := sameModel(got, m); d != "" {
				t.Errorf("round trip: %s", d)
			}
			if got.Hash() != m.Hash() {
				t.Error("round trip changed the hash")
			}
			var again bytes.Buffer
			if err := model.WriteSafetensors(&again, got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again.Bytes(), file) {
				t.Error("re-encoding is not byte-identical")
			}
			streamed, err := model.ReadSafetensors(iotest.HalfReader(bytes.NewReader(file)))
			if err != nil {
				t.Fatalf("ReadSafetensors: %v", err)
			}
			if d := sameModel(streamed, m); d != "" {
				t.Errorf("streamed round trip: %s", d)
			}
		})
	}
}

func TestDecodeDTypes(t *testing.T) {
	negZero := float32(math.Copysign(0, -1))
	for _, tc := range []struct {
		name  string
		dtype string
		shape string
		data  []byte
		want  []float32 // compared bit for bit
	}{
		{"F32", "F32", "[3]", f32le(1.5, negZero, math.SmallestNonzeroFloat32), []float32{1.5, negZero, math.SmallestNonzeroFloat32}},
		{"F16 normals", "F16", "[4]", u16le(0x3c00, 0xc000, 0x7bff, 0x0400),
			[]float32{1, -2, 65504, float32(math.Ldexp(1, -14))}},
		{"F16 subnormals and zeros", "F16", "[5]", u16le(0x0001, 0x03ff, 0x8001, 0x0000, 0x8000),
			[]float32{float32(math.Ldexp(1, -24)), float32(math.Ldexp(1023, -24)), float32(-math.Ldexp(1, -24)), 0, negZero}},
		{"BF16", "BF16", "[2,2]", u16le(0x3f80, 0xc049, 0x0001, 0x7f7f),
			[]float32{1, -3.140625, float32(math.Ldexp(1, -133)), float32(math.Ldexp(255, 120))}},
		{"F64 exact", "F64", "[3]", f64le(0.25, -1e10, 0), []float32{0.25, -1e10, 0}},
		{"F64 rounded", "F64", "[2]", f64le(0.1, 1e-50), []float32{0.1, 0}},
		{"F64 just below float32 overflow", "F64", "[1]", f64le(math.MaxFloat32), []float32{math.MaxFloat32}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			header := `{"x":{"dtype":"` + tc.dtype + `","shape":` + tc.shape + `,"data_offsets":[0,` + itoa(len(tc.data)) + `]}}`
			m, err := model.DecodeSafetensors(stFile(header, tc.data))
			if err != nil {
				t.Fatal(err)
			}
			got := m.Tensors[0].Data
			if len(got) != len(tc.want) {
				t.Fatalf("got %d values, want %d", len(got), len(tc.want))
			}
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(tc.want[i]) {
					t.Errorf("value %d = %v (%#08x), want %v (%#08x)", i, got[i], math.Float32bits(got[i]), tc.want[i], math.Float32bits(tc.want[i]))
				}
			}
		})
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// TestDecodeAccepts covers valid files our writer never produces.
func TestDecodeAccepts(t *testing.T) {
	for _, tc := range []struct {
		name    string
		file    []byte
		names   []string // expected tensor order
		lineage model.Lineage
	}{
		{name: "empty header", file: stFile(`{}`)},
		{name: "padded empty header", file: stFile(`{}      `)},
		{name: "null metadata", file: stFile(`{"__metadata__":null}`)},
		{
			name:  "keys out of buffer order",
			file:  stFile(`{"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, f32le(1, 2)),
			names: []string{"a", "b"},
		},
		{
			name: "metadata last, whitespace, unknown keys ignored",
			file: stFile("{\n  \"w\": {\"shape\": [1], \"data_offsets\": [0, 4], \"dtype\": \"F32\"},\n"+
				`  "__metadata__": {"format": "pt", "fleetlearn.task": "t1", "fleetlearn.round": "7", "fleetlearn.other": "x"}`+"\n}\n", f32le(1)),
			names:   []string{"w"},
			lineage: model.Lineage{Task: "t1", Round: 7},
		},
		{
			name:  "empty tensors share offsets, ordered by name",
			file:  stFile(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"e2":{"dtype":"F16","shape":[0],"data_offsets":[0,0]},"e1":{"dtype":"BF16","shape":[2,0],"data_offsets":[0,0]},"e3":{"dtype":"F64","shape":[0],"data_offsets":[4,4]}}`, f32le(1)),
			names: []string{"e1", "e2", "w", "e3"},
		},
		{
			name:  "escaped name",
			file:  stFile(`{"a\u00e9\"\n":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, f32le(1)),
			names: []string{"aé\"\n"},
		},
		{
			name:  "partial product zero",
			file:  stFile(`{"z":{"dtype":"F32","shape":[0,9223372036854775807],"data_offsets":[0,0]}}`),
			names: []string{"z"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := model.DecodeSafetensors(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, tt := range m.Tensors {
				names = append(names, tt.Name)
			}
			if strings.Join(names, ",") != strings.Join(tc.names, ",") {
				t.Errorf("tensors %q, want %q", names, tc.names)
			}
			if m.Lineage != tc.lineage {
				t.Errorf("lineage %+v, want %+v", m.Lineage, tc.lineage)
			}
			if err := m.Validate(); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestDecodeMalformed(t *testing.T) {
	w := func(offsets string) string {
		return `{"w":{"dtype":"F32","shape":[1],"data_offsets":` + offsets + `}}`
	}
	one := f32le(1)
	for _, tc := range []struct {
		name string
		file []byte
		opts []model.ReadOption
		want error
	}{
		// Framing.
		{"empty input", nil, nil, model.ErrTruncated},
		{"short length", []byte{2, 0, 0}, nil, model.ErrTruncated},
		{"header longer than input", stFile(`{}`)[:9], nil, model.ErrTruncated},
		{"header length over default cap", binary.LittleEndian.AppendUint64(nil, 100<<20+1), nil, model.ErrTooLarge},
		{"header length near 2^64", binary.LittleEndian.AppendUint64(nil, math.MaxUint64), nil, model.ErrTooLarge},
		{"header over custom cap", stFile(`{"__metadata__":{}}`), []model.ReadOption{model.WithMaxHeaderBytes(8)}, model.ErrTooLarge},
		{"zero header length", stFile(``), nil, model.ErrInvalidHeader},
		{"one-byte header", stFile(`{`), nil, model.ErrInvalidHeader},

		// Header syntax.
		{"leading space", stFile(` {}`), nil, model.ErrInvalidHeader},
		{"array header", stFile(`[]`), nil, model.ErrInvalidHeader},
		{"unterminated", stFile(`{"w":`), nil, model.ErrInvalidHeader},
		{"not UTF-8", stFile("{\"\xff\":1}"), nil, model.ErrInvalidHeader},
		{"garbage after object", stFile(`{} x`), nil, model.ErrInvalidHeader},
		{"second object", stFile(`{}{}`), nil, model.ErrInvalidHeader},
		{"NUL padding", stFile("{}\x00\x00"), nil, model.ErrInvalidHeader},
		{"missing comma", stFile(`{"__metadata__":{} "w":{}}`), nil, model.ErrInvalidHeader},
		{"tensor not an object", stFile(`{"w":1}`), nil, model.ErrInvalidHeader},
		{"tensor null", stFile(`{"w":null}`), nil, model.ErrInvalidHeader},
		{"missing dtype", stFile(`{"w":{"shape":[1],"data_offsets":[0,4]}}`, one), nil, model.ErrInvalidHeader},
		{"missing shape", stFile(`{"w":{"dtype":"F32","data_offsets":[0,4]}}`, one), nil, model.ErrInvalidHeader},
		{"missing offsets", stFile(`{"w":{"dtype":"F32","shape":[1]}}`, one), nil, model.ErrInvalidHeader},
		{"unknown field", stFile(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}}`, one), nil, model.ErrInvalidHeader},
		{"duplicate field", stFile(`{"w":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, one), nil, model.ErrInvalidHeader},
		{"dtype not a string", stFile(`{"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}}`, one), nil, model.ErrInvalidHeader},

		// Names.
		{"duplicate tensor", stFile(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32le(1, 2)), nil, model.ErrDuplicateName},
		{"duplicate after unescaping", stFile(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"\u0077":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32le(1, 2)), nil, model.ErrDuplicateName},
		{"empty name", stFile(`{"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, one), nil, model.ErrInvalidName},

		// Metadata.
		{"duplicate metadata", stFile(`{"__metadata__":{},"__metadata__":{}}`), nil, model.ErrInvalidHeader},
		{"metadata array", stFile(`{"__metadata__":["a"]}`), nil, model.ErrInvalidHeader},
		{"metadata string", stFile(`{"__metadata__":"a"}`), nil, model.ErrInvalidHeader},
		{"metadata number value", stFile(`{"__metadata__":{"fleetlearn.round":3}}`), nil, model.ErrInvalidHeader},
		{"metadata duplicate key", stFile(`{"__metadata__":{"a":"1","a":"2"}}`), nil, model.ErrInvalidHeader},
		{"bad round", stFile(`{"__metadata__":{"fleetlearn.round":"three"}}`), nil, model.ErrInvalidLineage},
		{"round overflows", stFile(`{"__metadata__":{"fleetlearn.round":"9223372036854775808"}}`), nil, model.ErrInvalidLineage},

		// Dtypes.
		{"I32", stFile(`{"w":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}`, one), nil, model.ErrUnsupportedDType},
		{"I64", stFile(`{"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}`, f64le(1)), nil, model.ErrUnsupportedDType},
		{"U8", stFile(`{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, []byte{1}), nil, model.ErrUnsupportedDType},
		{"BOOL", stFile(`{"w":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}}`, []byte{1}), nil, model.ErrUnsupportedDType},
		{"F8_E4M3", stFile(`{"w":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}}`, []byte{1}), nil, model.ErrUnsupportedDType},
		{"lowercase f32", stFile(`{"w":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}}`, one), nil, model.ErrUnsupportedDType},

		// Shapes.
		{"negative dimension", stFile(`{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, one), nil, model.ErrInvalidShape},
		{"fractional dimension", stFile(`{"w":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}}`, one), nil, model.ErrInvalidShape},
		{"exponent dimension", stFile(`{"w":{"dtype":"F32","shape":[1e0],"data_offsets":[0,4]}}`, one), nil, model.ErrInvalidShape},
		{"string dimension", stFile(`{"w":{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}}`, one), nil, model.ErrInvalidShape},
		{"shape not an array", stFile(`{"w":{"dtype":"F32","shape":1,"data_offsets":[0,4]}}`, one), nil, model.ErrInvalidShape},
		{"dimension beyond uint64", stFile(`{"w":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,4]}}`, one), nil, model.ErrTooLarge},
		{"dimension beyond int", stFile(`{"w":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,4]}}`, one), nil, model.ErrTooLarge},
		{"shape product overflows", stFile(`{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}`, one), nil, model.ErrTooLarge},
		{"byte size overflows", stFile(`{"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}}`, f64le(1)), nil, model.ErrTooLarge},
		{"shape larger than bytes", stFile(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, one), nil, model.ErrShapeMismatch},
		{"shape smaller than bytes", stFile(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}}`, f32le(1, 2)), nil, model.ErrShapeMismatch},
		{"bytes not a multiple of dtype", stFile(`{"w":{"dtype":"F16","shape":[1],"data_offsets":[0,3]}}`, []byte{0, 0x3c, 0}), nil, model.ErrShapeMismatch},

		// Offsets.
		{"one offset", stFile(w(`[4]`), one), nil, model.ErrInvalidOffsets},
		{"three offsets", stFile(w(`[0,4,8]`), one), nil, model.ErrInvalidOffsets},
		{"negative offset", stFile(w(`[-4,0]`), one), nil, model.ErrInvalidOffsets},
		{"offsets not an array", stFile(`{"w":{"dtype":"F32","shape":[1],"data_offsets":{}}}`, one), nil, model.ErrInvalidOffsets},
		{"reversed offsets", stFile(w(`[4,0]`), one), nil, model.ErrInvalidOffsets},
		{"hole at start", stFile(w(`[4,8]`), f32le(0, 1)), nil, model.ErrInvalidOffsets},
		{"hole between", stFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`, f32le(1, 2, 3)), nil, model.ErrInvalidOffsets},
		{"overlap", stFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, f32le(1, 2, 3)), nil, model.ErrInvalidOffsets},
		{"same range twice", stFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, one), nil, model.ErrInvalidOffsets},
		{"trailing bytes", stFile(w(`[0,4]`), f32le(1, 2)), nil, model.ErrInvalidOffsets},
		{"trailing bytes, empty header", stFile(`{}`, []byte{0}), nil, model.ErrInvalidOffsets},
		{"buffer too short", stFile(w(`[0,4]`), []byte{0, 0}), nil, model.ErrTruncated},
		{"buffer missing", stFile(w(`[0,4]`)), nil, model.ErrTruncated},
		{"offset beyond uint64", stFile(w(`[0,18446744073709551620]`), one), nil, model.ErrTooLarge},
		{"buffer over default cap", stFile(`{"w":{"dtype":"F32","shape":[1073741825],"data_offsets":[0,4294967300]}}`), nil, model.ErrTooLarge},
		{"buffer over custom cap", stFile(w(`[0,4]`), one), []model.ReadOption{model.WithMaxTensorBytes(3)}, model.ErrTooLarge},

		// Values.
		{"F32 NaN", stFile(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, f32le(1, float32(math.NaN()))), nil, model.ErrNonFinite},
		{"F32 -Inf", stFile(w(`[0,4]`), f32le(float32(math.Inf(-1)))), nil, model.ErrNonFinite},
		{"F16 +Inf", stFile(`{"w":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}}`, u16le(0x7c00)), nil, model.ErrNonFinite},
		{"F16 NaN", stFile(`{"w":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}}`, u16le(0x7e00)), nil, model.ErrNonFinite},
		{"BF16 -Inf", stFile(`{"w":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}`, u16le(0xff80)), nil, model.ErrNonFinite},
		{"BF16 NaN", stFile(`{"w":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}`, u16le(0x7fc1)), nil, model.ErrNonFinite},
		{"F64 NaN", stFile(`{"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}`, f64le(math.NaN())), nil, model.ErrNonFinite},
		{"F64 overflows float32", stFile(`{"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}`, f64le(1e39)), nil, model.ErrNonFinite},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := model.DecodeSafetensors(tc.file, tc.opts...)
			if !errors.Is(err, tc.want) {
				t.Fatalf("DecodeSafetensors: err = %v, want %v", err, tc.want)
			}
			if m != nil {
				t.Error("DecodeSafetensors returned a model with an error")
			}
			// The stream reader must refuse the same input for the same reason.
			if _, err := model.ReadSafetensors(bytes.NewReader(tc.file), tc.opts...); !errors.Is(err, tc.want) {
				t.Errorf("ReadSafetensors: err = %v, want %v", err, tc.want)
			}
		})
	}
}

// TestReadSafetensorsInputSize: a declared input size that disagrees with the
// header is refused before any tensor is read; the right one reads as usual.
func TestReadSafetensorsInputSize(t *testing.T) {
	file := stFile(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, f32le(1, 2))
	n := int64(len(file))
	for _, tc := range []struct {
		name string
		size int64
		want error
	}{
		{"exact", n, nil},
		{"unknown", -1, nil},
		{"one byte short", n - 1, model.ErrTruncated},
		{"shorter than the header", 9, model.ErrTruncated},
		{"one byte long", n + 1, model.ErrInvalidOffsets},
	} {
		m, err := model.ReadSafetensors(bytes.NewReader(file), model.WithInputSize(tc.size))
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
			continue
		}
		if err == nil && (len(m.Tensors) != 1 || m.Tensors[0].Data[1] != 2) {
			t.Errorf("%s: read %+v", tc.name, m.Tensors)
		}
	}
}

func TestReadSafetensorsErrorMessages(t *testing.T) {
	for _, tc := range []struct {
		name string
		file []byte
		msg  string
	}{
		{"non-finite names tensor and element", stFile(`{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}}`, f32le(1, 2, float32(math.Inf(1)))), `tensor "w": element 2`},
		{"dtype names tensor", stFile(`{"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}`, f64le(1)), `tensor "ids": dtype I64`},
	} {
		_, err := model.DecodeSafetensors(tc.file)
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: err = %v, want it to mention %q", tc.name, err, tc.msg)
		}
	}
}

func TestReadSafetensorsStream(t *testing.T) {
	// Larger than the up-front allocation made for readers of unknown length.
	const n = 1<<20 + 3
	m, err := model.New(model.Tensor{Name: "big", Shape: []int{n}, Data: make([]float32, n)})
	if err != nil {
		t.Fatal(err)
	}
	m.Tensors[0].Data[n-1] = 7
	var buf bytes.Buffer
	if err := model.WriteSafetensors(&buf, m); err != nil {
		t.Fatal(err)
	}
	file := buf.Bytes()
	got, err := model.ReadSafetensors(iotest.HalfReader(bytes.NewReader(file)))
	if err != nil {
		t.Fatal(err)
	}
	if got.Hash() != m.Hash() {
		t.Error("streamed read differs")
	}

	if _, err := model.ReadSafetensors(io.MultiReader(bytes.NewReader(file), strings.NewReader("x"))); !errors.Is(err, model.ErrInvalidOffsets) {
		t.Errorf("trailing byte: err = %v, want ErrInvalidOffsets", err)
	}
	if _, err := model.ReadSafetensors(bytes.NewReader(file[:len(file)-1])); !errors.Is(err, model.ErrTruncated) {
		t.Errorf("truncated: err = %v, want ErrTruncated", err)
	}
	// I/O errors other than EOF pass through.
	boom := errors.New("boom")
	for _, cut := range []int{4, 20, len(file) / 2} {
		r := io.MultiReader(bytes.NewReader(file[:cut]), iotest.ErrReader(boom))
		if _, err := model.ReadSafetensors(r); !errors.Is(err, boom) {
			t.Errorf("error after %d bytes: err = %v, want boom", cut, err)
		}
	}
}

type failWriter struct{ after int }

func (w *failWriter) Write(p []byte) (int, error) {
	if w.after <= 0 {
		return 0, errors.New("disk full")
	}
	w.after--
	return len(p), nil
}

func TestWriteSafetensorsErrors(t *testing.T) {
	var buf bytes.Buffer
	if err := model.WriteSafetensors(&buf, nil); !errors.Is(err, model.ErrNilModel) {
		t.Errorf("nil model: %v", err)
	}
	bad := &model.Model{Tensors: []model.Tensor{{Name: "w", Shape: []int{1}, Data: []float32{float32(math.NaN())}}}}
	if err := model.WriteSafetensors(&buf, bad); !errors.Is(err, model.ErrNonFinite) {
		t.Errorf("NaN model: %v", err)
	}
	lin := &model.Model{Lineage: model.Lineage{Source: "\xff"}}
	if err := model.WriteSafetensors(&buf, lin); !errors.Is(err, model.ErrInvalidLineage) {
		t.Errorf("non-UTF-8 lineage: %v", err)
	}
	if buf.Len() != 0 {
		t.Errorf("invalid models wrote %d bytes", buf.Len())
	}
	m, err := model.New(model.Tensor{Name: "w", Shape: []int{40000}, Data: make([]float32, 40000)})
	if err != nil {
		t.Fatal(err)
	}
	// Count the writes, then fail each one in turn.
	counter := &failWriter{after: math.MaxInt}
	if err := model.WriteSafetensors(counter, m); err != nil {
		t.Fatal(err)
	}
	writes := math.MaxInt - counter.after
	if writes < 3 {
		t.Fatalf("160 kB written in %d writes, want the data chunked", writes)
	}
	for after := range writes {
		err := model.WriteSafetensors(&failWriter{after: after}, m)
		if err == nil || !strings.Contains(err.Error(), "disk full") {
			t.Errorf("writer failing after %d writes: err = %v", after, err)
		}
	}
}
