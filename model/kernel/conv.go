package kernel

// Convolution by im2col onto Gemm. Each example's input is unrolled into a
// K×P matrix col (K = InC·KH·KW rows, one per weight column; P = OutH·OutW
// columns, one per output position), so the convolution of one example is
// the OutC×P product W·col, which lands directly in the example's NCHW
// output row. The gradient reuses the same two views: dW += dY·colᵀ and
// dcol = Wᵀ·dY, whose columns col2im adds back onto the input positions.
//
// Examples go through the GEMM in chunks (convChunk: as many as keep the
// chunk's unfolded inputs and outputs under 2^22 values, a number that
// does not depend on the thread count): the chunk's cols sit side by side
// in one K×(chunk·P) matrix, so one wide product splits across threads
// where one example's would be too small to. Every output keeps the fma
// chain it would have example by example (over K for y and dcol, over the
// examples' positions in order for dW), and Gemm gives the same bits on any
// number of threads, so the result is the same on every run and machine.
// im2col, col2im and the copies between the chunk and the NCHW rows run
// per example on up to Threads() goroutines, each writing its own part.
//
// Geometry integers come from untrusted modules. Conv2D.Check bounds each
// size and each product the kernels compute or allocate by MaxConvValues
// before anything is multiplied in int, so no later product can overflow,
// and a call's scratch (at most max(K·P, 2^22) values for the cols and as
// many for the outputs' chunk) is set by the geometry, not by the batch.

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"runtime"
	"sync"
	"unsafe"
)

// MaxConvValues bounds every size and product of a Conv2D or Pool2D
// geometry: 2^24 float32 values (64 MiB) is far above any real layer (an
// ImageNet stem unfolds 1.8·10^6 values an example), bounds the scratch a
// module can make the host allocate in one call, and keeps the product of
// two bounded values within int64.
const MaxConvValues = 1 << 24

// checkWork is the work (flops) between two calls of a kernel's check.
const checkWork = 30_000_000

// Conv2D is the geometry of a 2-D convolution (cross-correlation, as
// PyTorch's nn.Conv2d with groups=1 and dilation=1).
type Conv2D struct {
	InC, InH, InW int // input channels, height, width
	OutC          int // output channels
	KH, KW        int // kernel size
	Stride, Pad   int // the same in both directions; Stride ≥ 1, 0 ≤ Pad < min(KH, KW)
}

// OutH is the output height, (InH+2·Pad−KH)/Stride+1.
func (g Conv2D) OutH() int { return outSize(g.InH, g.KH, g.Stride, g.Pad) }

// OutW is the output width, (InW+2·Pad−KW)/Stride+1.
func (g Conv2D) OutW() int { return outSize(g.InW, g.KW, g.Stride, g.Pad) }

// outSize is (in+2·pad−k)/stride+1 without overflow or division by zero
// for any ints; for sizes Check refuses the value is meaningless (0).
func outSize(in, k, stride, pad int) int {
	if stride < 1 || in < 0 || k < 0 || pad < 0 || in > MaxConvValues || k > MaxConvValues || pad > MaxConvValues {
		return 0
	}
	span := in + 2*pad - k
	if span < 0 {
		return 0
	}
	return span/stride + 1
}

// field is one size of a geometry and the least value it may take.
type field struct {
	name  string
	v, lo int
}

// product is a named product of a geometry's sizes.
type product struct {
	name string
	v    []int
}

// checkSizes refuses a field outside [lo, MaxConvValues] and a product
// above MaxConvValues. The fields are checked first, so each factor is at
// most MaxConvValues when a product is formed, and a running product stops
// as soon as it passes the bound: no multiplication overflows int64.
func checkSizes(op string, fields []field, products []product) error {
	for _, f := range fields {
		if f.v < f.lo || f.v > MaxConvValues {
			return fmt.Errorf("%w: %s: %s %d not in [%d, %d]", ErrShape, op, f.name, f.v, f.lo, MaxConvValues)
		}
	}
	for _, p := range products {
		prod := int64(1)
		for _, v := range p.v {
			prod *= int64(v)
			if prod > MaxConvValues {
				return fmt.Errorf("%w: %s: %s exceeds %d values", ErrShape, op, p.name, MaxConvValues)
			}
		}
	}
	return nil
}

