package wasm

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"

	"github.com/fleetlearn/fleetlearn/wasm/examples/embedded"
	"github.com/fleetlearn/fleetlearn/wasm/internal/wasmbin"
)

// initialMemory instantiates code in rt without running any of its
// functions and returns its memory as the data segments left it, or the
// instantiation's error.
func initialMemory(t testing.TB, rt wazero.Runtime, code []byte) ([]byte, error) {
	t.Helper()
	ctx := context.Background()
	cm, err := rt.CompileModule(ctx, code)
	if err != nil {
		return nil, err
	}
	defer cm.Close(ctx)
	mod, err := rt.InstantiateModule(ctx, cm, wazero.NewModuleConfig().WithName("").WithStartFunctions())
	if err != nil {
		return nil, err
	}
	defer mod.Close(ctx)
	mem, ok := mod.Memory().Read(0, mod.Memory().Size())
	if !ok {
		t.Fatal("memory unreadable")
	}
	return bytes.Clone(mem), nil
}

func dataSegmentCount(t testing.TB, code []byte) int {
	t.Helper()
	secs, err := wasmbin.Sections(code)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secs {
		if s.ID == wasmbin.SectionData {
			segs, ok := parseDataSegments(code[s.Start:s.End])
			if !ok {
				t.Fatal("data section not parsed")
			}
			return len(segs)
		}
	}
	return 0
}

// TestMergeDataSegmentsExamples: every shipped Go-built example module's
// tens of thousands of data segments become a handful (the assembled MLP's
// one stays one), and the memory a fresh instance starts with is the same
// byte for byte.
func TestMergeDataSegmentsExamples(t *testing.T) {
	s, err := New(WithEngine(EngineInterpreter))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	for _, m := range embedded.List() {
		t.Run(m.Name, func(t *testing.T) {
			code, err := m.Code()
			if err != nil {
				t.Fatal(err)
			}
			merged := mergeDataSegments(code)
			before, after := dataSegmentCount(t, code), dataSegmentCount(t, merged)
			t.Logf("%d data segments become %d; %d bytes become %d", before, after, len(code), len(merged))
			switch assembled := strings.HasSuffix(m.Package, "/mlpasm"); {
			case assembled && (before != 1 || after != 1):
				t.Errorf("the assembled module's %d data segments became %d, want its one left alone", before, after)
			case !assembled && (before < 1000 || after > 16):
				t.Errorf("%d data segments became %d, want a few thousand to at most 16", before, after)
			}
			want, err := initialMemory(t, s.rt, code)
			if err != nil {
				t.Fatal(err)
			}
			got, err := initialMemory(t, s.rt, merged)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("initial memory differs after merging (%d vs %d bytes)", len(got), len(want))
			}
		})
	}
}

func dataModule(pages uint32, segs ...wasmbin.Data) []byte {
	return wasmbin.Module{Memory: wasmbin.Pages(pages), Data: segs,
		Exports: []wasmbin.Export{{Name: "memory", Kind: wasmbin.ExportMemory}}}.Encode()
}

