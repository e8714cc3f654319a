//go:build wasip1

package sdk

// Host functions of ABI v1, module "fleetlearn_v1". Pointers are offsets into
// this module's linear memory; lengths of float32 and int32 buffers are counted
// in elements, of byte buffers in bytes.

//go:wasmimport fleetlearn_v1 input_len
func hostInputLen() uint32

//go:wasmimport fleetlearn_v1 input_read
func hostInputRead(ptr, n uint32) uint32

//go:wasmimport fleetlearn_v1 output_write
func hostOutputWrite(ptr, n uint32)

//go:wasmimport fleetlearn_v1 fail
func hostFail(ptr, n uint32)

//go:wasmimport fleetlearn_v1 log
func hostLog(ptr, n uint32)

//go:wasmimport fleetlearn_v1 param_count
func hostParamCount() int32

//go:wasmimport fleetlearn_v1 param
func hostParam(i int32) uint32

//go:wasmimport fleetlearn_v1 tensor_new
func hostTensorNew(rows, cols int32) uint32

//go:wasmimport fleetlearn_v1 tensor_free
func hostTensorFree(h uint32)

//go:wasmimport fleetlearn_v1 tensor_rows
func hostTensorRows(h uint32) int32

//go:wasmimport fleetlearn_v1 tensor_cols
func hostTensorCols(h uint32) int32

//go:wasmimport fleetlearn_v1 tensor_resize
func hostTensorResize(h uint32, rows, cols int32)

//go:wasmimport fleetlearn_v1 tensor_write
func hostTensorWrite(h, ptr, n uint32)

//go:wasmimport fleetlearn_v1 tensor_read
func hostTensorRead(h, ptr, n uint32)

//go:wasmimport fleetlearn_v1 tensor_fill
func hostTensorFill(h uint32, v float32)

//go:wasmimport fleetlearn_v1 tensor_copy
func hostTensorCopy(dst, src uint32)

//go:wasmimport fleetlearn_v1 data_count
func hostDataCount() int32

//go:wasmimport fleetlearn_v1 data_dim
func hostDataDim() int32

//go:wasmimport fleetlearn_v1 data_classes
func hostDataClasses() int32

//go:wasmimport fleetlearn_v1 data_gather
func hostDataGather(x, labels, idxPtr, n uint32)

//go:wasmimport fleetlearn_v1 gemm
func hostGemm(transA, transB uint32, alpha float32, a, b uint32, beta float32, c uint32)

//go:wasmimport fleetlearn_v1 bias_add
func hostBiasAdd(x, b uint32)

//go:wasmimport fleetlearn_v1 col_sum
func hostColSum(x, out uint32)

//go:wasmimport fleetlearn_v1 relu
func hostReLU(x, y uint32)

//go:wasmimport fleetlearn_v1 relu_grad
func hostReLUGrad(dy, x, dx uint32)

//go:wasmimport fleetlearn_v1 softmax_xent
func hostSoftmaxXent(logits, labels, grad uint32) float64

//go:wasmimport fleetlearn_v1 count_correct
func hostCountCorrect(logits, labels uint32) int32

//go:wasmimport fleetlearn_v1 axpy
func hostAxpy(alpha float32, x, y uint32)

//go:wasmimport fleetlearn_v1 scale
func hostScale(alpha float32, x uint32)

//go:wasmimport fleetlearn_v1 norm2
func hostNorm2(x uint32) float64