// Check refuses a geometry the kernels cannot run: a size below 1 (Pad
// below 0), Pad ≥ min(KH, KW), a kernel larger than the padded input, or
// more than MaxConvValues values in the input (InC·InH·InW), the weight
// (OutC·InC·KH·KW), a weight row (InC·KH·KW), the output (OutC·OutH·OutW)
// or one example's im2col matrix (InC·KH·KW·OutH·OutW). Its error wraps
// ErrShape and names the field.
func (g Conv2D) Check() error {
	const op = "conv2d"
	if err := checkSizes(op, []field{
		{"InC", g.InC, 1}, {"InH", g.InH, 1}, {"InW", g.InW, 1}, {"OutC", g.OutC, 1},
		{"KH", g.KH, 1}, {"KW", g.KW, 1}, {"Stride", g.Stride, 1}, {"Pad", g.Pad, 0},
	}, nil); err != nil {
		return err
	}
	if g.Pad >= min(g.KH, g.KW) {
		return fmt.Errorf("%w: %s: Pad %d not below the kernel %dx%d", ErrShape, op, g.Pad, g.KH, g.KW)
	}
	if g.InH+2*g.Pad < g.KH || g.InW+2*g.Pad < g.KW {
		return fmt.Errorf("%w: %s: kernel %dx%d (KH, KW) larger than the padded input %dx%d",
			ErrShape, op, g.KH, g.KW, g.InH+2*g.Pad, g.InW+2*g.Pad)
	}
	oh, ow := g.OutH(), g.OutW()
	return checkSizes(op, nil, []product{
		{"input InC·InH·InW", []int{g.InC, g.InH, g.InW}},
		{"weight row InC·KH·KW", []int{g.InC, g.KH, g.KW}},
		{"weight OutC·InC·KH·KW", []int{g.OutC, g.InC, g.KH, g.KW}},
		{"output OutC·OutH·OutW", []int{g.OutC, oh, ow}},
		{"im2col InC·KH·KW·OutH·OutW", []int{g.InC, g.KH, g.KW, oh, ow}},
	})
}

// FLOPs is the work of Conv2DForward over n examples: n·(2·OutC·K·P + K·P)
// with K = InC·KH·KW and P = OutH·OutW, the product plus im2col. It
// saturates at math.MaxInt64 rather than overflow, and is 0 for n ≤ 0 or a
// geometry Check refuses (the kernel then refuses without work).
func (g Conv2D) FLOPs(n int) int64 {
	if n <= 0 || g.Check() != nil {
		return 0
	}
	k, p, oc := int64(g.InC*g.KH*g.KW), int64(g.OutH()*g.OutW()), int64(g.OutC)
	kp := k * p // ≤ MaxConvValues
	return satMul(int64(n), satAdd(satMul(2*oc, kp), kp))
}

// GradFLOPs is the work of Conv2DGrad over n examples: per example,
// 2·OutC·K·P + K·P (product and col2im) for the input gradient when input
// is set, the same (product and im2col) for the weight gradient when
// weight is set, and OutC·P for the bias gradient always (an upper bound
// when db is absent). It saturates and is 0 where FLOPs is.
func (g Conv2D) GradFLOPs(n int, input, weight bool) int64 {
	if n <= 0 || g.Check() != nil {
		return 0
	}
	k, p, oc := int64(g.InC*g.KH*g.KW), int64(g.OutH()*g.OutW()), int64(g.OutC)
	kp := k * p
	one := satAdd(satMul(2*oc, kp), kp)
	per := oc * p // ≤ MaxConvValues
	if input {
		per = satAdd(per, one)
	}
	if weight {
		per = satAdd(per, one)
	}
	return satMul(int64(n), per)
}

// satMul is a·b for a, b ≥ 0, saturated at math.MaxInt64.
func satMul(a, b int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo)
}

// satAdd is a+b for a, b ≥ 0, saturated at math.MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// absent reports an optional operand left out: the zero Mat.
func (m Mat) absent() bool { return m.Rows == 0 && m.Cols == 0 && m.Data == nil }