// TestMergeDataSegments: segments close together merge, far apart ones
// stay apart, and what the rewrite cannot prove safe (overlap, passive
// segments, a data count section, malformed bytes) is left unchanged.
func TestMergeDataSegments(t *testing.T) {
	seg := func(off int32, b ...byte) wasmbin.Data { return wasmbin.Data{Offset: off, Bytes: b} }
	withDataCount := func(code []byte) []byte {
		// A data count section (id 12) before the data section.
		secs, _ := wasmbin.Sections(code)
		for _, s := range secs {
			if s.ID == wasmbin.SectionData {
				hdr := s.Start - 2 // id and a one-byte size
				out := append([]byte{}, code[:hdr]...)
				out = append(out, 12, 1, 2)
				return append(out, code[hdr:]...)
			}
		}
		t.Fatal("no data section")
		return nil
	}
	passive := func(code []byte) []byte {
		// Turn the first segment's "active at i32.const" into a passive
		// segment: flag 1 has no offset expression.
		out := bytes.Clone(code)
		secs, _ := wasmbin.Sections(out)
		for _, s := range secs {
			if s.ID == wasmbin.SectionData {
				out[s.Start+1] = 1
			}
		}
		return out
	}
	for _, c := range []struct {
		name     string
		code     []byte
		segments int // after the rewrite; 0: left unchanged
	}{
		{"adjacent", dataModule(1, seg(16, 1, 2), seg(18, 3)), 1},
		{"gaps", dataModule(1, seg(100, 1), seg(0, 9, 9), seg(200, 7), seg(5000, 5)), 2},
		{"out of order", dataModule(2, seg(70000, 4), seg(8, 1)), 0},
		{"far apart", dataModule(2, seg(0, 1), seg(65000, 2)), 0},
		{"overlap", dataModule(1, seg(10, 1, 2, 3), seg(11, 4)), 0},
		{"one", dataModule(1, seg(10, 1)), 0},
		{"out of bounds", dataModule(1, seg(65530, 1), seg(65535, 1, 2)), 1},
		{"high offset", dataModule(1, seg(-8, 1), seg(-4, 2)), 1},
		{"data count", withDataCount(dataModule(1, seg(0, 1), seg(4, 2))), 0},
		{"passive", passive(dataModule(1, seg(0, 1), seg(4, 2))), 0},
		{"truncated", dataModule(1, seg(0, 1), seg(4, 2))[:30], 0},
		{"not wasm", []byte("hello, world"), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := mergeDataSegments(c.code)
			if c.segments == 0 {
				if !bytes.Equal(got, c.code) {
					t.Fatalf("rewritten, want the module unchanged")
				}
				return
			}
			if n := dataSegmentCount(t, got); n != c.segments {
				t.Fatalf("%d segments after merging, want %d", n, c.segments)
			}
			sameInstance(t, c.code, got)
		})
	}
}

// sameInstance checks that a and b instantiate to the same memory, or both fail.
func sameInstance(t *testing.T, a, b []byte) {
	t.Helper()
	rt := wazero.NewRuntimeWithConfig(context.Background(), wazero.NewRuntimeConfigInterpreter())
	defer rt.Close(context.Background())
	want, errA := initialMemory(t, rt, a)
	got, errB := initialMemory(t, rt, b)
	if (errA == nil) != (errB == nil) {
		t.Fatalf("original instantiates with %v, rewritten with %v", errA, errB)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("initial memory differs after merging")
	}
}

// FuzzMergeDataSegments: the rewrite never panics, and a module it changes
// instantiates as the original does.
func FuzzMergeDataSegments(f *testing.F) {
	f.Add(dataModule(1, wasmbin.Data{Offset: 3, Bytes: []byte{1}}, wasmbin.Data{Offset: 40, Bytes: []byte{2, 3}}))
	f.Add(dataModule(1, wasmbin.Data{Offset: 30, Bytes: []byte{1}}, wasmbin.Data{Offset: 4, Bytes: []byte{2, 3}}))
	f.Add(dataModule(1, wasmbin.Data{Offset: 65534, Bytes: []byte{1}}, wasmbin.Data{Offset: 65535, Bytes: []byte{2, 3}}))
	f.Fuzz(func(t *testing.T, code []byte) {
		got := mergeDataSegments(code)
		if bytes.Equal(got, code) {
			return
		}
		sameInstance(t, code, got)
	})
}

// BenchmarkMergeDataSegments is the rewrite of the MLP module's data
// section, done once per load.
func BenchmarkMergeDataSegments(b *testing.B) {
	m, err := embedded.Lookup("mlp-go")
	if err != nil {
		b.Fatal(err)
	}
	code, err := m.Code()
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		mergeDataSegments(code)
	}
}
