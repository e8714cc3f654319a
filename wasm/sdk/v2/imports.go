//go:build wasip1

package sdk

// Host functions of ABI v2, module "fleetlearn_v2": all of v1's, then what v2
// adds. Pointers are offsets into this module's linear memory; lengths of
// float32 and int32 buffers are counted in elements, of byte buffers in bytes.

//go:wasmimport fleetlearn_v2 input_len
func hostInputLen() uint32

//go:wasmimport fleetlearn_v2 input_read
func hostInputRead(ptr, n uint32) uint32

//go:wasmimport fleetlearn_v2 output_write
func hostOutputWrite(ptr, n uint32)

//go:wasmimport fleetlearn_v2 fail
func hostFail(ptr, n uint32)

//go:wasmimport fleetlearn_v2 log
func hostLog(ptr, n uint32)

//go:wasmimport fleetlearn_v2 param_count
func hostParamCount() int32

//go:wasmimport fleetlearn_v2 param
func hostParam(i int32) uint32

//go:wasmimport fleetlearn_v2 tensor_new
func hostTensorNew(rows, cols int32) uint32

//go:wasmimport fleetlearn_v2 tensor_free
func hostTensorFree(h uint32)

//go:wasmimport fleetlearn_v2 tensor_rows
func hostTensorRows(h uint32) int32

//go:wasmimport fleetlearn_v2 tensor_cols
func hostTensorCols(h uint32) int32

//go:wasmimport fleetlearn_v2 tensor_resize
func hostTensorResize(h uint32, rows, cols int32)

//go:wasmimport fleetlearn_v2 tensor_write
func hostTensorWrite(h, ptr, n uint32)

//go:wasmimport fleetlearn_v2 tensor_read
func hostTensorRead(h, ptr, n uint32)

//go:wasmimport fleetlearn_v2 tensor_fill
func hostTensorFill(h uint32, v float32)

//go:wasmimport fleetlearn_v2 tensor_copy
func hostTensorCopy(dst, src uint32)

//go:wasmimport fleetlearn_v2 data_count
func hostDataCount() int32

//go:wasmimport fleetlearn_v2 data_dim
func hostDataDim() int32

//go:wasmimport fleetlearn_v2 data_classes
func hostDataClasses() int32

//go:wasmimport fleetlearn_v2 data_gather
func hostDataGather(x, labels, idxPtr, n uint32)

//go:wasmimport fleetlearn_v2 gemm
func hostGemm(transA, transB uint32, alpha float32, a, b uint32, beta float32, c uint32)

//go:wasmimport fleetlearn_v2 bias_add
func hostBiasAdd(x, b uint32)

//go:wasmimport fleetlearn_v2 col_sum
func hostColSum(x, out uint32)

//go:wasmimport fleetlearn_v2 relu
func hostReLU(x, y uint32)

//go:wasmimport fleetlearn_v2 relu_grad
func hostReLUGrad(dy, x, dx uint32)

//go:wasmimport fleetlearn_v2 softmax_xent
func hostSoftmaxXent(logits, labels, grad uint32) float64

//go:wasmimport fleetlearn_v2 count_correct
func hostCountCorrect(logits, labels uint32) int32

//go:wasmimport fleetlearn_v2 axpy
func hostAxpy(alpha float32, x, y uint32)

//go:wasmimport fleetlearn_v2 scale
func hostScale(alpha float32, x uint32)

//go:wasmimport fleetlearn_v2 norm2
func hostNorm2(x uint32) float64

// What ABI v2 adds.

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
