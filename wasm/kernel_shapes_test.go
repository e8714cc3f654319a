package wasm_test

import (
	"context"
	"encoding/binary"
	"math"
	"testing"

	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/internal/wasmbin"
)

// maxDim is the largest dimension tensor_new accepts; with the other
// dimension 0 the tensor holds no values and costs nothing to allocate.
const maxDim = math.MaxInt32

// TestV2HostileShapes: ABI v2 kernels called with shapes chosen to make the
// host work for nothing. A tensor with no columns may claim 2^31−1 rows for
// free, so every kernel charges for what it visits, not only for values:
// without that, one batched_gemm over 2^31−1 empty blocks ran about two
// minutes uncharged and past its deadline, a gemm with k = 0 scaled C for
// nothing, and embedding read every id of an empty-row lookup for nothing.
// Allocated tensors are handles 5, 6, … in order.
func TestV2HostileShapes(t *testing.T) {
	// Allocation is charged too (one unit per value), so each attack fits
	// under this budget until the kernel's own charge.
	lim := wasm.Limits{MaxWork: 1_000_000}
	for _, tc := range []struct {
		name     string
		ops      []hostOp
		mentions []string
	}{
		{"batched_gemm over 2^31-1 empty blocks", []hostOp{newT(maxDim, 0), newT(0, 0), newT(maxDim, 0),
			op("batched_gemm", int32(0), int32(0), float32(1), int32(5), int32(6), float32(0), int32(7), int32(maxDim))},
			[]string{"batched_gemm", "exceeds limit 1000000"}},
		// 2^19 blocks of 1×0 by 0×1: no flops, but each block scales its C value.
		{"batched_gemm with k = 0", []hostOp{newT(1<<19, 0), newT(0, 1), newT(1<<19, 1),
			op("batched_gemm", int32(0), int32(0), float32(1), int32(5), int32(6), float32(2), int32(7), int32(1<<19))},
			[]string{"batched_gemm", "exceeds limit 1000000"}},
		// C is 512×512 (262144 values): three k = 0 products scale it for free.
		{"gemm with k = 0", []hostOp{newT(512, 0), newT(0, 512), newT(512, 512),
			op("gemm", int32(0), int32(0), float32(1), int32(5), int32(6), float32(2), int32(7)),
			op("gemm", int32(0), int32(0), float32(1), int32(5), int32(6), float32(2), int32(7)),
			op("gemm", int32(0), int32(0), float32(1), int32(5), int32(6), float32(2), int32(7))},
			[]string{"gemm", "exceeds limit 1000000"}},
		// 2^19 ids (id 0 of a 1×0 table) into 2^19 empty rows, twice.
		{"embedding of empty rows", []hostOp{newT(1, 0), newT(1<<19, 1), newT(1<<19, 0),
			op("embedding", int32(5), int32(6), int32(7)), op("embedding", int32(5), int32(6), int32(7))},
			[]string{"embedding", "exceeds limit 1000000"}},
		{"embedding_grad of empty rows", []hostOp{newT(1<<19, 0), newT(1<<19, 1), newT(1, 0),
			op("embedding_grad", int32(5), int32(6), int32(7)), op("embedding_grad", int32(5), int32(6), int32(7))},
			[]string{"embedding_grad", "exceeds limit 1000000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantSentinel(t, runOps(t, lim, false, tc.ops...), wasm.ErrBudget, tc.mentions...)
		})
	}

	// Kernels that walk rows return at once on rows with no values (see
	// model/kernel TestEmptyRowsDoNoWork), so these cost nothing and take no
	// time however many rows they claim; they succeed under a tiny budget.
	t.Run("row-walking kernels on 2^31-1 empty rows", func(t *testing.T) {
		err := runOps(t, wasm.Limits{MaxWork: 1000}, false, newT(1, 0), newT(maxDim, 0), newT(0, 0),
			op("split_heads", int32(5), int32(6), int32(1), int32(maxDim)),
			op("merge_heads", int32(6), int32(5), int32(1), int32(maxDim)),
			op("softmax_grad", int32(6), int32(6), int32(6)),
			op("bias_add", int32(6), int32(7)))
		if err != nil {
			t.Fatalf("kernels on empty rows: %v", err)
		}
	})

	// Shapes whose products overflow int32, and negative ones, are refused
	// before the host allocates or loops.
	for _, tc := range []struct {
		name       string
		rows, cols int32
		mention    string
	}{
		{"2^16 x 2^16", 1 << 16, 1 << 16, "65536x65536 too large"},
		{"max x max", maxDim, maxDim, "too large"},
		{"max x -1", maxDim, -1, "negative shape"},
		{"min x min", math.MinInt32, math.MinInt32, "negative shape"},
	} {
		t.Run("tensor_new "+tc.name, func(t *testing.T) {
			wantSentinel(t, runOps(t, wasm.Limits{}, false, newT(tc.rows, tc.cols)), wasm.ErrKernel, "tensor_new", tc.mention)
		})
	}
	requireHealthy(t)
}

