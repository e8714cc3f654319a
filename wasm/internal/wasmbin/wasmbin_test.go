package wasmbin

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/tetratelabs/wazero"
)

func TestLEB128(t *testing.T) {
	for _, c := range []struct {
		v    uint32
		want []byte
	}{{0, []byte{0}}, {127, []byte{0x7f}}, {128, []byte{0x80, 0x01}}, {624485, []byte{0xe5, 0x8e, 0x26}},
		{0xffffffff, []byte{0xff, 0xff, 0xff, 0xff, 0x0f}}} {
		got := AppendU32(nil, c.v)
		if !bytes.Equal(got, c.want) {
			t.Errorf("AppendU32(%d) = %x, want %x", c.v, got, c.want)
		}
		back, next, err := readU32(got, 0)
		if err != nil || back != c.v || next != len(got) {
			t.Errorf("readU32(%x) = %d, %d, %v", got, back, next, err)
		}
	}
	for _, c := range []struct {
		v    int32
		want []byte
	}{{0, []byte{0}}, {-1, []byte{0x7f}}, {63, []byte{0x3f}}, {64, []byte{0xc0, 0x00}},
		{-123456, []byte{0xc0, 0xbb, 0x78}}, {-2147483648, []byte{0x80, 0x80, 0x80, 0x80, 0x78}}} {
		if got := appendS32(nil, c.v); !bytes.Equal(got, c.want) {
			t.Errorf("appendS32(%d) = %x, want %x", c.v, got, c.want)
		}
	}
	for _, b := range [][]byte{{0x80}, {0x80, 0x80, 0x80, 0x80, 0x80, 0x01}} {
		if _, _, err := readU32(b, 0); !errors.Is(err, ErrMalformed) {
			t.Errorf("readU32(%x) error %v, want ErrMalformed", b, err)
		}
	}
}

// TestEncodeRuns checks the encoder against a real engine: the module must
// validate, declare what was asked, and compute what its code says.
func TestEncodeRuns(t *testing.T) {
	ctx := context.Background()
	m := Module{
		Types:   []FuncType{{Results: []ValType{I32}}, {Params: []ValType{I32, I32}}},
		Imports: []Import{{Module: "host", Name: "sink", Type: 1}},
		Funcs: []Func{
			{Type: 0, Locals: []ValType{I32, F64}, Body: I32Const(-300)},
			{Type: 0, Body: Code(I32Const(8), I32Const(2), Call(0), I32Const(7))},
		},
		Memory:  Pages(1),
		Exports: []Export{{"neg", ExportFunc, 1}, {"calls", ExportFunc, 2}, {"memory", ExportMemory, 0}},
		Data:    []Data{{Offset: 100, Bytes: []byte("fleetlearn")}},
	}
	bin := m.Encode()
	r := wazero.NewRuntime(ctx)
	defer r.Close(ctx)
	var sunk []uint64
	if _, err := r.NewHostModuleBuilder("host").NewFunctionBuilder().
		WithFunc(func(_ context.Context, p, n uint32) { sunk = append(sunk, uint64(p), uint64(n)) }).
		Export("sink").Instantiate(ctx); err != nil {
		t.Fatal(err)
	}
	cm, err := r.CompileModule(ctx, bin)
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	if got := len(cm.ImportedFunctions()); got != 1 {
		t.Errorf("%d imported functions, want 1", got)
	}
	inst, err := r.InstantiateModule(ctx, cm, wazero.NewModuleConfig())
	if err != nil {
		t.Fatal(err)
	}
	if res, err := inst.ExportedFunction("neg").Call(ctx); err != nil || int32(res[0]) != -300 {
		t.Errorf("neg() = %v, %v; want -300", res, err)
	}
	if res, err := inst.ExportedFunction("calls").Call(ctx); err != nil || res[0] != 7 || len(sunk) != 2 || sunk[0] != 8 || sunk[1] != 2 {
		t.Errorf("calls() = %v, %v with sink %v; want 7 and sink(8, 2)", res, err, sunk)
	}
	if got, ok := inst.Memory().Read(100, 10); !ok || string(got) != "fleetlearn" {
		t.Errorf("data segment reads %q", got)
	}

	secs, err := Sections(bin)
	if err != nil {
		t.Fatal(err)
	}
	var ids []byte
	for _, s := range secs {
		ids = append(ids, s.ID)
	}
	if want := []byte{SectionType, SectionImport, SectionFunction, SectionMemory, SectionExport, SectionCode, SectionData}; !bytes.Equal(ids, want) {
		t.Errorf("sections %v, want %v", ids, want)
	}
	bodies, err := FuncBodies(bin)
	if err != nil || len(bodies) != 2 {
		t.Fatalf("FuncBodies = %v, %v", bodies, err)
	}
	// The first body declares two locals, each as (count, type): 1+2+2 bytes before code.
	if b := bodies[0]; b.Code-b.Start != 5 || !bytes.Equal(bin[b.Code:b.End], append(I32Const(-300), OpEnd)) {
		t.Errorf("first body %+v holds %x", b, bin[b.Start:b.End])
	}
}