// overlap reports whether two checked operands' values share memory. Gemm
// reads its inputs on several threads while it writes C, so an output that
// overlaps an input would give results that depend on the thread count.
func overlap(a, b Mat) bool {
	la, lb := a.Len(), b.Len()
	if la == 0 || lb == 0 {
		return false
	}
	pa := uintptr(unsafe.Pointer(unsafe.SliceData(a.Data)))
	pb := uintptr(unsafe.Pointer(unsafe.SliceData(b.Data)))
	const f = unsafe.Sizeof(float32(0))
	return pa < pb+uintptr(lb)*f && pb < pa+uintptr(la)*f
}

// sameVals reports whether a and b are the same values: an alias a kernel
// that reads each value before writing it can allow.
func sameVals(a, b Mat) bool {
	return a.Len() == b.Len() && (a.Len() == 0 || unsafe.SliceData(a.Data) == unsafe.SliceData(b.Data))
}

// operand is a named Mat for the overlap checks.
type operand struct {
	name string
	m    Mat
}

// disjoint refuses any output that overlaps an input or an earlier output.
func disjoint(op string, outs, ins []operand) error {
	for i, o := range outs {
		for _, in := range append(ins[:len(ins):len(ins)], outs[:i]...) {
			if overlap(o.m, in.m) {
				return fmt.Errorf("%w: %s: %s overlaps %s", ErrShape, op, o.name, in.name)
			}
		}
	}
	return nil
}

// meter calls check (if any) once about checkWork flops have been done
// since its last call.
type meter struct {
	check func() error
	work  int64
}

func (m *meter) add(w int64) error {
	if m.check == nil {
		return nil
	}
	m.work += w
	if m.work < checkWork {
		return nil
	}
	m.work = 0
	return m.check()
}

// gemm runs one product of the convolution: with the check inside Gemm
// when the product is large enough to be split by it, else charged to m.
func (m *meter) gemm(transA, transB bool, a, b Mat, beta float32, c Mat, work int64) error {
	if m.check == nil || work < checkWork {
		if err := Gemm(transA, transB, 1, a, b, beta, c); err != nil {
			return err
		}
		return m.add(work)
	}
	m.work = 0
	return GemmCheck(transA, transB, 1, a, b, beta, c, m.check)
}

