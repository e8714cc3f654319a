package secagg_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fleetlearn/fleetlearn/privacy/secagg"
)

// randomRound draws a cohort size, graph and threshold. The complete graph
// is drawn only for small cohorts, where its quadratic cost stays small.
func randomRound(t *testing.T, r *rand.Rand, n int) secagg.Config {
	t.Helper()
	cfg := secagg.Config{Bits: 1 + r.IntN(32), GraphSeed: r.Uint64(), ClipRange: 1}
	switch r.IntN(3) {
	case 0: // default k
	case 1:
		if n <= 40 {
			cfg.K = n - 1
		}
	default:
		cfg.K = 2 + r.IntN(max(1, min(n-2, 60)))
	}
	rd, err := secagg.NewRound(cfg, testTask, 7, n)
	if err != nil {
		t.Fatal(err)
	}
	k := rd.K()
	// Mostly thresholds near the minimum k/2+1, which tolerate the most
	// dropout, sometimes up to k.
	cfg.Threshold = k/2 + 1 + r.IntN(1+(k-k/2-1)/3)
	return cfg
}

// feasiblePlan drops each participant with probability p at a random
// stage, then keeps enough participants to the end that every one has at
// least t neighbours that never drop: the condition under which SecAgg+
// must deliver the survivors' sum.
func feasiblePlan(r *rand.Rand, rd *secagg.Round, p float64) []int {
	plan := make([]int, rd.N())
	for i := range plan {
		if r.Float64() < p {
			plan[i] = 1 + r.IntN(numDropoutChoices-1)
		}
	}
	for id := uint32(1); int(id) <= rd.N(); id++ {
		nb := rd.Neighbours(id)
		r.Shuffle(len(nb), func(i, j int) { nb[i], nb[j] = nb[j], nb[i] })
		stay := 0
		for _, j := range nb {
			if plan[j-1] == stayAll {
				stay++
			}
		}
		for _, j := range nb {
			if stay >= rd.Threshold() {
				break
			}
			if plan[j-1] != stayAll {
				plan[j-1] = stayAll
				stay++
			}
		}
	}
	return plan
}

func TestSumExactUnderDropout(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	sizes := []int{2, 3, 5, 9, 17, 33, 70, 200}
	if testing.Short() {
		sizes = []int{2, 5, 17, 40}
	}
	for i, n := range sizes {
		cfg := randomRound(t, r, n)
		dim := 1 + r.IntN(24)
		c := newCohort(t, cfg, n, dim, uint64(i))
		plan := feasiblePlan(r, c.r, 0.35*r.Float64())
		inputs := randomInputs(r, n, dim, c.r.Bits())
		out := c.run(t, plan, inputs)
		if out.err != nil || len(out.clientErr) > 0 {
			t.Fatalf("n=%d k=%d t=%d bits=%d: server %v, clients %v", n, c.r.K(), c.r.Threshold(), c.r.Bits(), out.err, out.clientErr)
		}
		var want []uint32
		for id := uint32(1); int(id) <= n; id++ {
			if p := plan[id-1]; p == stayAll || p >= dropAfterMasked {
				want = append(want, id)
			}
		}
		if !slices.Equal(out.survivors, want) {
			t.Fatalf("n=%d: survivors %v, want %v", n, out.survivors, want)
		}
		if ws := plainSum(inputs, want, c.r.Bits()); !slices.Equal(out.sum, ws) {
			t.Fatalf("n=%d k=%d t=%d bits=%d plan=%v: sum %v, want %v", n, c.r.K(), c.r.Threshold(), c.r.Bits(), plan, out.sum, ws)
		}
	}
}

// TestTooFewSurvivorsAborts keeps at most t participants past a random
// stage: no participant then has t neighbours left to hold its shares, and
// the round must abort rather than return a sum.
func TestTooFewSurvivorsAborts(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	rounds := 10
	if testing.Short() {
		rounds = 5
	}
	for i := range rounds {
		n := 3 + r.IntN(40)
		cfg := randomRound(t, r, n)
		c := newCohort(t, cfg, n, 4, uint64(100+i))
		stage := 1 + i%(numDropoutChoices-1)
		m := r.IntN(c.r.Threshold() + 1)
		plan := make([]int, n)
		for j := range plan {
			plan[j] = stage
		}
		for _, j := range r.Perm(n)[:m] {
			plan[j] = stayAll
		}
		out := c.run(t, plan, randomInputs(r, n, 4, c.r.Bits()))
		if !errors.Is(out.err, secagg.ErrTooFewSurvivors) || out.sum != nil {
			t.Fatalf("n=%d k=%d t=%d, %d survive stage %d: sum %v, err %v", n, c.r.K(), c.r.Threshold(), m, stage, out.sum, out.err)
		}
		if _, err := c.srv.Result(); !errors.Is(err, secagg.ErrAborted) || !errors.Is(err, secagg.ErrTooFewSurvivors) {
			t.Fatalf("Result after abort: %v", err)
		}
	}
}