func TestWalkRefusesMalformed(t *testing.T) {
	good := Module{Types: []FuncType{{}}, Funcs: []Func{{}}}.Encode()
	for name, b := range map[string][]byte{
		"empty":           nil,
		"bad magic":       append([]byte("\x00wsm"), good[4:]...),
		"truncated":       good[:len(good)-2],
		"no code":         Module{}.Encode(),
		"long section":    append(append([]byte{}, good[:8]...), 1, 0xff, 0x01),
		"endless LEB":     append(append([]byte{}, good[:8]...), 1, 0x80),
		"body too long":   append(append([]byte{}, good[:8]...), SectionCode, 4, 1, 5, 0, OpEnd),
		"locals too long": append(append([]byte{}, good[:8]...), SectionCode, 5, 1, 3, 2, 1, byte(I32)),
	} {
		if _, err := FuncBodies(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: FuncBodies error %v, want ErrMalformed", name, err)
		}
	}
}

// TestImportsRoundTrip: Imports reads back what Encode wrote, and refuses a
// section cut short.
func TestImportsRoundTrip(t *testing.T) {
	want := []Import{{Module: "fleetlearn_v2", Name: "gelu", Type: 1}, {Module: "env", Name: "memory", Memory: true},
		{Module: "wasi_snapshot_preview1", Name: "fd_write", Type: 0}}
	m := Module{Types: []FuncType{{}, {Params: []ValType{I32, I32}}}, Imports: want}
	b := m.Encode()
	got, err := Imports(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("Imports = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("import %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if none, err := Imports(Module{}.Encode()); err != nil || len(none) != 0 {
		t.Errorf("module without imports: %v, %v", none, err)
	}
	secs, err := Sections(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secs {
		if s.ID == SectionImport {
			cut := append([]byte(nil), b[:s.End-1]...)
			cut[s.Start-1]-- // the section's size byte, so the section still ends the module
			if _, err := Imports(cut); !errors.Is(err, ErrMalformed) {
				t.Errorf("cut import section: %v, want ErrMalformed", err)
			}
		}
	}
}

func TestF32Const(t *testing.T) {
	if got := F32Const(1); !bytes.Equal(got, []byte{0x43, 0, 0, 0x80, 0x3f}) {
		t.Errorf("F32Const(1) = %x", got)
	}
}

func TestF64Const(t *testing.T) {
	if got := F64Const(1); !bytes.Equal(got, []byte{0x44, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f}) {
		t.Errorf("F64Const(1) = %x", got)
	}
	if got := F64Const(-2.5); !bytes.Equal(got, []byte{0x44, 0, 0, 0, 0, 0, 0, 0x04, 0xc0}) {
		t.Errorf("F64Const(-2.5) = %x", got)
	}
}
