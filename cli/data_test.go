package cli

// Internal tests: the commands are built by their constructors, as the root
// command registers them, and most get a small synthetic MNIST so that
// -short runs need not decompress the real one.

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/data"
)

// synthetic returns train and test sets shaped like MNIST's but small:
// feature 0 of each example is its index, so the tests can tell where every
// written example came from.
func synthetic(trainN, testN int) (train, test *data.Dataset) {
	make := func(n, offset int) *data.Dataset {
		d := &data.Dataset{Dim: 3, NumClasses: 10, Features: make([]float32, 0, 3*n), Labels: make([]uint8, n)}
		for i := range n {
			// Labels are not in blocks, as in MNIST.
			d.Labels[i] = uint8((i*7 + i/10) % 10)
			d.Features = append(d.Features, float32(i), float32(offset), float32(d.Labels[i])/10)
		}
		return d
	}
	return make(trainN, 0), make(testN, 1)
}

type dataRun struct {
	out, errOut string
	err         error
}

// dataCLI runs data mnist over a synthetic MNIST of trainN and testN
// examples; loads counts the loader's calls.
func dataCLI(t *testing.T, trainN, testN int, loads *atomic.Int32, args ...string) dataRun {
	t.Helper()
	load := func() (*data.Dataset, *data.Dataset, string, error) {
		if loads != nil {
			loads.Add(1)
		}
		train, test := synthetic(trainN, testN)
		return train, test, "synthetic", nil
	}
	return execute(t, newDataMNISTCommand(&app{getenv: func(string) string { return "" }}, load), args...)
}

func execute(t *testing.T, cmd *cobra.Command, args ...string) dataRun {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(t.Context())
	return dataRun{out.String(), errOut.String(), err}
}

func readDataset(t *testing.T, dir string) (*data.Dataset, data.Manifest) {
	t.Helper()
	d, err := data.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, data.ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	m, err := data.DecodeManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	return d, m
}

// totalVariation is the total variation distance between two label
// histograms taken as distributions.
func totalVariation(a, b []int) float64 {
	var na, nb float64
	for k := range a {
		na += float64(a[k])
		nb += float64(b[k])
	}
	tv := 0.0
	for k := range a {
		tv += math.Abs(float64(a[k])/na - float64(b[k])/nb)
	}
	return tv / 2
}