// TestThinNeighbourhoodAbortsEarly: when a participant loses k−t+1
// neighbours before they share, its secrets can never be reconstructed.
// The server drops it, and with it everyone who then falls below threshold
// (the t-core of the graph); on the ring graph with the minimal threshold
// that removes everybody, so the round aborts when the share stage closes
// instead of failing at unmasking.
func TestThinNeighbourhoodAbortsEarly(t *testing.T) {
	const n = 80
	c := newCohort(t, secagg.Config{K: 12, GraphSeed: 99}, n, 5, 3)
	plan := make([]int, n)
	nb := c.r.Neighbours(1)
	for _, j := range nb[:len(nb)-c.r.Threshold()+1] {
		plan[j-1] = dropAfterAdvert
	}
	out := c.run(t, plan, randomInputs(rand.New(rand.NewPCG(1, 1)), n, 5, 32))
	if !errors.Is(out.err, secagg.ErrTooFewSurvivors) || c.srv.Stage() != secagg.StageShareKeys {
		t.Fatalf("stage %v: %v", c.srv.Stage(), out.err)
	}
}

// TestMaskedVectorUniform: one participant's masked vector of a constant
// plaintext must look uniform. The chi-square test over the low 8 bits has
// p > 1e-4 on the masked values and rejects the plaintext outright.
func TestMaskedVectorUniform(t *testing.T) {
	const dim = 1 << 16
	for _, bits := range []int{32, 8, 13} {
		c := newCohort(t, secagg.Config{Bits: bits, K: 4, GraphSeed: 5}, 8, dim, uint64(bits))
		input := make([]uint32, dim)
		for i := range input {
			input[i] = 0x5a & uint32(1<<bits-1)
		}
		for _, cl := range c.clients {
			ak, err := cl.Advertise()
			if err != nil {
				t.Fatal(err)
			}
			if err := c.srv.AddAdvertise(ak); err != nil {
				t.Fatal(err)
			}
		}
		mustClose(t, c.srv)
		for _, cl := range c.clients {
			pk, _ := c.srv.PeerKeys(cl.ParticipantID())
			sk, err := cl.ShareKeys(pk)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.srv.AddShares(sk); err != nil {
				t.Fatal(err)
			}
		}
		mustClose(t, c.srv)
		fs, _ := c.srv.ForwardedShares(3)
		m, err := c.clients[2].MaskedInput(fs, input)
		if err != nil {
			t.Fatal(err)
		}
		if p := lowByteChiSquareP(m.Values); p <= 1e-4 {
			t.Errorf("bits=%d: masked low bytes fail uniformity, p = %g", bits, p)
		}
		if p := lowByteChiSquareP(input); p > 1e-100 {
			t.Errorf("bits=%d: chi-square accepts the constant plaintext, p = %g", bits, p)
		}
	}
}

func mustClose(t *testing.T, s *secagg.Server) {
	t.Helper()
	if err := s.CloseStage(); err != nil {
		t.Fatal(err)
	}
}

// lowByteChiSquareP is the p-value of Pearson's chi-square test that the
// low 8 bits of vs are uniform over 256 values.
func lowByteChiSquareP(vs []uint32) float64 {
	var hist [256]float64
	for _, v := range vs {
		hist[v&0xff]++
	}
	e := float64(len(vs)) / 256
	x := 0.0
	for _, o := range hist {
		x += (o - e) * (o - e) / e
	}
	return gammaQ(255/2.0, x/2)
}

// gammaQ is the regularized upper incomplete gamma function Q(a, x), by its
// series below a+1 and its continued fraction above (Numerical Recipes,
// §6.2).
func gammaQ(a, x float64) float64 {
	lg, _ := math.Lgamma(a)
	if x < a+1 {
		sum, del := 1/a, 1/a
		for n := 1; n < 1000; n++ {
			del *= x / (a + float64(n))
			sum += del
			if math.Abs(del) < math.Abs(sum)*1e-15 {
				break
			}
		}
		return 1 - sum*math.Exp(-x+a*math.Log(x)-lg)
	}
	b := x + 1 - a
	c := 1 / 1e-300
	d := 1 / b
	h := d
	for i := 1; i < 1000; i++ {
		an := -float64(i) * (float64(i) - a)
		b += 2
		d = an*d + b
		if math.Abs(d) < 1e-300 {
			d = 1e-300
		}
		c = b + an/c
		if math.Abs(c) < 1e-300 {
			c = 1e-300
		}
		d = 1 / d
		del := d * c
		h *= del
		if math.Abs(del-1) < 1e-15 {
			break
		}
	}
	return math.Exp(-x+a*math.Log(x)-lg) * h
}

func TestGammaQ(t *testing.T) {
	// Chi-square with 2 degrees of freedom: Q(1, x/2) = e^(−x/2).
	for _, x := range []float64{0.5, 2, 10, 40} {
		if got, want := gammaQ(1, x/2), math.Exp(-x/2); math.Abs(got-want) > 1e-12 {
			t.Errorf("Q(1, %g) = %g, want %g", x/2, got, want)
		}
	}
	// The median of chi-square(255) is about 254.3.
	if p := gammaQ(127.5, 254.33/2); math.Abs(p-0.5) > 0.01 {
		t.Errorf("Q at the median = %g", p)
	}
}
