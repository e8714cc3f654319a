package pld

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
)

var update = flag.Bool("update", false, "regenerate testdata/reference_eps.tsv from the reference implementation")

const tablePath = "testdata/reference_eps.tsv"

// The table's grid, plus the two dp_accounting figures' settings.
var (
	tableQ      = []float64{0.001, 0.01, 0.1, 0.5, 1}
	tableSigma  = []float64{0.5, 1, 2, 3}
	tableSteps  = []int{1, 10, 100, 1000, 10000}
	tableDeltas = []float64{1e-5, 1e-6}
	tableExtra  = []struct {
		q, sigma float64
		steps    int
	}{{0.001, 1.5, 10000}}
)

const tableHeader = `# Reference ε of pld.Epsilon's grid: count steps of the Gaussian mechanism
# with noise multiplier sigma on a Poisson sample of rate q, add-or-remove
# adjacency, at delta. Computed by the independent reference in
# reference_test.go, not by pld:
#   kind=exact    lower = upper = the closed form (q = 1: Balle and Wang
#                 2018) or the exact root of one step's hockey-stick
#                 divergence, by bisection;
#   kind=bracket  lower: optimistic PLD (post-processing into bins of
#                 likelihood ratio ≥ e^{ε_j}, rounded down), a lower bound
#                 on the true ε; upper: connect-the-dots PLD, an upper
#                 bound; both on grid spacing step, composed by FFT over a
#                 Chernoff window; the true ε lies in [lower, upper] up to
#                 floating-point rounding in the FFT (no bracket is wider
#                 than 6.4e-5 relative).
# Regenerate (a few minutes):
#   go test ./privacy/dp/internal/pld -run TestReferenceTable -update
`

func tableRows(t *testing.T) []refRow {
	t.Helper()
	f, err := os.Open(tablePath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []refRow
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "q\t") {
			continue
		}
		fs := strings.Split(line, "\t")
		if len(fs) != 8 {
			t.Fatalf("%s: %q: %d fields", tablePath, line, len(fs))
		}
		var r refRow
		num := func(s string) float64 {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", tablePath, line, err)
			}
			return v
		}
		r.q, r.sigma, r.steps, r.delta = num(fs[0]), num(fs[1]), int(num(fs[2])), num(fs[3])
		r.kind, r.lower, r.upper, r.step = fs[4], num(fs[5]), num(fs[6]), num(fs[7])
		rows = append(rows, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rows
}

func writeTable(t *testing.T) {
	type cell struct {
		q, sigma float64
		steps    int
	}
	var cells []cell
	for _, q := range tableQ {
		for _, s := range tableSigma {
			for _, n := range tableSteps {
				cells = append(cells, cell{q, s, n})
			}
		}
	}
	for _, e := range tableExtra {
		cells = append(cells, cell{e.q, e.sigma, e.steps})
	}
	out := make([][]refRow, len(cells))
	errs := make([]error, len(cells))
	var wg sync.WaitGroup
	next := make(chan int)
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for i := range next {
				c := cells[i]
				out[i], errs[i] = refRows(c.q, c.sigma, c.steps, tableDeltas)
			}
		})
	}
	for i := range cells {
		next <- i
	}
	close(next)
	wg.Wait()
	var b strings.Builder
	b.WriteString(tableHeader)
	b.WriteString("q\tsigma\tsteps\tdelta\tkind\tlower\tupper\tstep\n")
	for i, rs := range out {
		if errs[i] != nil {
			t.Fatalf("%+v: %v", cells[i], errs[i])
		}
		for _, r := range rs {
			fmt.Fprintf(&b, "%g\t%g\t%d\t%g\t%s\t%.15g\t%.15g\t%.3g\n", r.q, r.sigma, r.steps, r.delta, r.kind, r.lower, r.upper, r.step)
		}
	}
	if err := os.MkdirAll(filepath.Dir(tablePath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tablePath, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// shortRow reports whether a table row is cheap enough for -short (also
// under -race): the closed forms, and a few compositions.
func shortRow(r refRow) bool {
	if r.kind == "exact" {
		return true
	}
	return r.delta == 1e-5 && r.steps <= 100 && (r.q == 0.01 && r.sigma == 2 || r.q == 0.1 && r.sigma == 1)
}

// Against the stored reference: never below the lower bound (that would be
// optimistic), and at most 0.1% above it, which is at most 0.1% above the
// true ε and so above dp_accounting's pessimistic estimate.
func TestReferenceTable(t *testing.T) {
	if *update {
		writeTable(t)
	}
	rows := tableRows(t)
	if len(rows) < 2*len(tableQ)*len(tableSigma)*len(tableSteps) {
		t.Fatalf("%s: %d rows", tablePath, len(rows))
	}
	worst, worstRow := 0.0, refRow{}
	for _, r := range rows {
		if testing.Short() && !shortRow(r) {
			continue
		}
		if !(r.lower <= r.upper) {
			t.Errorf("%+v: reference bracket inverted", r)
		}
		got, err := Epsilon([]Event{{Q: r.q, Sigma: r.sigma, Count: r.steps}}, r.delta, 1e-4)
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		if got < r.lower {
			t.Errorf("q=%g σ=%g T=%d δ=%g: ε %.10g below the true ε's lower bound %.10g", r.q, r.sigma, r.steps, r.delta, got, r.lower)
		}
		if got > 1.001*r.lower {
			t.Errorf("q=%g σ=%g T=%d δ=%g: ε %.10g more than 0.1%% above the lower bound %.10g (upper %.10g)", r.q, r.sigma, r.steps, r.delta, got, r.lower, r.upper)
		}
		if r.lower > 0 && got/r.lower-1 > worst {
			worst, worstRow = got/r.lower-1, r
		}
	}
	t.Logf("largest excess over the lower bound: %.2e at q=%g σ=%g T=%d δ=%g", worst, worstRow.q, worstRow.sigma, worstRow.steps, worstRow.delta)
}