// TestV2AliasedProduct: gemm and batched_gemm refuse an output that is also
// an input. BLAS requires C apart from A and B, and gonum splits a large
// product across goroutines, so an aliased call had host goroutines reading
// values of C that others were writing: a data race whose result depended
// on scheduling. The same products into a tensor of their own succeed.
func TestV2AliasedProduct(t *testing.T) {
	for _, tc := range []struct {
		name     string
		call     hostOp
		mentions []string
	}{
		{"gemm C is A", op("gemm", int32(0), int32(0), float32(1), int32(5), int32(6), float32(0), int32(5)), []string{"gemm", "handle 5", "is also A"}},
		{"gemm C is B", op("gemm", int32(0), int32(0), float32(1), int32(5), int32(6), float32(0), int32(6)), []string{"gemm", "handle 6", "is also B"}},
		{"batched_gemm C is A", op("batched_gemm", int32(0), int32(0), float32(1), int32(5), int32(6), float32(0), int32(5), int32(2)),
			[]string{"batched_gemm", "handle 5", "is also A"}},
		{"batched_gemm C is B", op("batched_gemm", int32(0), int32(1), float32(1), int32(5), int32(6), float32(0), int32(6), int32(2)),
			[]string{"batched_gemm", "handle 6", "is also B"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Square 256×256 operands: large enough for gonum to go parallel.
			ops := []hostOp{newT(256, 256), newT(256, 256), fill(5, 1), fill(6, 1), tc.call}
			wantSentinel(t, runOps(t, wasm.Limits{}, false, ops...), wasm.ErrKernel, tc.mentions...)
		})
	}
	t.Run("apart", func(t *testing.T) {
		err := runOps(t, wasm.Limits{}, false, newT(256, 256), newT(256, 256), newT(256, 256), newT(256, 128), fill(5, 1), fill(6, 1),
			op("gemm", int32(0), int32(0), float32(1), int32(5), int32(6), float32(0), int32(7)),
			op("batched_gemm", int32(0), int32(1), float32(1), int32(5), int32(6), float32(0), int32(8), int32(2)))
		if err != nil {
			t.Fatalf("products into their own tensor: %v", err)
		}
	})
	requireHealthy(t)
}

// TestV2PointerEdges: pointers need no alignment (values are copied byte by
// byte, little-endian), and a range that ends one byte past memory, or wraps
// past 2^32, is refused whatever its alignment. The module writes fc2.bias
// (handle 4, 1×3) from an odd address, and the host returns what it wrote.
func TestV2PointerEdges(t *testing.T) {
	want := []float32{1.5, -2, 3}
	vals := make([]byte, 12)
	for i, v := range want {
		binary.LittleEndian.PutUint32(vals[4*i:], math.Float32bits(v))
	}
	const odd = 41 // past the result document at 16–33
	seg := []wasmbin.Data{{Offset: odd, Bytes: vals}}
	code := opsModuleData(seg, 2, "fleetlearn_v2", false,
		op("tensor_write", int32(4), int32(odd), int32(3)),
		// Read it back to another odd address and write that to the tensor again.
		op("tensor_read", int32(4), int32(odd+16), int32(3)),
		op("tensor_write", int32(4), int32(odd+16), int32(3)))
	m, err := loadHand(t, code)
	if err != nil {
		t.Fatal(err)
	}
	res, err := safeTrain(t, context.Background(), m, wasm.Call{Model: tinyModel(t), Data: tinyData()})
	if err != nil {
		t.Fatalf("tensor_write from an odd address: %v", err)
	}
	got := res.Model.Tensors[3]
	if got.Name != "fc2.bias" {
		t.Fatalf("parameter 4 is %s", got.Name)
	}
	for i, v := range want {
		if got.Data[i] != v {
			t.Fatalf("fc2.bias = %v, want %v", got.Data, want)
		}
	}
	for _, tc := range []struct {
		name string
		ptr  int32
	}{
		{"one byte past memory", 65536 - 11},
		{"wraps past 2^32", -3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, fn := range []string{"tensor_write", "tensor_read"} {
				wantSentinel(t, runOps(t, wasm.Limits{}, false, op(fn, int32(4), tc.ptr, int32(3))), wasm.ErrMemoryAccess, fn)
			}
		})
	}
	requireHealthy(t)
}
