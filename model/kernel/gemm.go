package kernel

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Gemm computes C = alpha·op(A)·op(B) + beta·C where op transposes when asked.
//
// Every element is computed in one fixed order whatever the CPU, the blocking
// or the number of threads: c = beta·c (or 0 when beta is 0: C is then not
// read), then for l = 0 … k-1, c = fma(alpha·a[i,l], b[l,j], c) with each fma
// rounded once to float32 and alpha·a rounded to float32 (alpha = 1 leaves a
// unchanged). The SIMD microkernels and the pure-Go one all follow it, so a
// product has the same bits on every machine and on any number of threads.
func Gemm(transA, transB bool, alpha float32, a, b Mat, beta float32, c Mat) error {
	return GemmCheck(transA, transB, alpha, a, b, beta, c, nil)
}

// blockWork bounds the work between two calls of GemmCheck's check: about
// 2^25 multiply-adds, well under a millisecond on a SIMD core and tens of
// milliseconds on the pure-Go path.
const blockWork = 1 << 25

// GemmCheck is Gemm calling check (if not nil) before each block of work and
// stopping with its error; C is then partly written. check is never called
// concurrently.
func GemmCheck(transA, transB bool, alpha float32, a, b Mat, beta float32, c Mat, check func() error) error {
	for _, m := range []struct {
		n string
		m Mat
	}{{"A", a}, {"B", b}, {"C", c}} {
		if err := m.m.check(m.n); err != nil {
			return fmt.Errorf("gemm: %w", err)
		}
	}
	m, k := a.Rows, a.Cols
	if transA {
		m, k = k, m
	}
	kb, n := b.Rows, b.Cols
	if transB {
		kb, n = n, kb
	}
	if k != kb || c.Rows != m || c.Cols != n {
		return fmt.Errorf("%w: gemm: op(A) %dx%d, op(B) %dx%d, C %v", ErrShape, m, k, kb, n, c)
	}
	if m == 0 || n == 0 {
		return nil
	}
	if check != nil {
		if err := check(); err != nil {
			return fmt.Errorf("gemm: %w", err)
		}
	}
	g := gemmOp{
		transA: transA, transB: transB, m: m, n: n, k: k, alpha: alpha,
		a: a.Data, lda: a.Cols, b: b.Data, ldb: b.Cols, c: c.Data, ldc: c.Cols,
		check: check,
	}
	// beta·c first (Scale: one rounded product per value, zero for beta 0),
	// so the k products then continue the same fma chain on every block and
	// every path. With beta 0 and products to come, the microkernels start
	// from zero and C is not read at all.
	if beta != 1 && (beta != 0 || k == 0) {
		Scale(beta, c)
	}
	g.load = beta != 0
	if k == 0 {
		return nil
	}
	if err := g.run(activeKernel(), min(Threads(), runtime.GOMAXPROCS(0))); err != nil {
		return fmt.Errorf("gemm: %w", err)
	}
	return nil
}

// GemmFLOPs is the work Gemm does for an m×k by k×n product.
func GemmFLOPs(m, n, k int) int64 { return 2 * int64(m) * int64(n) * int64(k) }

// fma32 is fma(a, b, c) rounded once to float32, as a SIMD fused multiply-add
// computes it. The product of two float32 is exact in float64; the sum is
// rounded to odd in float64 (53 ≥ 24+2 bits), after which the one rounding to
// float32 is the correctly rounded result.
func fma32(a, b, c float32) float32 {
	p := float64(a) * float64(b)
	cc := float64(c)
	s := p + cc
	// TwoSum: s + e is exactly p + c.
	bb := s - p
	e := (p - (s - bb)) + (cc - bb)
	if (e > 0 || e < 0) && math.Float64bits(s)&1 == 0 {
		bits := math.Float64bits(s)
		if (e > 0) == (s > 0) {
			bits++
		} else {
			bits--
		}
		s = math.Float64frombits(bits)
	}
	return float32(s)
}

