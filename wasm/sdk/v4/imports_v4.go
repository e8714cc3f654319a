//go:build wasip1

package sdk

// What ABI v4 adds to v3's host functions.

//go:wasmimport fleetlearn_v4 conv2d
func hostConv2D(x, w, b, y uint32, inC, inH, inW, kh, kw, stride, pad int32)

//go:wasmimport fleetlearn_v4 conv2d_grad
func hostConv2DGrad(dy, x, w, dx, dw, db uint32, inC, inH, inW, kh, kw, stride, pad int32)

//go:wasmimport fleetlearn_v4 max_pool2d
func hostMaxPool2D(x, y uint32, c, h, w, k, stride int32)

//go:wasmimport fleetlearn_v4 max_pool2d_grad
func hostMaxPool2DGrad(dy, x, dx uint32, c, h, w, k, stride int32)

//go:wasmimport fleetlearn_v4 avg_pool2d
func hostAvgPool2D(x, y uint32, c, h, w, k, stride int32)

//go:wasmimport fleetlearn_v4 avg_pool2d_grad
func hostAvgPool2DGrad(dy, dx uint32, c, h, w, k, stride int32)

//go:wasmimport fleetlearn_v4 group_norm
func hostGroupNorm(x, gamma, beta, y, mean, rstd uint32, groups, channels int32, eps float32)

//go:wasmimport fleetlearn_v4 group_norm_grad
func hostGroupNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta uint32, groups, channels int32)

//go:wasmimport fleetlearn_v4 dropout
func hostDropout(x, y uint32, p float32, seed uint64)

//go:wasmimport fleetlearn_v4 dropout_grad
func hostDropoutGrad(dy, dx uint32, p float32, seed uint64)
