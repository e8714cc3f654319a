package seq_test

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/model/seq"
	"github.com/fleetlearn/fleetlearn/model/sgd"
)

const leaf = "seq:input(1,28,28),conv(32,5,pad=2),relu,maxpool(2),conv(64,5,pad=2),relu,maxpool(2),dense(2048),relu,dense(10)"

func TestParseLEAF(t *testing.T) {
	a, err := seq.Parse(leaf)
	if err != nil {
		t.Fatal(err)
	}
	// The FEMNIST CNN of LEAF: 6,603,710 parameters for 62 classes, so
	// 6,497,162 for 10 (the last layer is 2048·10 + 10).
	if got := a.Params(); got != 6497162 {
		t.Errorf("params %d, want 6497162", got)
	}
	want := []struct {
		name  string
		shape []int
	}{
		{"0.weight", []int{32, 1, 5, 5}}, {"0.bias", []int{32}},
		{"3.weight", []int{64, 32, 5, 5}}, {"3.bias", []int{64}},
		{"6.weight", []int{2048, 3136}}, {"6.bias", []int{2048}},
		{"8.weight", []int{10, 2048}}, {"8.bias", []int{10}},
	}
	ps := a.ParamList()
	if len(ps) != len(want) {
		t.Fatalf("%d params, want %d", len(ps), len(want))
	}
	for i, p := range ps {
		if p.Name != want[i].name || !slices.Equal(p.Shape, want[i].shape) {
			t.Errorf("param %d: %s %v, want %s %v", i, p.Name, p.Shape, want[i].name, want[i].shape)
		}
	}
	if s := a.Layers[5].OutShape; s != (seq.Shape{C: 64, H: 7, W: 7}) {
		t.Errorf("second pool's output %v", s)
	}
	// The canonical form reads back to the same architecture.
	b, err := seq.Parse(a.String())
	if err != nil {
		t.Fatal(err)
	}
	if b.String() != a.String() {
		t.Errorf("round trip: %s\n  became %s", a, b)
	}
}