// microkernel computes an mr×nr tile of C from packed panels: for kc steps p,
// c[i,j] = fma(a[p·mr+i], b[p·nr+j], c[i,j]), starting from the tile's values
// when load is set and from zero otherwise. c has row stride ldc.
type microkernel struct {
	name   string
	mr, nr int
	// kc, mc and nc are the cache blocks: a kc×nr panel of B stays in L1 while
	// the mc×kc block of A is in L2.
	kc, mc, nc int
	run        func(kc int, a, b, c *float32, ldc int, load bool)
	// runB, where a kernel has it, is run reading B unpacked: step p's nr
	// values start at b + p·ldb. Products with few rows of A use it, as
	// packing B would cost them as much as the arithmetic.
	runB func(kc int, a, b *float32, ldb int, c *float32, ldc int, load bool)
	// fewer are the same kernel for fewer rows (ascending, each < mr),
	// reading the same mr-tall packed A: a product's last sliver runs the
	// smallest that covers it rather than computing rows of padding.
	fewer []tile
}

// tile is a microkernel variant for rows rows of C.
type tile struct {
	rows int
	run  func(kc int, a, b, c *float32, ldc int, load bool)
	runB func(kc int, a, b *float32, ldb int, c *float32, ldc int, load bool)
}

var (
	kernels   []microkernel // usable on this CPU, fastest first; the last is pure Go
	kernelSel atomic.Int32  // index into kernels
	threads   atomic.Int32
)

func init() {
	kernels = append(simdKernels(), microkernel{
		name: "go", mr: 4, nr: 4, kc: 256, mc: 64, nc: 1024, run: goKernel,
	})
	threads.Store(int32(runtime.NumCPU()))
}

func activeKernel() microkernel { return kernels[kernelSel.Load()] }

// KernelName names the GEMM microkernel in use: avx512, avx2+fma, neon or
// go.
func KernelName() string { return activeKernel().name }

// Kernels names the GEMM microkernels this CPU can run, fastest first; the
// last is always "go", the portable one.
func Kernels() []string {
	names := make([]string, len(kernels))
	for i, k := range kernels {
		names[i] = k.name
	}
	return names
}

// UseKernel selects the GEMM microkernel every later product runs, by a
// name from Kernels, and returns the one it replaces; "go" also runs the
// element-wise kernels in pure Go, any other name their SIMD code. Results
// do not depend on the choice; tests and benchmarks use it to compare the
// paths. Call it while no kernel runs.
func UseKernel(name string) (string, error) {
	for i, k := range kernels {
		if k.name == name {
			if name == "go" {
				vec = &vecImpls[0]
			} else {
				vec = &vecImpls[len(vecImpls)-1]
			}
			return kernels[kernelSel.Swap(int32(i))].name, nil
		}
	}
	return "", fmt.Errorf("%w: gemm kernel %q is not one this CPU runs (%v)", ErrArgument, name, Kernels())
}

// SetThreads bounds the threads one Gemm call uses (at least 1); the agent
// and the pool worker set it from the operator's CPU budget. Results do not
// depend on it. It returns the previous bound.
func SetThreads(n int) int {
	return int(threads.Swap(int32(max(1, min(n, 1024)))))
}

// Threads is the bound SetThreads set, NumCPU by default.
func Threads() int { return int(threads.Load()) }

// goKernel is the portable microkernel: 4×4, fma32 per step.
func goKernel(kc int, a, b, c *float32, ldc int, load bool) {
	const mr, nr = 4, 4
	var acc [mr * nr]float32
	cs := unsafeSlice(c, (mr-1)*ldc+nr)
	if load {
		for i := range mr {
			copy(acc[i*nr:(i+1)*nr], cs[i*ldc:i*ldc+nr])
		}
	}
	as, bs := unsafeSlice(a, kc*mr), unsafeSlice(b, kc*nr)
	for p := range kc {
		ap, bp := as[p*mr:p*mr+mr], bs[p*nr:p*nr+nr]
		for i, av := range ap {
			row := acc[i*nr : i*nr+nr]
			for j, bv := range bp {
				row[j] = fma32(av, bv, row[j])
			}
		}
	}
	for i := range mr {
		copy(cs[i*ldc:i*ldc+nr], acc[i*nr:(i+1)*nr])
	}
}

// gemmOp is one validated product.
type gemmOp struct {
	transA, transB bool
	m, n, k        int
	alpha          float32
	a, b, c        []float32
	lda, ldb, ldc  int
	load           bool // C holds beta·C to continue from
	directB        bool // full slivers of B are read in place (microkernel.runB)
	check          func() error
}

