package kernel

// Group normalisation (Wu and He, 2018) over NCHW rows: LayerNorm's
// arithmetic (transformer.go) with the statistics taken per group of
// consecutive channels rather than per row, and gamma and beta per channel.

import (
	"errors"
	"fmt"
	"math"
)

// GroupNormWork is the work GroupNorm does on n examples of values values
// each: 8 per value, as LayerNorm. GroupNormGrad does twice as much, 16 per
// value. It saturates at math.MaxInt64 and is 0 for a negative count.
func GroupNormWork(n, values int) int64 {
	if n <= 0 || values <= 0 {
		return 0
	}
	return satMul(satMul(int64(n), int64(values)), 8)
}

// groupShape checks the groups and channels of x (n × channels·HW) and
// returns HW.
func groupShape(op string, x Mat, groups, channels int) (int, error) {
	if channels < 1 || groups < 1 || channels%groups != 0 {
		return 0, fmt.Errorf("%w: %s: %d groups of %d channels: want groups ≥ 1 dividing channels ≥ 1", ErrShape, op, groups, channels)
	}
	if x.Cols%channels != 0 {
		return 0, fmt.Errorf("%w: %s: x %v does not hold %d channels of equal size", ErrShape, op, x, channels)
	}
	if x.Rows > 0 && x.Cols == 0 {
		return 0, fmt.Errorf("%w: %s: x %v has no values to normalise", ErrShape, op, x)
	}
	// With x.Cols > 0, groups ≤ channels ≤ x.Cols, so n·groups (the
	// statistics' size, checked next) is at most x's checked length.
	return x.Cols / channels, nil
}

// GroupNorm normalises, per example, each of groups groups of
// channels/groups consecutive channels of x (n × channels·HW, NCHW rows) to
// zero mean and unit biased variance over its channels/groups·HW values,
// then scales and shifts channel c by gamma[c] and beta[c] (channels values
// each): y = (x−mean)·rstd·gamma + beta, rstd = 1/sqrt(var+eps). The group
// statistics are saved in mean and rstd (n×groups, row-major) for
// GroupNormGrad. As in LayerNorm, they are accumulated in float64 with a
// two-pass variance and each value is normalised in float64 and rounded
// once. groups must divide channels, channels must divide x's columns and
// eps must be in (0, 1]. y may be x itself, but no output may otherwise
// share memory with an operand or another output.
func GroupNorm(x, gamma, beta, y, mean, rstd Mat, groups, channels int, eps float32) error {
	const op = "group_norm"
	if err := errors.Join(x.check("x"), gamma.check("gamma"), beta.check("beta"), y.check("y"),
		mean.check("mean"), rstd.check("rstd")); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	hw, err := groupShape(op, x, groups, channels)
	if err != nil {
		return err
	}
	n := x.Rows
	if err := errors.Join(sameShape(op, x, y),
		vecLen(op, "gamma", gamma, channels, "one per channel"),
		vecLen(op, "beta", beta, channels, "one per channel"),
		vecLen(op, "mean", mean, n*groups, "one per example and group"),
		vecLen(op, "rstd", rstd, n*groups, "one per example and group")); err != nil {
		return err
	}
	if !(eps > 0 && eps <= 1) {
		return fmt.Errorf("%w: %s: eps %v not in (0, 1]", ErrArgument, op, eps)
	}
	// With y = x, mean and rstd are still checked against x, as y.
	ins := []operand{{"gamma", gamma}, {"beta", beta}}
	if !sameVals(x, y) {
		ins = append(ins, operand{"x", x})
	}
	if err := disjoint(op, []operand{{"y", y}, {"mean", mean}, {"rstd", rstd}}, ins); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	cg := channels / groups
	gv, bv, mv, rv := gamma.Vals(), beta.Vals(), mean.Vals(), rstd.Vals()
	cnt, fe := float64(cg*hw), float64(eps)
	for r := 0; r < n; r++ {
		for g := 0; g < groups; g++ {
			off := r*x.Cols + g*cg*hw
			grp := x.Data[off : off+cg*hw]
			var s float64
			for _, v := range grp {
				s += float64(v)
			}
			mu := s / cnt
			var q float64
			for _, v := range grp {
				dv := float64(v) - mu
				q += float64(dv * dv)
			}
			rs := 1 / math.Sqrt(q/cnt+fe)
			out := y.Data[off : off+cg*hw]
			for k := 0; k < cg; k++ {
				c := g*cg + k
				gc, bc := float64(gv[c]), float64(bv[c])
				for j, v := range grp[k*hw : (k+1)*hw] {
					xh := float64((float64(v) - mu) * rs)
					out[k*hw+j] = float32(float64(xh*gc) + bc)
				}
			}
			mv[r*groups+g], rv[r*groups+g] = float32(mu), float32(rs)
		}
	}
	return nil
}