// convShapes checks the geometry and the operands Conv2DForward and
// Conv2DGrad share: x (n×InC·InH·InW) and w (OutC×InC·KH·KW).
func convShapes(op string, g Conv2D, x, w Mat, n int) error {
	if err := g.Check(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if x.Rows != n || x.Cols != g.InC*g.InH*g.InW {
		return fmt.Errorf("%w: %s: x is %v, want %dx%d (InC·InH·InW)", ErrShape, op, x, n, g.InC*g.InH*g.InW)
	}
	if k := g.InC * g.KH * g.KW; w.Rows != g.OutC || w.Cols != k {
		return fmt.Errorf("%w: %s: w is %v, want %dx%d (OutC×InC·KH·KW)", ErrShape, op, w, g.OutC, k)
	}
	return nil
}

// Conv2DForward writes the convolution of x (n × InC·InH·InW, NCHW rows) by
// w (OutC × InC·KH·KW, PyTorch's [out, in, kh, kw]) plus the bias b (OutC
// values; the zero Mat for none) into y (n × OutC·OutH·OutW), overwriting
// it. y must not share memory with x, w or b. Each output value is one
// Gemm fma chain that starts from its bias (or zero) and runs over
// (c, kh, kw) in weight order, with padding taken as zeros.
//
// check (if not nil) is called about every 3·10^7 flops (inside a larger
// product, before each of Gemm's blocks); its error stops the call,
// wrapped, with y partly written.
func Conv2DForward(g Conv2D, x, w, b, y Mat, check func() error) error {
	const op = "conv2d"
	if err := errors.Join(x.check("x"), w.check("w"), b.check("b"), y.check("y")); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	n := x.Rows
	if err := convShapes(op, g, x, w, n); err != nil {
		return err
	}
	oc, p := g.OutC, g.OutH()*g.OutW()
	if !b.absent() && b.Len() != oc {
		return fmt.Errorf("%w: %s: b is %v, want %d values (OutC) or none", ErrShape, op, b, oc)
	}
	if y.Rows != n || y.Cols != oc*p {
		return fmt.Errorf("%w: %s: y is %v, want %dx%d (OutC·OutH·OutW)", ErrShape, op, y, n, oc*p)
	}
	if err := disjoint(op, []operand{{"y", y}}, []operand{{"x", x}, {"w", w}, {"b", b}}); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	k := g.InC * g.KH * g.KW
	chunk := convChunk(n, k*p, oc*p)
	colBuf, ycBuf := getScratch(k*chunk*p), getScratch(oc*chunk*p)
	defer putScratch(colBuf)
	defer putScratch(ycBuf)
	col, yc := *colBuf, *ycBuf
	m := meter{check: check}
	beta := float32(0)
	if !b.absent() {
		beta = 1
	}
	xc, ycols := x.Cols, y.Cols
	for e0 := 0; e0 < n; e0 += chunk {
		cn := min(chunk, n-e0)
		ld := cn * p
		colM := Mat{Rows: k, Cols: ld, Data: col[:k*ld]}
		yM := Mat{Rows: oc, Cols: ld, Data: yc[:oc*ld]}
		forExamples(cn, func(e int) {
			im2col(g, x.Data[(e0+e)*xc:(e0+e+1)*xc], col, ld, e*p)
		})
		if err := m.add(int64(k * ld)); err != nil {
			return fmt.Errorf("%s: examples %d to %d: %w", op, e0, e0+cn-1, err)
		}
		if beta != 0 {
			// The chain of each output starts from its bias: one rounding
			// fewer than adding it after the product.
			for c, v := range b.Vals() {
				fill(yM.Data[c*ld:(c+1)*ld], v)
			}
		}
		if err := m.gemm(false, false, w, colM, beta, yM, GemmFLOPs(oc, ld, k)); err != nil {
			return fmt.Errorf("%s: examples %d to %d: %w", op, e0, e0+cn-1, err)
		}
		forExamples(cn, func(e int) {
			ye := y.Data[(e0+e)*ycols : (e0+e+1)*ycols]
			for c := 0; c < oc; c++ {
				copy(ye[c*p:(c+1)*p], yc[c*ld+e*p:])
			}
		})
	}
	return nil
}

// Conv2DGrad computes the gradients of a convolution from dy (n ×
// OutC·OutH·OutW) and the forward's x and w: dx (n × InC·InH·InW) is
// overwritten with dL/dx; dw (OutC × InC·KH·KW) and db (OutC values) are
// accumulated (+=). Any output may be the zero Mat, to skip it (a first
// layer needs no dx), but not all three. Outputs must not share memory with
// the inputs or each other.
//
// Examples run in ascending order: dw continues one Gemm chain per value
// over the examples' positions in order; db adds, per channel, the float64
// sum of dy over examples and positions in order, rounded once; dx is
// dcol = Wᵀ·dY added back onto the input positions by (c, kh, kw, oh, ow).
//
// check (if not nil) is called as in Conv2DForward; its error stops the
// call, wrapped, with the outputs partly written.
func Conv2DGrad(g Conv2D, dy, x, w, dx, dw, db Mat, check func() error) error {
	const op = "conv2d_grad"
	if err := errors.Join(dy.check("dy"), x.check("x"), w.check("w"), dx.check("dx"),
		dw.check("dw"), db.check("db")); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	n := dy.Rows
	if err := convShapes(op, g, x, w, n); err != nil {
		return err
	}
	oc, k, p := g.OutC, g.InC*g.KH*g.KW, g.OutH()*g.OutW()
	if dy.Cols != oc*p {
		return fmt.Errorf("%w: %s: dy is %v, want %dx%d (OutC·OutH·OutW)", ErrShape, op, dy, n, oc*p)
	}
	if dx.absent() && dw.absent() && db.absent() {
		return fmt.Errorf("%w: %s: dx, dw and db are all absent", ErrShape, op)
	}
	if !dx.absent() && (dx.Rows != n || dx.Cols != x.Cols) {
		return fmt.Errorf("%w: %s: dx is %v, want %v (as x) or none", ErrShape, op, dx, x)
	}
	if !dw.absent() && (dw.Rows != oc || dw.Cols != k) {
		return fmt.Errorf("%w: %s: dw is %v, want %v (as w) or none", ErrShape, op, dw, w)
	}
	if !db.absent() && db.Len() != oc {
		return fmt.Errorf("%w: %s: db is %v, want %d values (OutC) or none", ErrShape, op, db, oc)
	}
	if err := disjoint(op, []operand{{"dx", dx}, {"dw", dw}, {"db", db}},
		[]operand{{"dy", dy}, {"x", x}, {"w", w}}); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	m := meter{check: check}
	chunk := convChunk(n, k*p, oc*p)
	// One K×(chunk·P) buffer serves both: a chunk's columns are done with
	// (its dw product) before its dcol is written.
	var col, dyc []float32
	if !dw.absent() || !dx.absent() {
		colBuf, dycBuf := getScratch(k*chunk*p), getScratch(oc*chunk*p)
		defer putScratch(colBuf)
		defer putScratch(dycBuf)
		col, dyc = *colBuf, *dycBuf
	}
	var bsum []float64
	if !db.absent() {
		bsum = make([]float64, oc)
	}
	xc, yc := x.Cols, dy.Cols
	for e0 := 0; e0 < n; e0 += chunk {
		cn := min(chunk, n-e0)
		ld := cn * p
		if bsum != nil {
			for e := e0; e < e0+cn; e++ {
				dye := dy.Data[e*yc : (e+1)*yc]
				for c := range bsum {
					s := bsum[c]
					for _, v := range dye[c*p : (c+1)*p] {
						s += float64(v)
					}
					bsum[c] = s
				}
			}
			if err := m.add(int64(oc * ld)); err != nil {
				return fmt.Errorf("%s: examples %d to %d: %w", op, e0, e0+cn-1, err)
			}
		}
		if col == nil {
			continue
		}
		colM := Mat{Rows: k, Cols: ld, Data: col[:k*ld]}
		dyM := Mat{Rows: oc, Cols: ld, Data: dyc[:oc*ld]}
		forExamples(cn, func(e int) {
			dye := dy.Data[(e0+e)*yc : (e0+e+1)*yc]
			for c := 0; c < oc; c++ {
				copy(dyc[c*ld+e*p:c*ld+(e+1)*p], dye[c*p:(c+1)*p])
			}
		})
		if !dw.absent() {
			forExamples(cn, func(e int) {
				im2col(g, x.Data[(e0+e)*xc:(e0+e+1)*xc], col, ld, e*p)
			})
			if err := m.add(int64(k * ld)); err != nil {
				return fmt.Errorf("%s: examples %d to %d: %w", op, e0, e0+cn-1, err)
			}
			// One chain per value of dw over the examples' positions in
			// order, as a product per example would continue it.
			if err := m.gemm(false, true, dyM, colM, 1, dw, GemmFLOPs(oc, k, ld)); err != nil {
				return fmt.Errorf("%s: examples %d to %d: %w", op, e0, e0+cn-1, err)
			}
		}
		if !dx.absent() {
			if err := m.gemm(true, false, w, dyM, 0, colM, GemmFLOPs(k, ld, oc)); err != nil {
				return fmt.Errorf("%s: examples %d to %d: %w", op, e0, e0+cn-1, err)
			}
			forExamples(cn, func(e int) {
				col2im(g, col, ld, e*p, dx.Data[(e0+e)*xc:(e0+e+1)*xc])
			})
			if err := m.add(int64(k * ld)); err != nil {
				return fmt.Errorf("%s: examples %d to %d: %w", op, e0, e0+cn-1, err)
			}
		}
	}
	if bsum != nil {
		dbv := db.Vals()
		for c, s := range bsum {
			dbv[c] += float32(s)
		}
	}
	return nil
}

// convChunkValues bounds a chunk's unfolded inputs and outputs: examples
// go through the GEMM together, in one product wide enough to split
// across threads, as long as their K·P and OutC·P values stay under it.
const convChunkValues = 1 << 22

// convChunk is how many of n examples a product takes at once, whatever
// the thread count: the result then never depends on it.
func convChunk(n, kp, ocp int) int {
	return max(1, min(n, convChunkValues/max(kp, ocp, 1)))
}

// scratch recycles the convolutions' buffers: a training step asks for the
// same sizes every batch, and zeroing fresh ones cost more than filling
// them. Every value of a buffer is written before it is read, so what a
// buffer held before never reaches a result.
var scratch sync.Pool // of *[]float32

func getScratch(n int) *[]float32 {
	if b, ok := scratch.Get().(*[]float32); ok && cap(*b) >= n {
		*b = (*b)[:n]
		return b
	}
	b := make([]float32, n)
	return &b
}

func putScratch(b *[]float32) { scratch.Put(b) }

// forExamples runs f for every example of a chunk, on up to Threads()
// goroutines; each example writes only its own part of the outputs.
func forExamples(n int, f func(e int)) {
	workers := min(n, Threads(), runtime.GOMAXPROCS(0))
	if workers <= 1 {
		for e := 0; e < n; e++ {
			f(e)
		}
		return
	}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := n * w / workers; e < n*(w+1)/workers; e++ {
				f(e)
			}
		}()
	}
	wg.Wait()
}