// directRowSlivers is the most mr-tall slivers of A for which B is read in
// place rather than packed.
const directRowSlivers = 4

// workerShare is the least work (multiply-adds) a thread is given: below
// it, handing a share to another thread costs more than it saves. At 2^20
// the products of an MLP step on a batch of 32 (3.2 million multiply-adds)
// were split in two, and the epoch of BenchmarkEpoch took 67 ms on two
// threads against 50–59 ms on one.
const workerShare = 1 << 21

// run computes the product on up to nthreads threads. Each thread gets its
// own rows of C (or, when C is wider than tall, its own columns) and runs
// the whole blocked product on them with its own panels: no thread waits
// for another until the end, at the price of packing the shared operand
// once per thread. Every element is still one fma chain, whoever computes it.
func (g *gemmOp) run(kn microkernel, nthreads int) error {
	work := int64(g.m) * int64(g.n) * int64(g.k)
	byRows := g.m >= g.n
	dim, unit := g.n, kn.nr
	if byRows {
		dim, unit = g.m, kn.mr
	}
	workers := int(min(int64(nthreads), work/workerShare, int64(ceilDiv(dim, unit))))
	if workers <= 1 {
		return g.serial(kn, g.check)
	}
	var (
		mu      sync.Mutex
		stopErr error
	)
	// The check runs on one thread at a time; after an error every thread
	// stops at its next block.
	check := func() error {
		mu.Lock()
		defer mu.Unlock()
		if stopErr == nil && g.check != nil {
			stopErr = g.check()
		}
		return stopErr
	}
	units := ceilDiv(dim, unit)
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := units*w/workers*unit, min(units*(w+1)/workers*unit, dim)
		sub := *g
		if byRows {
			sub.m = hi - lo
			if g.transA {
				sub.a = g.a[lo:]
			} else {
				sub.a = g.a[lo*g.lda:]
			}
			sub.c = g.c[lo*g.ldc:]
		} else {
			sub.n = hi - lo
			if g.transB {
				sub.b = g.b[lo*g.ldb:]
			} else {
				sub.b = g.b[lo:]
			}
			sub.c = g.c[lo:]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = sub.serial(kn, check) // the error, if any, is stopErr
		}()
	}
	wg.Wait()
	return stopErr
}

// serial is the blocked product on one thread: for each nc-wide column
// block and kc-deep slice of k, B's panel is packed once, then each mc-tall
// block of A is packed and multiplied into its rows of C, check (if any)
// called before each.
func (g *gemmOp) serial(kn microkernel, check func() error) error {
	mr, nr := kn.mr, kn.nr
	kc := min(kn.kc, g.k)
	nc := min(kn.nc, roundUp(g.n, nr))
	mc := min(kn.mc, roundUp(g.m, mr))
	// Keep the work between checks near blockWork.
	if per := int64(mc) * int64(nc) * int64(kc); per > blockWork {
		nc = max(nr, int(int64(blockWork)/(int64(mc)*int64(kc)))/nr*nr)
	}
	// B is read in place when it is not transposed and each of its values
	// meets few rows of A.
	g.directB = kn.runB != nil && !g.transB && ceilDiv(g.m, mr) <= directRowSlivers
	bp := getPanel(kc * nc)
	defer putPanel(bp)
	ap := getPanel(mc*kc + edgeLen)
	defer putPanel(ap)
	a, edge := (*ap)[:mc*kc], (*ap)[mc*kc:]
	for jc := 0; jc < g.n; jc += nc {
		ncb := min(nc, g.n-jc)
		for pc := 0; pc < g.k; pc += kc {
			kcb := min(kc, g.k-pc)
			g.packPanel(*bp, pc, kcb, jc, ncb, nr)
			for ic := 0; ic < g.m; ic += mc {
				if check != nil {
					if err := check(); err != nil {
						return err
					}
				}
				g.block(kn, a, *bp, edge, ic, min(mc, g.m-ic), pc, kcb, jc, ncb, g.load || pc > 0)
			}
		}
	}
	return nil
}

// edgeLen holds a partial tile: the largest mr·nr of any kernel.
const edgeLen = 16 * 64

