//go:build wasip1

// Command attacker is a hostile update module for the sandbox's tests. The task
// hyper-parameter "attack" picks one way to misbehave; most attacks call the
// host's functions directly, with raw arguments the SDK would never pass.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"unsafe"

	"github.com/fleetlearn/fleetlearn/wasm/sdk"
)

func init() { sdk.Handle(attack, attack) }

func main() {}

//go:wasmimport fleetlearn_v1 input_len
func inputLen() uint32

//go:wasmimport fleetlearn_v1 input_read
func inputRead(ptr, n uint32) uint32

//go:wasmimport fleetlearn_v1 output_write
func outputWrite(ptr, n uint32)

//go:wasmimport fleetlearn_v1 fail
func fail(ptr, n uint32)

//go:wasmimport fleetlearn_v1 log
func logLine(ptr, n uint32)

//go:wasmimport fleetlearn_v1 param
func param(i int32) uint32

//go:wasmimport fleetlearn_v1 tensor_new
func tensorNew(rows, cols int32) uint32

//go:wasmimport fleetlearn_v1 tensor_free
func tensorFree(h uint32)

//go:wasmimport fleetlearn_v1 tensor_resize
func tensorResize(h uint32, rows, cols int32)

//go:wasmimport fleetlearn_v1 tensor_write
func tensorWrite(h, ptr, n uint32)

//go:wasmimport fleetlearn_v1 tensor_read
func tensorRead(h, ptr, n uint32)

//go:wasmimport fleetlearn_v1 tensor_fill
func tensorFill(h uint32, v float32)

//go:wasmimport fleetlearn_v1 data_gather
func dataGather(x, labels, idxPtr, n uint32)

//go:wasmimport fleetlearn_v1 gemm
func gemm(transA, transB uint32, alpha float32, a, b uint32, beta float32, c uint32)

//go:wasmimport fleetlearn_v1 bias_add
func biasAdd(x, b uint32)

//go:wasmimport fleetlearn_v1 softmax_xent
func softmaxXent(logits, labels, grad uint32) float64

// far is an address beyond any wasm32 memory a sandbox grants.
const far = 0xFFFFFFF0

type hyper struct {
	Attack string `json:"attack"`
	Handle uint32 `json:"handle"` // for handle_never
	Token  string `json:"token"`  // for the attacks that announce themselves
	N      int32  `json:"n"`      // a size, for hold and kernel_loop
}

var (
	hold [][]byte // keeps grow's allocations reachable
	spin uint64   // a side effect the compiler cannot drop
)

func ptr[T any](s []T) uint32 { return uint32(uintptr(unsafe.Pointer(&s[0]))) }

// announce logs "ready <token> <v>" so a test knows the attack has reached its loop.
func announce(h hyper, v uint32) { sdk.Log(fmt.Sprintf("ready %s %d", h.Token, v)) }

func attack(req *sdk.Request) (*sdk.Result, error) {
	var h hyper
	if err := json.Unmarshal(req.Hyper, &h); err != nil {
		return nil, err
	}
	res := &sdk.Result{NumExamples: req.Data.Examples, Metrics: map[string]float64{"attacks": 1}}
	switch h.Attack {
	case "none":

	// Runaway code.
	case "loop":
		for {
			spin = spin*6364136223846793005 + 1442695040888963407
		}
	case "grow":
		for {
			b := make([]byte, 1<<20)
			for i := 0; i < len(b); i += 4096 {
				b[i] = 1
			}
			hold = append(hold, b)
		}
	case "kernel_loop":
		a, b, c := tensorNew(h.N, h.N), tensorNew(h.N, h.N), tensorNew(h.N, h.N)
		tensorFill(a, 1) // nonzero: gemm skips work for zeros in a
		tensorFill(b, 1)
		for {
			gemm(0, 0, 1, a, b, 0, c)
		}
	case "panic":
		panic("attacker panics on purpose")
	case "exit0":
		os.Exit(0)
	case "fail":
		return nil, errors.New("attacker gives up on purpose")

	// Lies in the result.
	case "claim_examples":
		res.NumExamples = req.Data.Examples + 1
	case "negative_examples":
		res.NumExamples = -1
	case "nan_weight":
		sdk.Param(0).Fill(float32(math.NaN()))
	case "inf_weight":
		sdk.Param(1).Fill(float32(math.Inf(-1)))
	case "output_huge":
		b := make([]byte, 64<<10+1)
		outputWrite(ptr(b), uint32(len(b)))

	// Addresses and lengths outside the module's memory.
	case "input_read_far":
		inputRead(far, inputLen())
	case "output_write_far":
		outputWrite(far, 16)
	case "fail_far":
		fail(far, 16)
	case "log_past_memory":
		b := []byte("x")
		logLine(ptr(b), 1<<31)
	case "tensor_read_far":
		tensorRead(tensorNew(2, 2), far, 4)
	case "tensor_write_far":
		tensorWrite(tensorNew(2, 2), far, 4)
	case "data_gather_far":
		dataGather(tensorNew(2, int32(req.Data.Dim)), tensorNew(2, 1), far, 2)

	// Kernel misuse.
	case "tensor_write_short":
		v := make([]float32, 3)
		tensorWrite(tensorNew(2, 2), ptr(v), uint32(len(v)))
	case "gather_index":
		idx := []int32{0, int32(req.Data.Examples)}
		dataGather(tensorNew(2, int32(req.Data.Dim)), tensorNew(2, 1), ptr(idx), uint32(len(idx)))
	case "handle_never":
		tensorFill(h.Handle, 1)
	case "handle_freed":
		t := tensorNew(1, 1)
		tensorFree(t)
		tensorFill(t, 1)
	case "double_free":
		t := tensorNew(1, 1)
		tensorFree(t)
		tensorFree(t)
	case "gemm_shape":
		gemm(0, 0, 1, tensorNew(2, 3), tensorNew(2, 3), 0, tensorNew(2, 3))
	case "bias_len":
		biasAdd(tensorNew(4, 3), tensorNew(1, 2))
	case "resize_cap":
		tensorResize(tensorNew(2, 2), 3, 3)
	case "resize_negative":
		tensorResize(tensorNew(2, 2), -1, 4)
	case "resize_param":
		tensorResize(param(0), 1, 1)
	case "free_param":
		tensorFree(param(0))
	case "param_index":
		param(int32(len(req.Params)))
	case "tensor_new_negative":
		tensorNew(-1, 5)
	case "bad_label":
		labels := tensorNew(1, 1)
		tensorFill(labels, 7)
		softmaxXent(tensorNew(1, 3), labels, 0)

	// Budgets.
	case "work":
		t := tensorNew(64, 64)
		for {
			tensorFill(t, 1)
		}
	case "bytes_huge":
		tensorNew(1<<15, 1<<15)
	case "bytes_many":
		for {
			tensorNew(256, 256)
		}
	case "handles":
		for {
			tensorNew(0, 0)
		}

	// Long-running calls that a test stops from outside.
	case "hold":
		// Allocate N tensors and keep them, spinning in module code.
		var last uint32
		for range h.N {
			last = tensorNew(1, 1)
		}
		announce(h, last)
		for {
			spin = spin*6364136223846793005 + 1442695040888963407
		}
	case "host_spin":
		t := tensorNew(1, 1)
		announce(h, t)
		for {
			tensorFill(t, 1)
		}
	default:
		return nil, fmt.Errorf("unknown attack %q", h.Attack)
	}
	return res, nil
}