func TestParseInputAndJSON(t *testing.T) {
	if _, err := seq.Parse("seq:conv(8,3),relu,dense(10)"); !errors.Is(err, seq.ErrArch) || !strings.Contains(err.Error(), "input(C,H,W)") {
		t.Errorf("no input: %v", err)
	}
	a, err := seq.ParseWithInput("seq:conv(8,3),relu,dense(10)", seq.Shape{C: 3, H: 32, W: 32})
	if err != nil {
		t.Fatal(err)
	}
	j, err := seq.ParseJSON([]byte(`{"input": [3, 32, 32], "layers": ["conv(8,3)", "relu", "dense(10)"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if a.String() != j.String() {
		t.Errorf("inline %s, JSON %s", a, j)
	}
	flat, err := seq.Parse("seq:input(20),dense(16),layernorm,relu,dropout(0.5),dense(4)")
	if err != nil {
		t.Fatal(err)
	}
	if got := flat.ParamList()[2].Shape; !slices.Equal(got, []int{16}) {
		t.Errorf("layernorm weight %v", got)
	}
}

func TestParseRefuses(t *testing.T) {
	for _, s := range []string{
		"", "mlp:784,10", "seq:", "seq:input(1,28,28)", "seq:input(1,28,28),conv(8,5)",
		"seq:input(1,28,28),dense(1)",                  // one class
		"seq:input(1,28,28),conv(8,29),dense(10)",      // window larger than the image
		"seq:input(1,28,28),conv(8,5,pad=5),dense(10)", // pad not below the kernel
		"seq:input(1,28,28),conv(8,5,stride=0),dense(10)",
		"seq:input(1,28,28),conv(-8,5),dense(10)",
		"seq:input(1,28,28),conv(8,5,bias=0),dense(10)",
		"seq:input(1,28,28),conv(8,5,pad=1,pad=2),dense(10)",
		"seq:input(1,28,28),maxpool(29),dense(10)",
		"seq:input(3,8,8),groupnorm(2),dense(10)", // 2 groups, 3 channels
		"seq:input(3,8,8),dropout(1),dense(10)",
		"seq:input(3,8,8),dropout(NaN),dense(10)",
		"seq:input(3,8,8),softmax,dense(10)",
		"seq:input(3,8,8),dense(10),input(3)",
		"seq:input(3,8,8),dense(99999999)",
		"seq:input(65536,65536,65536),dense(10)",
		"seq:input(1,4096,4096),dense(65536),dense(65536),dense(10)", // over the parameter bound
		"seq:input(3,8,8),dense(10),",
		"seq:input(3,8,8),dense(10",
		"seq:input(3,8,8),dense((10)),dense(10)",
		"seq:input(3,8,8)," + strings.Repeat("relu,", 70) + "dense(10)",
	} {
		if _, err := seq.Parse(s); !errors.Is(err, seq.ErrArch) {
			t.Errorf("%q: %v, want ErrArch", s, err)
		}
	}
}

func TestBind(t *testing.T) {
	a, err := seq.Parse("seq:input(2,4,4),conv(3,3,pad=1),groupnorm(3),relu,flatten,dense(5)")
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"0.weight", "0.bias", "1.weight", "1.bias", "4.weight", "4.lora_a", "4.lora_b", "4.bias"}
	shapes := [][]int{{3, 2, 3, 3}, {3}, {3}, {3}, {5, 48}, {2, 48}, {5, 2}, {5}}
	bs, err := a.Bind(names, shapes)
	if err != nil {
		t.Fatal(err)
	}
	if b := bs[4]; b.W != 4 || b.LoraA != 5 || b.LoraB != 6 || b.B != 7 || b.Rank != 2 {
		t.Errorf("dense binding %+v", b)
	}
	for name, mutate := range map[string]func(n []string, s [][]int){
		"missing":      func(n []string, s [][]int) { n[3] = "1.beta" },
		"wrong shape":  func(n []string, s [][]int) { s[0] = []int{3, 2, 5, 5} },
		"extra":        func(n []string, s [][]int) { n[7] = "9.bias" },
		"lora on conv": func(n []string, s [][]int) { n[5], n[6] = "0.lora_a", "0.lora_b" },
		"half lora":    func(n []string, s [][]int) { n[6] = "x" },
	} {
		n, s := slices.Clone(names), slices.Clone(shapes)
		mutate(n, s)
		if _, err := a.Bind(n, s); !errors.Is(err, seq.ErrArch) {
			t.Errorf("%s: %v, want ErrArch", name, err)
		}
	}
}

// FuzzParse: no list panics the parser, and what it accepts prints to a
// canonical form that parses back to itself, within the bounds.
func FuzzParse(f *testing.F) {
	for _, s := range []string{leaf, "seq:input(20),dense(16),layernorm,relu,dropout(0.5),dense(4)",
		"seq:input(3,8,8),conv(4,3,stride=2,pad=1),groupnorm(2),avgpool(2,stride=1),flatten,dense(2)", "seq:input(1,1,1),dense(2)"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := seq.Parse(s)
		if err != nil {
			if !errors.Is(err, seq.ErrArch) {
				t.Fatalf("%q: %v does not wrap ErrArch", s, err)
			}
			return
		}
		if a.Params() > seq.MaxParams || len(a.Layers) > seq.MaxLayers {
			t.Fatalf("%q: %d params in %d layers", s, a.Params(), len(a.Layers))
		}
		b, err := seq.Parse(a.String())
		if err != nil || b.String() != a.String() {
			t.Fatalf("%q: canonical %q reparsed as %v (%v)", s, a.String(), b, err)
		}
	})
}

// TestTrainStopsOnDivergence: a loss that is no longer finite ends the
// call with ErrDiverged and a hint, instead of a NaN metric.
func TestTrainStopsOnDivergence(t *testing.T) {
	a, err := seq.Parse("seq:input(2),dense(2)")
	if err != nil {
		t.Fatal(err)
	}
	o := &nanOps{}
	m := &seq.Model[int]{Params: []int{1, 2}, Shapes: [][]int{{2, 2}, {2}}}
	if m.Bind, err = a.Bind([]string{"0.weight", "0.bias"}, m.Shapes); err != nil {
		t.Fatal(err)
	}
	_, err = seq.Train[int](o, a, m, sgd.Hyper{Epochs: 3, BatchSize: 2, LearningRate: 0.1}, 4, 1)
	if !errors.Is(err, seq.ErrDiverged) || !strings.Contains(err.Error(), "learning_rate") {
		t.Errorf("%v, want ErrDiverged naming learning_rate", err)
	}
	if o.steps != 1 {
		t.Errorf("%d losses computed, want the first only", o.steps)
	}
}

// nanOps is an Ops whose loss is NaN: only the control flow matters here.
type nanOps struct{ steps int }

func (o *nanOps) New(rows, cols int) int                                         { return 1 }
func (o *nanOps) Resize(t int, rows, cols int)                                   {}
func (o *nanOps) Fill(t int, v float32)                                          {}
func (o *nanOps) Copy(dst, src int)                                              {}
func (o *nanOps) Gather(x, labels int, idx []int32)                              {}
func (o *nanOps) Gemm(ta, tb bool, alpha float32, a, b int, beta float32, c int) {}
func (o *nanOps) BiasAdd(x, b int)                                               {}
func (o *nanOps) ColSum(x, out int)                                              {}
func (o *nanOps) Axpy(alpha float32, x, y int)                                   {}
func (o *nanOps) ReLU(x, y int)                                                  {}
func (o *nanOps) ReLUGrad(dy, x, dx int)                                         {}
func (o *nanOps) SoftmaxXent(logits, labels, grad int) float64 {
	o.steps++
	return math.NaN()
}
func (o *nanOps) CountCorrect(logits, labels int) int                                { return 0 }
func (o *nanOps) LayerNorm(x, gamma, beta, y, mean, rstd int, eps float32)           {}
func (o *nanOps) LayerNormGrad(dy, x, gamma, mean, rstd, dx, dgamma, dbeta int)      {}
func (o *nanOps) Conv2D(x, w, b, y int, inC, inH, inW, k, stride, pad int)           {}
func (o *nanOps) Conv2DGrad(dy, x, w, dx, dw, db int, inC, inH, inW, k, s, p int)    {}
func (o *nanOps) MaxPool2D(x, y int, c, h, w, k, stride int)                         {}
func (o *nanOps) MaxPool2DGrad(dy, x, dx int, c, h, w, k, stride int)                {}
func (o *nanOps) AvgPool2D(x, y int, c, h, w, k, stride int)                         {}
func (o *nanOps) AvgPool2DGrad(dy, dx int, c, h, w, k, stride int)                   {}
func (o *nanOps) GroupNorm(x, gamma, beta, y, mean, rstd int, g, c int, eps float32) {}
func (o *nanOps) GroupNormGrad(dy, x, gamma, mean, rstd, dx, dg, db int, g, c int)   {}
func (o *nanOps) Dropout(x, y int, p float32, seed uint64)                           {}
func (o *nanOps) DropoutGrad(dy, dx int, p float32, seed uint64)                     {}