// window is the range [lo, hi) of output positions o whose input position
// o·stride − pad + off falls inside [0, in).
func window(in, out, stride, pad, off int) (lo, hi int) {
	// o·stride ≥ pad − off  and  o·stride ≤ in − 1 + pad − off.
	if d := pad - off; d > 0 {
		lo = (d + stride - 1) / stride
	}
	top := in - 1 + pad - off
	if top < 0 {
		return 0, 0
	}
	hi = min(out, top/stride+1)
	return min(lo, hi), hi
}

// im2col writes one example's K×P matrix into the columns [off, off+P) of
// col, whose rows are ld apart: row (c, kh, kw), column (oh, ow) holds
// x[c, oh·S−Pad+kh, ow·S−Pad+kw], or 0 in the padding.
func im2col(g Conv2D, x, col []float32, ld, off int) {
	oh, ow := g.OutH(), g.OutW()
	p, s, hw := oh*ow, g.Stride, g.InH*g.InW
	r := 0
	for c := 0; c < g.InC; c++ {
		xc := x[c*hw : (c+1)*hw]
		for kh := 0; kh < g.KH; kh++ {
			hlo, hhi := window(g.InH, oh, s, g.Pad, kh)
			for kw := 0; kw < g.KW; kw++ {
				wlo, whi := window(g.InW, ow, s, g.Pad, kw)
				dst := col[r*ld+off : r*ld+off+p]
				r++
				clear(dst[:hlo*ow])
				clear(dst[hhi*ow:])
				for i := hlo; i < hhi; i++ {
					d := dst[i*ow : (i+1)*ow]
					clear(d[:wlo])
					clear(d[whi:])
					if wlo == whi {
						continue
					}
					src := xc[(i*s-g.Pad+kh)*g.InW:][:g.InW]
					iw := wlo*s - g.Pad + kw
					if s == 1 {
						copy(d[wlo:whi], src[iw:])
						continue
					}
					for j := wlo; j < whi; j, iw = j+1, iw+s {
						d[j] = src[iw]
					}
				}
			}
		}
	}
}

