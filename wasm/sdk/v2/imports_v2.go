//go:build wasip1

package sdk

// What ABI v2 adds to v1's host functions (imports_gen.go).

//go:wasmimport fleetlearn_v2 embedding
func hostEmbedding(table, ids, out uint32)

//go:wasmimport fleetlearn_v2 embedding_grad
func hostEmbeddingGrad(dout, ids, dtable uint32)

//go:wasmimport fleetlearn_v2 layer_norm
func hostLayerNorm(x, gamma, beta, y, mean, rstd uint32, eps float32)

//go:wasmimport fleetlearn_v2 layer_norm_grad
func hostLayerNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta uint32)

//go:wasmimport fleetlearn_v2 gelu
func hostGELU(x, y uint32)

//go:wasmimport fleetlearn_v2 gelu_grad
func hostGELUGrad(dy, x, dx uint32)

//go:wasmimport fleetlearn_v2 softmax
func hostSoftmax(x, y uint32, causal int32)

//go:wasmimport fleetlearn_v2 softmax_grad
func hostSoftmaxGrad(dy, y, dx uint32)

//go:wasmimport fleetlearn_v2 batched_gemm
func hostBatchedGemm(transA, transB uint32, alpha float32, a, b uint32, beta float32, c uint32, batch int32)

//go:wasmimport fleetlearn_v2 split_heads
func hostSplitHeads(x, y uint32, seq, heads int32)

//go:wasmimport fleetlearn_v2 merge_heads
func hostMergeHeads(y, x uint32, seq, heads int32)

//go:wasmimport fleetlearn_v2 adamw
func hostAdamW(p, g, m, v uint32, lr, beta1, beta2, eps, weightDecay float32, step int32)
