package cli_test

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/cli"
	"github.com/fleetlearn/fleetlearn/privacy/dp"
)

// lastField parses the number that follows key on the output's last line.
func lastField(t *testing.T, out, key string) float64 {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(f) < 2 || f[0] != key {
		t.Fatalf("last line %q does not start with %q", lines[len(lines)-1], key)
	}
	v, err := strconv.ParseFloat(f[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestDPEpsilon(t *testing.T) {
	for _, c := range []struct {
		args []string
		want float64
		tol  float64
	}{
		{[]string{"--q", "0.0025", "--noise-multiplier", "1.3", "--steps", "6000", "--delta", "1e-5"}, 0.7242234026109595, 1e-6},
		{[]string{"--q", "0.04", "--noise-multiplier", "1.5", "--steps", "2250", "--delta", "1e-5", "--orders", "opacus"}, 7.32911117143, 1e-6},
		// PLD is tighter than RDP's 0.724.
		{[]string{"--q", "0.0025", "--noise-multiplier", "1.3", "--steps", "6000", "--delta", "1e-5", "--accountant", "pld"}, 0.66, 0.05},
	} {
		out, err := run(t, "", append([]string{"dp", "epsilon"}, c.args...)...)
		if err != nil {
			t.Fatal(err)
		}
		if got := lastField(t, out, "epsilon"); math.Abs(got-c.want) > c.tol*c.want {
			t.Errorf("%v: epsilon %v, want %v\n%s", c.args, got, c.want, out)
		}
	}
}

func TestDPNoise(t *testing.T) {
	out, err := run(t, "", "dp", "noise", "--target-epsilon", "2", "--q", "0.01", "--steps", "1000", "--delta", "1e-5")
	if err != nil {
		t.Fatal(err)
	}
	z := lastField(t, out, "noise-multiplier")
	eps, err := dp.Epsilon([]dp.Event{{Q: 0.01, NoiseMultiplier: z, Steps: 1000}}, 1e-5)
	if err != nil || eps > 2 || eps < 1.99 {
		t.Errorf("noise multiplier %v gives ε %v (%v)\n%s", z, eps, err, out)
	}
}

func TestDPRejectsBadFlags(t *testing.T) {
	base := []string{"--q", "0.01", "--steps", "100", "--delta", "1e-5"}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"q above one", []string{"dp", "epsilon", "--noise-multiplier", "1", "--q", "1.5", "--steps", "10", "--delta", "1e-5"}},
		{"zero sigma", append([]string{"dp", "epsilon", "--noise-multiplier", "0"}, base...)},
		{"NaN sigma", append([]string{"dp", "epsilon", "--noise-multiplier", "NaN"}, base...)},
		{"delta one", []string{"dp", "epsilon", "--noise-multiplier", "1", "--q", "0.1", "--steps", "10", "--delta", "1"}},
		{"accountant", append([]string{"dp", "epsilon", "--noise-multiplier", "1", "--accountant", "moments"}, base...)},
		{"orders", append([]string{"dp", "epsilon", "--noise-multiplier", "1", "--orders", "all"}, base...)},
		{"negative target", append([]string{"dp", "noise", "--target-epsilon", "-1"}, base...)},
	} {
		if _, err := run(t, "", c.args...); !errors.Is(err, cli.ErrUsage) || !errors.Is(err, dp.ErrInvalid) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	if _, err := run(t, "", "dp", "epsilon", "--q", "0.1"); err == nil || !strings.Contains(err.Error(), "required") {
		t.Errorf("missing flags: %v", err)
	}
}

// TestDPCorrelatedMechanisms: dp epsilon reproduces TF-Privacy's tree
// figure, dp noise inverts dp epsilon for the tree and BLT mechanisms,
// independent noise under a participation cap composes over the cap's
// rounds, and flags that do not fit a mechanism are refused.
func TestDPCorrelatedMechanisms(t *testing.T) {
	out, err := run(t, "", "dp", "epsilon", "--mechanism", "tree", "--noise-multiplier", "1.13", "--rounds", "1600",
		"--delta", "1e-6", "--orders", "opacus")
	if err != nil {
		t.Fatal(err)
	}
	if got := lastField(t, out, "epsilon"); math.Abs(got-18.71)/18.71 > 1e-3 {
		t.Errorf("tree, 1,600 rounds at noise 1.13: epsilon %v, want 18.71\n%s", got, out)
	}
	limits := []string{"--rounds", "1000", "--max-participations", "4", "--min-separation", "250", "--delta", "1e-6"}
	for _, mech := range []string{"tree", "blt"} {
		out, err := run(t, "", append([]string{"dp", "noise", "--mechanism", mech, "--target-epsilon", "2"}, limits...)...)
		if err != nil {
			t.Fatal(err)
		}
		z := lastField(t, out, "noise-multiplier")
		back, err := run(t, "", append([]string{"dp", "epsilon", "--mechanism", mech, "--noise-multiplier", strconv.FormatFloat(z, 'g', -1, 64)}, limits...)...)
		if err != nil {
			t.Fatal(err)
		}
		if eps := lastField(t, back, "epsilon"); eps > 2 || eps < 1.99 {
			t.Errorf("%s: noise %v gives epsilon %v\n%s%s", mech, z, eps, out, back)
		}
	}
	// Independent noise with the same cap composes over 4 rounds only.
	out, err = run(t, "", "dp", "epsilon", "--noise-multiplier", "4", "--q", "1", "--max-participations", "4", "--rounds", "1000", "--delta", "1e-6")
	if err != nil {
		t.Fatal(err)
	}
	want, err := dp.Epsilon([]dp.Event{{Q: 1, NoiseMultiplier: 4, Steps: 4}}, 1e-6)
	if got := lastField(t, out, "epsilon"); err != nil || math.Abs(got-want) > 1e-9*want {
		t.Errorf("gaussian with a cap of 4: epsilon %v, want %v (%v)", got, want, err)
	}
	for _, bad := range [][]string{
		{"--mechanism", "tree", "--q", "0.5", "--noise-multiplier", "1", "--rounds", "10", "--delta", "1e-6"},
		{"--mechanism", "blt", "--noise-multiplier", "1", "--rounds", "10", "--max-participations", "4", "--min-separation", "5", "--delta", "1e-6"},
		{"--mechanism", "laplace", "--noise-multiplier", "1", "--rounds", "10", "--delta", "1e-6"},
		{"--noise-multiplier", "1", "--q", "1", "--min-separation", "3", "--rounds", "10", "--delta", "1e-6"},
		{"--mechanism", "tree", "--noise-multiplier", "1", "--delta", "1e-6"},
	} {
		if _, err := run(t, "", append([]string{"dp", "epsilon"}, bad...)...); !errors.Is(err, cli.ErrUsage) {
			t.Errorf("%v: %v, want a usage error", bad, err)
		}
	}
}