// col2im overwrites one example's input gradient dx with the sum of the
// values in columns [off, off+P) of dcol (rows ld apart) onto the input
// positions im2col read them from, row by row of dcol in (c, kh, kw) order
// and then by (oh, ow): overlapping windows add in that fixed order.
func col2im(g Conv2D, dcol []float32, ld, off int, dx []float32) {
	oh, ow := g.OutH(), g.OutW()
	p, s, hw := oh*ow, g.Stride, g.InH*g.InW
	clear(dx[:g.InC*hw])
	r := 0
	for c := 0; c < g.InC; c++ {
		xc := dx[c*hw : (c+1)*hw]
		for kh := 0; kh < g.KH; kh++ {
			hlo, hhi := window(g.InH, oh, s, g.Pad, kh)
			for kw := 0; kw < g.KW; kw++ {
				wlo, whi := window(g.InW, ow, s, g.Pad, kw)
				src := dcol[r*ld+off : r*ld+off+p]
				r++
				if wlo >= whi {
					continue
				}
				for i := hlo; i < hhi; i++ {
					d := src[i*ow : (i+1)*ow]
					row := xc[(i*s-g.Pad+kh)*g.InW:][:g.InW]
					iw := wlo*s - g.Pad + kw
					if s == 1 {
						addVec(d[wlo:whi], row[iw:])
						continue
					}
					for j := wlo; j < whi; j, iw = j+1, iw+s {
						row[iw] += d[j]
					}
				}
			}
		}
	}
}

func fill(x []float32, v float32) {
	for i := range x {
		x[i] = v
	}
}
