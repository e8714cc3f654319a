//go:build wasip1

package sdk

// Conv2D writes into y (n × OutC·OH·OW) the 2-D convolution of x (n ×
// inC·inH·inW, NCHW rows) with w (OutC × inC·kh·kw, PyTorch's [out, in, kh,
// kw]), plus the bias b (1×OutC; None for none).
func Conv2D(x, w, b, y Tensor, inC, inH, inW, kh, kw, stride, pad int) {
	hostConv2D(x.h, w.h, b.h, y.h, int32(inC), int32(inH), int32(inW), int32(kh), int32(kw), int32(stride), int32(pad))
}

// Conv2DGrad writes the input gradient into dx and adds the weight and bias
// gradients into dw and db (zero them first); None skips any of them.
func Conv2DGrad(dy, x, w, dx, dw, db Tensor, inC, inH, inW, kh, kw, stride, pad int) {
	hostConv2DGrad(dy.h, x.h, w.h, dx.h, dw.h, db.h, int32(inC), int32(inH), int32(inW), int32(kh), int32(kw), int32(stride), int32(pad))
}

// MaxPool2D writes the maxima of k×k windows, stride apart, of each c×h×w
// example of x into y.
func MaxPool2D(x, y Tensor, c, h, w, k, stride int) {
	hostMaxPool2D(x.h, y.h, int32(c), int32(h), int32(w), int32(k), int32(stride))
}

// MaxPool2DGrad routes each value of dy to its window's maximum in x, into
// dx (overwritten).
func MaxPool2DGrad(dy, x, dx Tensor, c, h, w, k, stride int) {
	hostMaxPool2DGrad(dy.h, x.h, dx.h, int32(c), int32(h), int32(w), int32(k), int32(stride))
}

// AvgPool2D writes the means of k×k windows, stride apart, into y.
func AvgPool2D(x, y Tensor, c, h, w, k, stride int) {
	hostAvgPool2D(x.h, y.h, int32(c), int32(h), int32(w), int32(k), int32(stride))
}

// AvgPool2DGrad spreads each value of dy over its window, into dx
// (overwritten).
func AvgPool2DGrad(dy, dx Tensor, c, h, w, k, stride int) {
	hostAvgPool2DGrad(dy.h, dx.h, int32(c), int32(h), int32(w), int32(k), int32(stride))
}

// GroupNorm normalises each example's groups of channels of x into y, then
// scales and shifts per channel; mean and rstd (n × groups) keep the
// statistics for the gradient.
func GroupNorm(x, gamma, beta, y, mean, rstd Tensor, groups, channels int, eps float32) {
	hostGroupNorm(x.h, gamma.h, beta.h, y.h, mean.h, rstd.h, int32(groups), int32(channels), eps)
}

// GroupNormGrad writes the input gradient into dx and adds the scale and
// shift gradients into dgamma and dbeta (zero them first).
func GroupNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta Tensor, groups, channels int) {
	hostGroupNormGrad(dy.h, x.h, gamma.h, mean.h, rstd.h, dx.h, dgamma.h, dbeta.h, int32(groups), int32(channels))
}

// Dropout zeroes each value of x with probability p and scales the rest by
// 1/(1−p), into y; the mask follows from seed and each value's index.
func Dropout(x, y Tensor, p float32, seed uint64) { hostDropout(x.h, y.h, p, seed) }

// DropoutGrad applies the same mask (same p and seed) to dy, into dx.
func DropoutGrad(dy, dx Tensor, p float32, seed uint64) { hostDropoutGrad(dy.h, dx.h, p, seed) }