// packPanel packs the kc×nc panel of B at (pc, jc), or, when B is read in
// place, only its last partial sliver.
func (g *gemmOp) packPanel(bp []float32, pc, kcb, jc, ncb, nr int) {
	if !g.directB {
		g.packB(bp, pc, kcb, jc, ncb, nr)
		return
	}
	if full := ncb / nr * nr; full < ncb {
		g.packB(bp[full*kcb:], pc, kcb, jc+full, ncb-full, nr)
	}
}

// block multiplies rows ic… of A (packed into ap) by the packed panel bp into
// C's mcb×ncb block at (ic, jc); edge (edgeLen values) holds partial tiles.
func (g *gemmOp) block(kn microkernel, ap, bp, edge []float32, ic, mcb, pc, kcb, jc, ncb int, load bool) {
	mr, nr := kn.mr, kn.nr
	g.packA(ap, ic, mcb, pc, kcb, mr)
	for jr := 0; jr < ncb; jr += nr {
		nb := min(nr, ncb-jr)
		bptr := &bp[jr*kcb]
		for ir := 0; ir < mcb; ir += mr {
			mb := min(mr, mcb-ir)
			aptr := &ap[ir*kcb]
			ci := (ic+ir)*g.ldc + jc + jr
			run, runB, rows := kn.run, kn.runB, mr
			if mb < mr {
				for _, f := range kn.fewer {
					if f.rows >= mb {
						run, runB, rows = f.run, f.runB, f.rows
						break
					}
				}
			}
			// Full slivers of B read in place start at B's row pc, column
			// jc+jr; the others are packed.
			var bIn *float32
			if g.directB && nb == nr {
				bIn = &g.b[pc*g.ldb+jc+jr]
			}
			if mb == rows && nb == nr {
				tileRun(run, runB, kcb, aptr, bptr, bIn, g.ldb, &g.c[ci], g.ldc, load)
				continue
			}
			// A partial tile goes through a full one in the edge buffer.
			if load {
				for i := range mb {
					copy(edge[i*nr:i*nr+nb], g.c[ci+i*g.ldc:ci+i*g.ldc+nb])
				}
			}
			tileRun(run, runB, kcb, aptr, bptr, bIn, g.ldb, &edge[0], nr, load)
			for i := range mb {
				copy(g.c[ci+i*g.ldc:ci+i*g.ldc+nb], edge[i*nr:i*nr+nb])
			}
		}
	}
}

// tileRun runs one tile: with runB on B in place (bIn, ldb apart) when bIn
// is set, else with run on the packed sliver bp.
func tileRun(run func(kc int, a, b, c *float32, ldc int, load bool),
	runB func(kc int, a, b *float32, ldb int, c *float32, ldc int, load bool),
	kc int, a, bp, bIn *float32, ldb int, c *float32, ldc int, load bool) {
	if bIn != nil {
		runB(kc, a, bIn, ldb, c, ldc, load)
		return
	}
	run(kc, a, bp, c, ldc, load)
}

// packA writes rows ic…ic+mcb of alpha·op(A), columns pc…pc+kcb, as mr-tall
// slivers: sliver s holds, for each p, the mr values a[ic+s·mr+i, pc+p],
// zero past the last row.
func (g *gemmOp) packA(ap []float32, ic, mcb, pc, kcb, mr int) {
	for s := 0; s*mr < mcb; s++ {
		dst := ap[s*mr*kcb : (s+1)*mr*kcb]
		r0 := ic + s*mr
		rows := min(mr, mcb-s*mr)
		if g.transA {
			// op(A)[r, l] = A[l, r]: the mr values of a step are adjacent in A.
			copySteps(dst, mr, rows, kcb, g.a[pc*g.lda+r0:], g.lda)
		} else {
			interleave(dst, mr, rows, kcb, g.a[r0*g.lda+pc:], g.lda)
		}
		if g.alpha != 1 {
			for i, v := range dst {
				dst[i] = float32(g.alpha * v)
			}
		}
	}
}

