package wasm_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"

	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// TestKernelAbuse: host kernels called with handles, shapes or lengths a
// well-behaved module would never pass fail the call with a clear error.
// The tiny model's four parameters hold handles 1–4.
func TestKernelAbuse(t *testing.T) {
	for _, tc := range []struct {
		name     string
		h        attackHyper
		want     error
		mentions []string
	}{
		{"never allocated", attackHyper{Attack: "handle_never", Handle: 999}, wasm.ErrKernel, []string{"tensor_fill", "handle 999"}},
		{"handle zero", attackHyper{Attack: "handle_never"}, wasm.ErrKernel, []string{"tensor_fill", "handle 0"}},
		{"handle 2^31", attackHyper{Attack: "handle_never", Handle: 1 << 31}, wasm.ErrKernel, []string{"handle 2147483648"}},
		{"use after free", attackHyper{Attack: "handle_freed"}, wasm.ErrKernel, []string{"tensor_fill", "handle 5"}},
		{"double free", attackHyper{Attack: "double_free"}, wasm.ErrKernel, []string{"tensor_free", "handle 5"}},
		{"gemm shapes", attackHyper{Attack: "gemm_shape"}, wasm.ErrKernel, []string{"gemm", "2x3"}},
		{"bias length", attackHyper{Attack: "bias_len"}, wasm.ErrKernel, []string{"bias_add", "4x3", "2 values"}},
		{"resize past capacity", attackHyper{Attack: "resize_cap"}, wasm.ErrKernel, []string{"tensor_resize", "3x3", "4 values"}},
		{"resize negative", attackHyper{Attack: "resize_negative"}, wasm.ErrKernel, []string{"tensor_resize", "-1x4"}},
		{"resize parameter", attackHyper{Attack: "resize_param"}, wasm.ErrKernel, []string{"tensor_resize", "handle 1", "parameter"}},
		{"free parameter", attackHyper{Attack: "free_param"}, wasm.ErrKernel, []string{"tensor_free", "handle 1", "parameter"}},
		{"parameter index", attackHyper{Attack: "param_index"}, wasm.ErrKernel, []string{"param", "index 4"}},
		{"negative shape", attackHyper{Attack: "tensor_new_negative"}, wasm.ErrKernel, []string{"tensor_new", "-1x5"}},
		{"example index", attackHyper{Attack: "gather_index"}, wasm.ErrKernel, []string{"data_gather", "index 24"}},
		{"label out of range", attackHyper{Attack: "bad_label"}, wasm.ErrKernel, []string{"softmax_xent", "7"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runAttack(t, tc.h, wasm.Limits{})
			wantSentinel(t, err, tc.want, tc.mentions...)
			requireHealthy(t)
		})
	}
}

// TestKernelBudget: a module that spends more kernel work, tensor memory or
// handles than the call allows is stopped with ErrBudget.
func TestKernelBudget(t *testing.T) {
	for _, tc := range []struct {
		attack   string
		lim      wasm.Limits
		mentions []string
	}{
		// 64×64 fills cost 4096 each (as does allocating the tensor): a few dozen pass the limit.
		{"work", wasm.Limits{MaxWork: 100_000}, []string{"tensor_fill", "exceeds limit 100000"}},
		// 2^30 values are 4 GiB, refused before anything is allocated.
		{"bytes_huge", wasm.Limits{}, []string{"tensor_new", "limit 1073741824"}},
		// 256×256 tensors are 256 KiB each; the parameters take 268 bytes.
		{"bytes_many", wasm.Limits{MaxTensorBytes: 4 << 20}, []string{"tensor_new", "limit 4194304"}},
		{"handles", wasm.Limits{}, []string{"tensor_new", "16383 live tensors"}},
	} {
		t.Run(tc.attack, func(t *testing.T) {
			_, err := runAttack(t, attackHyper{Attack: tc.attack}, tc.lim)
			wantSentinel(t, err, wasm.ErrBudget, tc.mentions...)
			requireHealthy(t)
		})
	}
}