func TestDataMNIST(t *testing.T) {
	const (
		trainN, testN = 3000, 600
		devices       = 4
		pool, evalN   = 2000, 300
		seed          = 5
		alpha         = 0.3
	)
	dir := filepath.Join(t.TempDir(), "datasets")
	args := func(dir string, seed int) []string {
		return []string{"--devices", fmt.Sprint(devices), "--alpha", fmt.Sprint(alpha), "--out", dir, "--seed", fmt.Sprint(seed),
			"--train-examples", fmt.Sprint(pool), "--eval-examples", fmt.Sprint(evalN)}
	}
	r := dataCLI(t, trainN, testN, nil, args(dir, seed)...)
	if r.err != nil {
		t.Fatal(r.err)
	}
	train, test := synthetic(trainN, testN)

	// The split is data.Dirichlet's, as the demo's is, over the seeded
	// sample of the training set.
	sampled := sample(trainN, pool, seed, trainSampleStream)
	labels := make([]uint8, len(sampled))
	for i, j := range sampled {
		labels[i] = train.Labels[j]
	}
	parts, err := data.Dirichlet(labels, 10, devices, alpha, seed)
	if err != nil {
		t.Fatal(err)
	}

	seen := map[int]bool{}
	hists := make([][]int, devices)
	total := 0
	for k := range devices {
		d, m := readDataset(t, filepath.Join(dir, fmt.Sprintf("device-%d", k)))
		if m.Name != fmt.Sprintf("mnist-dirichlet-0.3/device-%d", k) || d.Dim != 3 || d.NumClasses != 10 {
			t.Errorf("device-%d: name %q, dim %d, %d classes", k, m.Name, d.Dim, d.NumClasses)
		}
		var got []int
		hists[k] = make([]int, 10)
		for i := range d.Len() {
			src := int(d.Features[i*3])
			if seen[src] {
				t.Fatalf("training example %d written twice", src)
			}
			seen[src] = true
			if d.Labels[i] != train.Labels[src] || d.Features[i*3+1] != 0 {
				t.Fatalf("device-%d example %d is not training example %d", k, i, src)
			}
			got = append(got, src)
			hists[k][d.Labels[i]]++
		}
		var want []int
		for _, i := range parts[k] {
			want = append(want, sampled[i])
		}
		if !slices.Equal(got, want) {
			t.Errorf("device-%d holds examples %v..., want the Dirichlet split's %v...", k, got[:min(5, len(got))], want[:min(5, len(want))])
		}
		total += d.Len()
	}
	if total != pool {
		t.Errorf("devices hold %d examples, want %d", total, pool)
	}
	// Label skew: alpha 0.3 over 4 devices leaves some device far from the
	// overall label distribution.
	overall := make([]int, 10)
	for _, l := range labels {
		overall[l]++
	}
	skew := 0.0
	for _, h := range hists {
		skew = max(skew, totalVariation(h, overall))
	}
	if skew < 0.3 {
		t.Errorf("largest label-distribution distance from the pool %.2f, want a skewed split; histograms %v", skew, hists)
	}

	eval, m := readDataset(t, filepath.Join(dir, "eval"))
	if eval.Len() != evalN || m.Name != "mnist-test" {
		t.Errorf("eval: %d examples named %q", eval.Len(), m.Name)
	}
	evalSeen := map[int]bool{}
	for i := range eval.Len() {
		src := int(eval.Features[i*3])
		if evalSeen[src] || eval.Features[i*3+1] != 1 || eval.Labels[i] != test.Labels[src] {
			t.Fatalf("eval example %d (test example %d) is not a distinct test example", i, src)
		}
		evalSeen[src] = true
	}

	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"MNIST from synthetic: 3000 training, 600 test examples\n",
		"wrote 4 device datasets to " + abs + ": 2000 training examples, Dirichlet(alpha=0.3) label skew, seed 5\n",
		"device-3", "examples per device: min ",
		"wrote the server evaluation set " + filepath.Join(abs, "eval") + ": 300 examples",
		"for each device K (0 to 3)",
		"--dataset " + filepath.Join(abs, "device-K") + "\n",
		"--server-eval-dataset " + filepath.Join(abs, "eval") + " ...\n",
	} {
		if !strings.Contains(r.out, want) {
			t.Errorf("output lacks %q:\n%s", want, r.out)
		}
	}
	if r.errOut != "" {
		t.Errorf("stderr: %q", r.errOut)
	}

	// Deterministic for a seed: the same files, by their digests.
	manifests := func(dir string) [][32]byte {
		var sums [][32]byte
		for _, name := range []string{"device-0", "device-1", "device-2", "device-3", "eval"} {
			b, err := os.ReadFile(filepath.Join(dir, name, data.ManifestFile))
			if err != nil {
				t.Fatal(err)
			}
			sums = append(sums, sha256.Sum256(b))
		}
		return sums
	}
	again := filepath.Join(t.TempDir(), "again")
	if r := dataCLI(t, trainN, testN, nil, args(again, seed)...); r.err != nil {
		t.Fatal(r.err)
	}
	if !slices.Equal(manifests(dir), manifests(again)) {
		t.Error("the same seed wrote different datasets")
	}
	other := filepath.Join(t.TempDir(), "other")
	if r := dataCLI(t, trainN, testN, nil, args(other, seed+1)...); r.err != nil {
		t.Fatal(r.err)
	}
	o, s := manifests(other), manifests(dir)
	for i := range o {
		if o[i] == s[i] {
			t.Errorf("seeds %d and %d wrote the same dataset %d", seed, seed+1, i)
		}
	}
}

func TestDataMNISTWholeSplits(t *testing.T) {
	dir := t.TempDir()
	// The defaults take whole sets; here the synthetic ones, sized to them.
	r := dataCLI(t, mnistTrainExamples, mnistTestExamples, nil, "--devices", "1", "--out", dir)
	if r.err != nil {
		t.Fatal(r.err)
	}
	d, _ := readDataset(t, filepath.Join(dir, "device-0"))
	eval, _ := readDataset(t, filepath.Join(dir, "eval"))
	if d.Len() != mnistTrainExamples || eval.Len() != mnistTestExamples {
		t.Fatalf("device-0 %d, eval %d examples", d.Len(), eval.Len())
	}
	// All of each, in order.
	for i := range eval.Len() {
		if eval.Features[i*3] != float32(i) {
			t.Fatalf("eval example %d is test example %v", i, eval.Features[i*3])
		}
	}
	if !strings.Contains(r.out, "for each device K (0)") || !strings.Contains(r.out, "Dirichlet(alpha=0.5)") {
		t.Errorf("output:\n%s", r.out)
	}
}