// packB writes op(B)'s rows pc…pc+kcb, columns jc…jc+ncb, as nr-wide
// slivers: sliver s holds, for each p, the nr values b[pc+p, jc+s·nr+j],
// zero past the last column.
func (g *gemmOp) packB(bp []float32, pc, kcb, jc, ncb, nr int) {
	for s := 0; s*nr < ncb; s++ {
		dst := bp[s*nr*kcb : (s+1)*nr*kcb]
		cols := min(nr, ncb-s*nr)
		j0 := jc + s*nr
		if !g.transB {
			copySteps(dst, nr, cols, kcb, g.b[pc*g.ldb+j0:], g.ldb)
			continue
		}
		// op(B)[l, j] = B[j, l]
		interleave(dst, nr, cols, kcb, g.b[j0*g.ldb+pc:], g.ldb)
	}
}

// copySteps writes dst[p·w+i] = src[p·ld+i] for i < rows and zeros for
// rows ≤ i < w, for n steps: the half of packing that needs no transpose.
// Whole steps of the kernels' widths copy as arrays, which the compiler
// moves in registers rather than through a call to memmove per step.
func copySteps(dst []float32, w, rows, n int, src []float32, ld int) {
	if rows == w {
		switch w {
		case 4:
			copyArrays[[4]float32](dst, n, src, ld)
			return
		case 6:
			copyArrays[[6]float32](dst, n, src, ld)
			return
		case 8:
			copyArrays[[8]float32](dst, n, src, ld)
			return
		case 12:
			copyArrays[[12]float32](dst, n, src, ld)
			return
		case 16:
			copyArrays[[16]float32](dst, n, src, ld)
			return
		case 32:
			copyArrays[[32]float32](dst, n, src, ld)
			return
		}
	}
	for p := range n {
		d := dst[p*w : p*w+w]
		copy(d, src[p*ld:p*ld+rows])
		clear(d[rows:])
	}
}

// copyArrays copies n steps of len(A) values, ld apart in src, to dst.
func copyArrays[A [4]float32 | [6]float32 | [8]float32 | [12]float32 | [16]float32 | [32]float32](dst []float32, n int, src []float32, ld int) {
	var a A
	w := len(a)
	if n == 0 {
		return
	}
	// The last step's bounds cover every earlier one.
	_ = dst[(n-1)*w+w-1]
	_ = src[(n-1)*ld+w-1]
	for p := range n {
		*(*A)(unsafe.Pointer(&dst[p*w])) = *(*A)(unsafe.Pointer(&src[p*ld]))
	}
}

// interleave4Go is interleave4 in Go.
func interleave4Go(dst []float32, w, n int, src []float32, ld int) {
	if n == 0 {
		return
	}
	r0 := src[:n]
	r1 := src[ld : ld+n][:len(r0)]
	r2 := src[2*ld : 2*ld+n][:len(r0)]
	r3 := src[3*ld : 3*ld+n][:len(r0)]
	for p := range r0 {
		d := dst[p*w : p*w+4 : p*w+4]
		d[0], d[1], d[2], d[3] = r0[p], r1[p], r2[p], r3[p]
	}
}

// interleave writes rows values of each of n steps as dst[p·w+i] = src[i·ld+p]
// for i < rows, and zeros for rows ≤ i < w: the transposing half of packing.
// Four rows go together so that each pass over a step writes adjacent values.
func interleave(dst []float32, w, rows, n int, src []float32, ld int) {
	dst = dst[:w*n]
	i := 0
	for ; i+4 <= rows; i += 4 {
		interleave4(dst[i:], w, n, src[i*ld:], ld)
	}
	for ; i < rows; i++ {
		for p, v := range src[i*ld : i*ld+n] {
			dst[p*w+i] = v
		}
	}
	if rows < w {
		for p := range n {
			clear(dst[p*w+rows : p*w+w])
		}
	}
}

var panels sync.Pool

func getPanel(n int) *[]float32 {
	if p, ok := panels.Get().(*[]float32); ok && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	// Room past the end lets SIMD kernels read a whole vector at the tail.
	s := make([]float32, n, n+64)
	return &s
}

func putPanel(p *[]float32) { panels.Put(p) }

func ceilDiv(a, b int) int { return (a + b - 1) / b }
func roundUp(a, b int) int { return ceilDiv(a, b) * b }

func unsafeSlice(p *float32, n int) []float32 { return unsafe.Slice(p, n) }