// TestParamsOverBudget: the model's own parameters count against the tensor
// budget and handle table; a model that does not fit is refused with an error.
func TestParamsOverBudget(t *testing.T) {
	many := make([]model.Tensor, 1<<14)
	for i := range many {
		many[i] = model.Tensor{Name: fmt.Sprintf("p%d", i), Shape: []int{1}, Data: []float32{0}}
	}
	manyParams, err := model.New(many...)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		m        *model.Model
		lim      wasm.Limits
		mentions []string
	}{
		{"bytes", tinyModel(t), wasm.Limits{MaxTensorBytes: 64}, []string{"limit 64"}},
		{"handles", manyParams, wasm.Limits{}, []string{"16383 live tensors"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := attackHyper{Attack: "none"}.call(t, tc.lim)
			c.Model = tc.m
			_, err := safeTrain(t, context.Background(), sharedModule(t, attackerPkg), c)
			wantSentinel(t, err, wasm.ErrBudget, tc.mentions...)
			requireHealthy(t)
		})
	}
}

// TestForeignHandle: handles are per call. While one call holds tensors, a
// concurrent call naming one of its handles gets ErrKernel, and the first call
// is unaffected until it is cancelled.
func TestForeignHandle(t *testing.T) {
	m := sharedModule(t, attackerPkg)
	ready := attackEnv.logs.expect("foreign")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hold := attackHyper{Attack: "hold", N: 50, Token: "foreign"}.call(t, wasm.Limits{})
	done := make(chan error, 1)
	go func() {
		_, err := m.Train(ctx, hold)
		done <- err
	}()
	var handle string
	select {
	case handle = <-ready:
	case err := <-done:
		t.Fatalf("holding call ended before it held anything: %v", err)
	}
	h, err := strconv.ParseUint(handle, 10, 32)
	if err != nil || h <= 4 {
		t.Fatalf("holding call announced handle %q", handle)
	}
	_, err = runAttack(t, attackHyper{Attack: "handle_never", Handle: uint32(h)}, wasm.Limits{})
	wantSentinel(t, err, wasm.ErrKernel, fmt.Sprintf("handle %d is not a live tensor of this call", h))
	// The attempt did not disturb the holder, which is still running.
	select {
	case err := <-done:
		t.Fatalf("holding call ended while held: %v", err)
	default:
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled holding call: %v, want context.Canceled", err)
	}
	requireHealthy(t)
}

// TestCancel: cancelling a call's context stops it with the context's error,
// not a sentinel that blames the module, wherever the module is spinning.
func TestCancel(t *testing.T) {
	for _, attack := range []string{"hold", "host_spin"} {
		t.Run(attack, func(t *testing.T) {
			token := "cancel-" + attack
			ready := attackEnv.logs.expect(token)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			m, c := sharedModule(t, attackerPkg), attackHyper{Attack: attack, Token: token}.call(t, wasm.Limits{})
			done := make(chan error, 1)
			go func() {
				_, err := m.Train(ctx, c)
				done <- err
			}()
			select {
			case <-ready:
			case err := <-done:
				t.Fatalf("call ended before it was cancelled: %v", err)
			}
			cancel()
			err := <-done
			if !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled call: %v, want context.Canceled", err)
			}
			for _, s := range allSentinels {
				if errors.Is(err, s) {
					t.Errorf("cancelled call: %v wraps %v", err, s)
				}
			}
			requireHealthy(t)
		})
	}
}

// TestEvaluateAbuse: evaluate runs the same host checks as train, and a
// module that scribbles on the parameters during evaluate returns no model.
func TestEvaluateAbuse(t *testing.T) {
	m := sharedModule(t, attackerPkg)
	c := attackHyper{Attack: "free_param"}.call(t, wasm.Limits{})
	_, err := m.Evaluate(context.Background(), c)
	wantSentinel(t, err, wasm.ErrKernel, "tensor_free")
	res, err := m.Evaluate(context.Background(), attackHyper{Attack: "nan_weight"}.call(t, wasm.Limits{}))
	if err != nil || res.Model != nil {
		t.Fatalf("evaluate that scribbles on parameters: %+v, %v; want no model and no error", res, err)
	}
	good := sharedModule(t, wasmtest.MLP)
	if _, err := good.Evaluate(context.Background(), wasm.Call{Model: tinyModel(t), Data: tinyData()}); err != nil {
		t.Fatalf("host no longer evaluates a good module: %v", err)
	}
	requireHealthy(t)
}