func TestDataMNISTNoEval(t *testing.T) {
	dir := t.TempDir()
	r := dataCLI(t, 100, 50, nil, "--devices", "2", "--out", dir, "--train-examples", "100", "--eval-examples", "0")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if _, err := os.Stat(filepath.Join(dir, "eval")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("--eval-examples 0 wrote an evaluation set: %v", err)
	}
	if strings.Contains(r.out, "eval") {
		t.Errorf("output mentions an evaluation set:\n%s", r.out)
	}
}

func TestDataMNISTOutDir(t *testing.T) {
	dir := t.TempDir()
	base := []string{"--out", dir, "--train-examples", "200", "--eval-examples", "20"}
	if r := dataCLI(t, 200, 20, nil, append([]string{"--devices", "4"}, base...)...); r.err != nil {
		t.Fatal(r.err)
	}
	var loads atomic.Int32
	r := dataCLI(t, 200, 20, &loads, append([]string{"--devices", "2"}, base...)...)
	if !errors.Is(r.err, ErrUsage) || !strings.Contains(r.err.Error(), "--force") || loads.Load() != 0 {
		t.Fatalf("non-empty --out without --force: %v (MNIST loaded %d times)", r.err, loads.Load())
	}
	r = dataCLI(t, 200, 20, nil, append([]string{"--devices", "2", "--force"}, base...)...)
	if r.err != nil {
		t.Fatal(r.err)
	}
	// device-2 and device-3 of the first split are left, with a warning.
	for _, k := range []string{"2", "3"} {
		if !strings.Contains(r.errOut, "warning: "+filepath.Join(dir, "device-"+k)+" is not part of this split") {
			t.Errorf("stderr lacks a warning on device-%s: %q", k, r.errOut)
		}
	}
	if strings.Contains(r.errOut, "device-4") || strings.Contains(r.errOut, "device-1 ") {
		t.Errorf("stderr: %q", r.errOut)
	}
	d0, _ := readDataset(t, filepath.Join(dir, "device-0"))
	d1, _ := readDataset(t, filepath.Join(dir, "device-1"))
	if d0.Len()+d1.Len() != 200 {
		t.Errorf("--force: the two devices hold %d examples, want 200", d0.Len()+d1.Len())
	}

	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if r := dataCLI(t, 200, 20, nil, "--devices", "2", "--out", file, "--force"); !errors.Is(r.err, ErrUsage) {
		t.Errorf("--out naming a file: %v", r.err)
	}
}

func TestDataMNISTRefusesBadFlags(t *testing.T) {
	out := filepath.Join(t.TempDir(), "d")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no devices", []string{"--out", out}, `"devices" not set`},
		{"no out", []string{"--devices", "2"}, `"out" not set`},
		{"zero devices", []string{"--devices", "0", "--out", out}, "--devices 0 must be between 1 and --train-examples 60000"},
		{"more devices than examples", []string{"--devices", "11", "--out", out, "--train-examples", "10"}, "--devices 11"},
		{"zero train examples", []string{"--devices", "1", "--out", out, "--train-examples", "0"}, "--train-examples 0 must be between 1 and 60000"},
		{"too many train examples", []string{"--devices", "1", "--out", out, "--train-examples", "60001"}, "--train-examples 60001"},
		{"alpha zero", []string{"--devices", "2", "--out", out, "--alpha", "0"}, "--alpha 0 must be between 1e-06 and 1e+06"},
		{"alpha negative", []string{"--devices", "2", "--out", out, "--alpha", "-1"}, "--alpha -1"},
		{"alpha NaN", []string{"--devices", "2", "--out", out, "--alpha", "NaN"}, "--alpha NaN"},
		{"alpha infinite", []string{"--devices", "2", "--out", out, "--alpha", "+Inf"}, "--alpha +Inf"},
		{"negative eval examples", []string{"--devices", "2", "--out", out, "--eval-examples", "-1"}, "--eval-examples -1 must be between 0 and 10000"},
		{"too many eval examples", []string{"--devices", "2", "--out", out, "--eval-examples", "10001"}, "--eval-examples 10001"},
		{"empty out", []string{"--devices", "2", "--out", ""}, "--out must name a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var loads atomic.Int32
			r := dataCLI(t, mnistTrainExamples, mnistTestExamples, &loads, tc.args...)
			if r.err == nil || !strings.Contains(r.err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", r.err, tc.want)
			}
			if loads.Load() != 0 {
				t.Error("MNIST was loaded before the flags were checked")
			}
		})
	}
	// Bounds come from the sets the loader returns too.
	if r := dataCLI(t, 100, 10, nil, "--devices", "2", "--out", out, "--train-examples", "101"); !errors.Is(r.err, ErrUsage) ||
		!strings.Contains(r.err.Error(), "between 1 and 100") {
		t.Errorf("more training examples than loaded: %v", r.err)
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused commands created --out: %v", err)
	}
}

