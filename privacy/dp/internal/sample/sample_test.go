package sample

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"math"
	"testing"
)

// ctr is a deterministic AES-CTR Rand for tests.
type ctr struct {
	s   cipher.Stream
	buf [8]byte
}

func newCTR(seed byte) *ctr {
	key := make([]byte, 32)
	key[0] = seed
	b, _ := aes.NewCipher(key)
	return &ctr{s: cipher.NewCTR(b, make([]byte, 16))}
}

func (c *ctr) Uint64() uint64 {
	c.buf = [8]byte{}
	c.s.XORKeyStream(c.buf[:], c.buf[:])
	return binary.LittleEndian.Uint64(c.buf[:])
}

// moments returns the mean, variance and fourth central moment of a pmf
// on [-m, m] given by logp.
func moments(m int, logp func(k float64) float64) (mean, variance, m4 float64) {
	var z float64
	p := make([]float64, 2*m+1)
	for k := -m; k <= m; k++ {
		p[k+m] = math.Exp(logp(float64(k)))
		z += p[k+m]
	}
	for k := -m; k <= m; k++ {
		mean += float64(k) * p[k+m] / z
	}
	for k := -m; k <= m; k++ {
		d := float64(k) - mean
		variance += d * d * p[k+m] / z
		m4 += d * d * d * d * p[k+m] / z
	}
	return mean, variance, m4
}

// checkMoments compares sample mean and variance with exact values within
// 5 standard errors.
func checkMoments(t *testing.T, name string, xs []float64, mean, variance, m4 float64) {
	t.Helper()
	n := float64(len(xs))
	var sm, sv float64
	for _, x := range xs {
		sm += x
	}
	sm /= n
	for _, x := range xs {
		sv += (x - sm) * (x - sm)
	}
	sv /= n - 1
	seMean := math.Sqrt(variance / n)
	seVar := math.Sqrt((m4 - variance*variance) / n)
	if math.Abs(sm-mean) > 5*seMean {
		t.Errorf("%s: mean %.6g, want %.6g ± 5·%.3g", name, sm, mean, seMean)
	}
	if math.Abs(sv-variance) > 5*seVar {
		t.Errorf("%s: variance %.6g, want %.6g ± 5·%.3g", name, sv, variance, seVar)
	}
}

func TestDiscreteGaussianMoments(t *testing.T) {
	for _, s2 := range []float64{0.25, 1, 10, 1000} {
		mean, variance, m4 := moments(int(40*math.Sqrt(s2))+20, func(k float64) float64 { return -k * k / (2 * s2) })
		switch s2 {
		case 1:
			if math.Abs(variance-0.99999979) > 1e-8 {
				t.Fatalf("exact variance at σ²=1 is %.10f", variance)
			}
		case 0.25:
			if math.Abs(variance-0.21501) > 1e-5 {
				t.Fatalf("exact variance at σ²=0.25 is %.10f", variance)
			}
		}
		g := NewDiscreteGaussian(s2)
		r := newCTR(byte(s2))
		xs := make([]float64, 200000)
		for i := range xs {
			xs[i] = float64(g.Sample(r))
		}
		checkMoments(t, "discrete gaussian", xs, mean, variance, m4)
	}
}

func TestSkellamMoments(t *testing.T) {
	for _, v := range []float64{0.5, 4, 30, 1e4} {
		// Difference of two Poisson(v/2): mean 0, variance v, fourth central
		// moment v + 3v².
		r := newCTR(byte(v))
		xs := make([]float64, 200000)
		for i := range xs {
			xs[i] = float64(Skellam(r, v))
		}
		checkMoments(t, "skellam", xs, 0, v, v+3*v*v)
	}
}

func TestPoissonMoments(t *testing.T) {
	for _, l := range []float64{0.3, 9.5, 10, 250, 1e6} {
		r := newCTR(byte(l))
		xs := make([]float64, 100000)
		for i := range xs {
			xs[i] = float64(Poisson(r, l))
		}
		// Poisson: mean λ, variance λ, fourth central moment λ + 3λ².
		checkMoments(t, "poisson", xs, l, l, l+3*l*l)
	}
}

func TestUniformIsUnbiased(t *testing.T) {
	r := newCTR(7)
	const n, draws = 6, 600000
	var counts [n]int
	for range draws {
		counts[Uniform(r, n)]++
	}
	for i, c := range counts {
		if math.Abs(float64(c)-draws/n) > 5*math.Sqrt(draws*(1.0/n)*(1-1.0/n)) {
			t.Errorf("value %d drawn %d times of %d", i, c, draws)
		}
	}
}

func TestBernoulliExpNeg(t *testing.T) {
	r := newCTR(9)
	for _, g := range [][2]uint64{{0, 1}, {1, 3}, {1, 1}, {7, 8}} {
		const draws = 200000
		hits := 0
		for range draws {
			if bernoulliExpNegSmall(r, g[0], g[1]) {
				hits++
			}
		}
		p := math.Exp(-float64(g[0]) / float64(g[1]))
		if math.Abs(float64(hits)/draws-p) > 5*math.Sqrt(p*(1-p)/draws)+1e-12 {
			t.Errorf("Bernoulli(exp(−%d/%d)) rate %v, want %v", g[0], g[1], float64(hits)/draws, p)
		}
	}
}