// GroupNormGrad is the exact gradient of GroupNorm given the mean and rstd
// it saved: per example and group, with g = dy·gamma[c] and
// x̂ = (x−mean)·rstd over the group's M values, it writes
// dx = rstd·(g − Σg/M − x̂·Σ(g·x̂)/M), and adds to dgamma[c] and dbeta[c]
// (channels values each) the float64 sums Σ dy·x̂ and Σ dy over the
// channel's values of each example in turn, rounded once per example. dx
// is overwritten and may be dy itself; dgamma and dbeta accumulate. No
// output may otherwise share memory with an operand or another output.
func GroupNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta Mat, groups, channels int) error {
	const op = "group_norm_grad"
	if err := errors.Join(dy.check("dy"), x.check("x"), gamma.check("gamma"), mean.check("mean"),
		rstd.check("rstd"), dx.check("dx"), dgamma.check("dgamma"), dbeta.check("dbeta")); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	hw, err := groupShape(op, x, groups, channels)
	if err != nil {
		return err
	}
	n := x.Rows
	if err := errors.Join(sameShape(op, dy, x), sameShape(op, dx, x),
		vecLen(op, "gamma", gamma, channels, "one per channel"),
		vecLen(op, "dgamma", dgamma, channels, "one per channel"),
		vecLen(op, "dbeta", dbeta, channels, "one per channel"),
		vecLen(op, "mean", mean, n*groups, "one per example and group"),
		vecLen(op, "rstd", rstd, n*groups, "one per example and group")); err != nil {
		return err
	}
	// With dx = dy, dgamma and dbeta are still checked against dy, as dx.
	ins := []operand{{"x", x}, {"gamma", gamma}, {"mean", mean}, {"rstd", rstd}}
	if !sameVals(dx, dy) {
		ins = append(ins, operand{"dy", dy})
	}
	if err := disjoint(op, []operand{{"dx", dx}, {"dgamma", dgamma}, {"dbeta", dbeta}}, ins); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	cg := channels / groups
	gv, mv, rv, dgv, dbv := gamma.Vals(), mean.Vals(), rstd.Vals(), dgamma.Vals(), dbeta.Vals()
	cnt := float64(cg * hw)
	for r := 0; r < n; r++ {
		for g := 0; g < groups; g++ {
			off := r*x.Cols + g*cg*hw
			xg, dyg, dxg := x.Data[off:off+cg*hw], dy.Data[off:off+cg*hw], dx.Data[off:off+cg*hw]
			mu, rs := float64(mv[r*groups+g]), float64(rv[r*groups+g])
			var s1, s2 float64
			for k := 0; k < cg; k++ {
				c := g*cg + k
				gc := float64(gv[c])
				var sg, sb float64
				for j, v := range xg[k*hw : (k+1)*hw] {
					xh := (float64(v) - mu) * rs
					d := float64(dyg[k*hw+j])
					gx := d * gc // exact: both factors are float32
					s1 += gx
					s2 += float64(gx * xh)
					sg += float64(d * xh)
					sb += d
				}
				dgv[c] += float32(sg)
				dbv[c] += float32(sb)
			}
			m1, m2 := s1/cnt, s2/cnt
			// Each dx value reads only its own dy and x, so dx may be dy.
			for k := 0; k < cg; k++ {
				gc := float64(gv[g*cg+k])
				for j, v := range xg[k*hw : (k+1)*hw] {
					xh := (float64(v) - mu) * rs
					gx := float64(dyg[k*hw+j]) * gc
					dxg[k*hw+j] = float32(rs * (gx - m1 - float64(xh*m2)))
				}
			}
		}
	}
	return nil
}