func TestSample(t *testing.T) {
	a := sample(1000, 100, 1, trainSampleStream)
	if len(a) != 100 || a[0] < 0 || a[99] >= 1000 {
		t.Fatalf("sample(1000, 100) = %v", a)
	}
	for i := 1; i < len(a); i++ {
		if a[i] <= a[i-1] {
			t.Fatalf("sample(1000, 100) is not sorted and distinct: %v", a)
		}
	}
	if !slices.Equal(a, sample(1000, 100, 1, trainSampleStream)) {
		t.Error("sample is not a function of its seed")
	}
	if slices.Equal(a, sample(1000, 100, 2, trainSampleStream)) || slices.Equal(a, sample(1000, 100, 1, evalSampleStream)) {
		t.Error("another seed or stream gave the same sample")
	}
	if all := sample(5, 5, 1, 0); !slices.Equal(all, []int{0, 1, 2, 3, 4}) {
		t.Errorf("sample(5, 5) = %v", all)
	}
}

// The real command on the real MNIST: whatever MNISTDir finds, the module
// cache or the copy built into the binary.
func TestDataMNISTReal(t *testing.T) {
	if testing.Short() {
		t.Skip("decompresses MNIST")
	}
	dir := t.TempDir()
	r := execute(t, newDataCommand(&app{getenv: func(string) string { return "" }}),
		"mnist", "--devices", "3", "--alpha", "0.5", "--out", dir, "--train-examples", "6000", "--eval-examples", "1000", "--seed", "2")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !strings.Contains(r.out, "MNIST from ") || !strings.Contains(r.out, ": 60000 training, 10000 test examples") {
		t.Errorf("output:\n%s", r.out)
	}
	train, test, err := data.LoadMNIST(data.EmbeddedMNIST)
	if err != nil {
		t.Fatal(err)
	}
	rows := func(d *data.Dataset) map[[32]byte]int {
		m := map[[32]byte]int{}
		buf := make([]byte, 4*d.Dim+1)
		for i := range d.Len() {
			for j, v := range d.Features[i*d.Dim : (i+1)*d.Dim] {
				binary.LittleEndian.PutUint32(buf[4*j:], math.Float32bits(v))
			}
			buf[4*d.Dim] = d.Labels[i]
			m[sha256.Sum256(buf)]++
		}
		return m
	}
	// Every example written is one of MNIST's, none used twice (counting
	// the few images MNIST itself repeats).
	contained := func(name string, got, in map[[32]byte]int) {
		for k, n := range got {
			if n > in[k] {
				t.Errorf("%s holds an example %d times that its MNIST split has %d times", name, n, in[k])
				return
			}
		}
	}
	trainRows, union, total := rows(train), map[[32]byte]int{}, 0
	for k := range 3 {
		d, _ := readDataset(t, filepath.Join(dir, fmt.Sprintf("device-%d", k)))
		if d.Dim != 784 || d.NumClasses != 10 {
			t.Fatalf("device-%d: dim %d, %d classes", k, d.Dim, d.NumClasses)
		}
		for h, n := range rows(d) {
			union[h] += n
		}
		total += d.Len()
	}
	if total != 6000 {
		t.Errorf("devices hold %d examples, want 6000", total)
	}
	contained("the devices", union, trainRows)
	eval, _ := readDataset(t, filepath.Join(dir, "eval"))
	if eval.Len() != 1000 {
		t.Errorf("eval holds %d examples", eval.Len())
	}
	contained("eval", rows(eval), rows(test))
}
