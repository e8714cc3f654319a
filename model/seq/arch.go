package seq

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Prefix starts every layer-list architecture.
const Prefix = "seq:"

// Bounds of an architecture. They keep every size a module can make the
// host allocate within the sandbox's limits and every product within int32.
const (
	MaxLayers       = 64
	MaxSize         = 65536   // channels, features, spatial sides
	MaxKernel       = 32      // convolution and pooling windows, strides
	MaxGroups       = 1024    // groupnorm groups
	MaxFeatures     = 1 << 22 // values of one example's activation
	MaxParams       = 1 << 28 // float32 parameters of the whole model (1 GiB)
	MaxRank         = 256     // LoRA rank
	maxUnfolded     = 1 << 24 // a convolution's unfolded input per example (package kernel's MaxConvValues)
	maxArchArgs     = 4
	defaultNormEps  = 1e-5
	maxDropoutRatio = 0.95
)

// Kind is what a layer computes.
type Kind string

// The layer kinds.
const (
	Conv      Kind = "conv"
	Dense     Kind = "dense"
	ReLU      Kind = "relu"
	MaxPool   Kind = "maxpool"
	AvgPool   Kind = "avgpool"
	GroupNorm Kind = "groupnorm"
	LayerNorm Kind = "layernorm"
	Dropout   Kind = "dropout"
	Flatten   Kind = "flatten"
)

// Shape is one example's activation: C channels of H×W, or D = C features
// with H = W = 1 once flat.
type Shape struct{ C, H, W int }

// Size is C·H·W.
func (s Shape) Size() int { return s.C * s.H * s.W }

// Flat says whether the shape has no spatial extent.
func (s Shape) Flat() bool { return s.H == 1 && s.W == 1 }

func (s Shape) dims() []int {
	if s.Flat() {
		return []int{s.C}
	}
	return []int{s.C, s.H, s.W}
}

func (s Shape) String() string {
	if s.Flat() {
		return strconv.Itoa(s.C)
	}
	return fmt.Sprintf("%dx%dx%d", s.C, s.H, s.W)
}

// Layer is one element of the list with the shapes it maps between.
type Layer struct {
	Kind Kind
	// Out is the output channels of conv, the features of dense; K the
	// window of conv and the pools; Stride and Pad as in PyTorch; Groups
	// of groupnorm.
	Out, K, Stride, Pad, Groups int
	P                           float64 // dropout probability
	In, OutShape                Shape
}

// HasParams says whether the layer owns a weight and a bias.
func (l Layer) HasParams() bool {
	switch l.Kind {
	case Conv, Dense, GroupNorm, LayerNorm:
		return true
	}
	return false
}

// WeightShape and BiasShape are the layer's tensor shapes (PyTorch's).
func (l Layer) WeightShape() []int {
	switch l.Kind {
	case Conv:
		return []int{l.Out, l.In.C, l.K, l.K}
	case Dense:
		return []int{l.Out, l.In.Size()}
	case GroupNorm:
		return []int{l.In.C}
	case LayerNorm:
		return l.In.dims()
	}
	return nil
}

// BiasShape is the shape of the layer's bias.
func (l Layer) BiasShape() []int {
	switch l.Kind {
	case Conv, Dense:
		return []int{l.Out}
	case GroupNorm:
		return []int{l.In.C}
	case LayerNorm:
		return l.In.dims()
	}
	return nil
}

// Arch is a parsed layer list.
type Arch struct {
	Input  Shape
	Layers []Layer
}

// Output is the last layer's output: the classes, flat.
func (a *Arch) Output() Shape { return a.Layers[len(a.Layers)-1].OutShape }

// Params counts the architecture's float32 parameters, adapters excluded.
func (a *Arch) Params() int64 {
	var n int64
	for _, l := range a.Layers {
		if l.HasParams() {
			n += prod(l.WeightShape()) + prod(l.BiasShape())
		}
	}
	return n
}

func prod(s []int) int64 {
	n := int64(1)
	for _, d := range s {
		n *= int64(d)
	}
	return n
}

// String is the canonical form: what Parse reads back to the same Arch,
// every default spelled out, input() first.
func (a *Arch) String() string {
	var b strings.Builder
	b.WriteString(Prefix)
	in := a.Input
	if in.Flat() {
		fmt.Fprintf(&b, "input(%d)", in.C)
	} else {
		fmt.Fprintf(&b, "input(%d,%d,%d)", in.C, in.H, in.W)
	}
	for _, l := range a.Layers {
		b.WriteByte(',')
		switch l.Kind {
		case Conv:
			fmt.Fprintf(&b, "conv(%d,%d,stride=%d,pad=%d)", l.Out, l.K, l.Stride, l.Pad)
		case Dense:
			fmt.Fprintf(&b, "dense(%d)", l.Out)
		case MaxPool, AvgPool:
			fmt.Fprintf(&b, "%s(%d,stride=%d)", l.Kind, l.K, l.Stride)
		case GroupNorm:
			fmt.Fprintf(&b, "groupnorm(%d)", l.Groups)
		case Dropout:
			fmt.Fprintf(&b, "dropout(%s)", strconv.FormatFloat(l.P, 'g', -1, 64))
		default:
			b.WriteString(string(l.Kind))
		}
	}
	return b.String()
}

// Parse reads a layer list: "seq:" and comma-separated layers, each a name
// with optional arguments in parentheses (whole numbers, a dropout
// probability, key=value for stride and pad). An input(C,H,W) or input(D)
// first gives one example's shape; without it, input must be given
// (ParseWithInput). The layers must end flat, in the classes.
func Parse(s string) (*Arch, error) { return ParseWithInput(s, Shape{}) }

// ParseWithInput is Parse with the input shape to use when the list has no
// input(); the zero Shape requires one.
func ParseWithInput(s string, input Shape) (*Arch, error) {
	body, ok := strings.CutPrefix(s, Prefix)
	if !ok {
		return nil, fmt.Errorf("%w: %q does not start with %q", ErrArch, clip(s), Prefix)
	}
	items, err := splitItems(body)
	if err != nil {
		return nil, err
	}
	return build(items, input)
}

// ParseJSON reads the file form: {"input": [C, H, W], "layers": ["conv(32,5,pad=2)", "relu", …]},
// the same layers as strings; unknown fields are refused.
func ParseJSON(b []byte) (*Arch, error) {
	var f struct {
		Input  []int    `json:"input"`
		Layers []string `json:"layers"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrArch, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: data after the JSON object", ErrArch)
	}
	if len(f.Layers) > MaxLayers {
		return nil, fmt.Errorf("%w: %d layers, at most %d", ErrArch, len(f.Layers), MaxLayers)
	}
	var items []item
	if len(f.Input) > 0 {
		it := item{name: "input"}
		for _, d := range f.Input {
			it.args = append(it.args, strconv.Itoa(d))
		}
		items = append(items, it)
	}
	for _, l := range f.Layers {
		li, err := splitItems(l)
		if err != nil {
			return nil, err
		}
		if len(li) != 1 {
			return nil, fmt.Errorf("%w: layer %q: one layer per string", ErrArch, clip(l))
		}
		items = append(items, li[0])
	}
	return build(items, Shape{})
}

type item struct {
	name string
	args []string
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// splitItems splits at the commas outside parentheses.
func splitItems(s string) ([]item, error) {
	var items []item
	for len(s) > 0 {
		if len(items) > MaxLayers+1 {
			return nil, fmt.Errorf("%w: more than %d layers", ErrArch, MaxLayers)
		}
		end := strings.IndexByte(s, ',')
		open := strings.IndexByte(s, '(')
		var it item
		if open >= 0 && (end < 0 || open < end) {
			closeAt := strings.IndexByte(s, ')')
			if closeAt < open {
				return nil, fmt.Errorf("%w: %q: unbalanced parentheses", ErrArch, clip(s))
			}
			it.name = strings.TrimSpace(s[:open])
			inner := s[open+1 : closeAt]
			if strings.ContainsAny(inner, "()") {
				return nil, fmt.Errorf("%w: %q: nested parentheses", ErrArch, clip(s))
			}
			for _, a := range strings.Split(inner, ",") {
				it.args = append(it.args, strings.TrimSpace(a))
			}
			if len(it.args) > maxArchArgs {
				return nil, fmt.Errorf("%w: %s: at most %d arguments", ErrArch, it.name, maxArchArgs)
			}
			s = strings.TrimSpace(s[closeAt+1:])
			if s != "" {
				if s[0] != ',' {
					return nil, fmt.Errorf("%w: %q: want a comma after %s(…)", ErrArch, clip(s), it.name)
				}
				s = s[1:]
				if s == "" {
					return nil, fmt.Errorf("%w: trailing comma", ErrArch)
				}
			}
		} else {
			if end < 0 {
				end = len(s)
			}
			it.name = strings.TrimSpace(s[:end])
			if strings.ContainsRune(it.name, ')') {
				return nil, fmt.Errorf("%w: %q: unbalanced parentheses", ErrArch, clip(it.name))
			}
			if end < len(s) {
				s = s[end+1:]
				if s == "" {
					return nil, fmt.Errorf("%w: trailing comma", ErrArch)
				}
			} else {
				s = ""
			}
		}
		if it.name == "" {
			return nil, fmt.Errorf("%w: empty layer", ErrArch)
		}
		items = append(items, it)
	}
	return items, nil
}

// ints parses an item's arguments: positional whole numbers, then
// key=value pairs among optional's keys, which give the defaults.
func (it item) ints(positional []string, optional map[string]int) (map[string]int, error) {
	out := map[string]int{}
	for k, v := range optional {
		out[k] = v
	}
	pos := 0
	seen := map[string]bool{}
	for _, a := range it.args {
		key := ""
		v := a
		if k, val, ok := strings.Cut(a, "="); ok {
			key, v = strings.TrimSpace(k), strings.TrimSpace(val)
			if _, known := optional[key]; !known {
				return nil, fmt.Errorf("%w: %s: unknown argument %q", ErrArch, it.name, key)
			}
		} else {
			if pos >= len(positional) {
				return nil, fmt.Errorf("%w: %s: too many arguments (%s)", ErrArch, it.name, usage(it.name))
			}
			key = positional[pos]
			pos++
		}
		if seen[key] {
			return nil, fmt.Errorf("%w: %s: %s given twice", ErrArch, it.name, key)
		}
		seen[key] = true
		n, err := strconv.Atoi(v)
		if err != nil || v == "" || strings.Trim(v, "0123456789") != "" {
			return nil, fmt.Errorf("%w: %s: %s=%q is not a whole number", ErrArch, it.name, key, v)
		}
		out[key] = n
	}
	if pos < len(positional) {
		return nil, fmt.Errorf("%w: %s: missing %s (%s)", ErrArch, it.name, positional[pos], usage(it.name))
	}
	return out, nil
}

func usage(name string) string {
	switch name {
	case "input":
		return "input(C,H,W) or input(D)"
	case "conv":
		return "conv(OUT,K[,stride=S][,pad=P])"
	case "dense":
		return "dense(OUT)"
	case "maxpool", "avgpool":
		return name + "(K[,stride=S])"
	case "groupnorm":
		return "groupnorm(GROUPS)"
	case "dropout":
		return "dropout(P)"
	}
	return name
}

func between(name, key string, v, lo, hi int) error {
	if v < lo || v > hi {
		return fmt.Errorf("%w: %s: %s=%d, want %d to %d", ErrArch, name, key, v, lo, hi)
	}
	return nil
}

func build(items []item, input Shape) (*Arch, error) {
	a := &Arch{Input: input}
	if len(items) > 0 && items[0].name == "input" {
		it := items[0]
		items = items[1:]
		if len(it.args) != 1 && len(it.args) != 3 {
			return nil, fmt.Errorf("%w: %s", ErrArch, usage("input"))
		}
		var d [3]int
		for i, s := range it.args {
			n, err := strconv.Atoi(s)
			if err != nil || strings.Trim(s, "0123456789") != "" || n < 1 || n > MaxSize {
				return nil, fmt.Errorf("%w: input: %q is not a whole number from 1 to %d", ErrArch, s, MaxSize)
			}
			d[i] = n
		}
		a.Input = Shape{d[0], 1, 1}
		if len(it.args) == 3 {
			a.Input = Shape{d[0], d[1], d[2]}
		}
	}
	if a.Input.C < 1 || a.Input.H < 1 || a.Input.W < 1 {
		return nil, fmt.Errorf("%w: the input's shape is not given: start the list with input(C,H,W), e.g. seq:input(1,28,28),conv(32,5,pad=2),…", ErrArch)
	}
	if int64(a.Input.C)*int64(a.Input.H)*int64(a.Input.W) > MaxFeatures {
		return nil, fmt.Errorf("%w: input %v has more than %d values", ErrArch, a.Input, MaxFeatures)
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("%w: no layers", ErrArch)
	}
	if len(items) > MaxLayers {
		return nil, fmt.Errorf("%w: %d layers, at most %d", ErrArch, len(items), MaxLayers)
	}
	cur := a.Input
	for i, it := range items {
		l := Layer{Kind: Kind(it.name), In: cur}
		var err error
		if l, err = l.parse(it); err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
		o := l.OutShape
		if o.C < 1 || o.H < 1 || o.W < 1 || int64(o.C)*int64(o.H)*int64(o.W) > MaxFeatures {
			return nil, fmt.Errorf("%w: layer %d (%s): output %dx%dx%d is empty or over %d values", ErrArch, i, l.Kind, o.C, o.H, o.W, MaxFeatures)
		}
		a.Layers = append(a.Layers, l)
		cur = o
	}
	if !cur.Flat() {
		return nil, fmt.Errorf("%w: the last layer's output %v is not flat: end with dense(CLASSES)", ErrArch, cur)
	}
	if cur.C < 2 {
		return nil, fmt.Errorf("%w: the last layer has %d output, want one per class (at least 2)", ErrArch, cur.C)
	}
	if p := a.Params(); p > MaxParams {
		return nil, fmt.Errorf("%w: %d parameters, at most %d", ErrArch, p, MaxParams)
	}
	return a, nil
}

func (l Layer) parse(it item) (Layer, error) {
	in := l.In
	l.OutShape = in
	noArgs := func() error {
		if len(it.args) > 0 {
			return fmt.Errorf("%w: %s takes no arguments", ErrArch, it.name)
		}
		return nil
	}
	switch l.Kind {
	case Conv:
		v, err := it.ints([]string{"out", "k"}, map[string]int{"stride": 1, "pad": 0})
		if err != nil {
			return l, err
		}
		l.Out, l.K, l.Stride, l.Pad = v["out"], v["k"], v["stride"], v["pad"]
		if err := firstErr(between("conv", "out", l.Out, 1, MaxSize), between("conv", "k", l.K, 1, MaxKernel),
			between("conv", "stride", l.Stride, 1, MaxKernel), between("conv", "pad", l.Pad, 0, l.K-1)); err != nil {
			return l, err
		}
		oh, ow := (in.H+2*l.Pad-l.K)/l.Stride+1, (in.W+2*l.Pad-l.K)/l.Stride+1
		if in.H+2*l.Pad < l.K || in.W+2*l.Pad < l.K {
			return l, fmt.Errorf("%w: conv: a %d×%d window does not fit input %v with pad %d", ErrArch, l.K, l.K, in, l.Pad)
		}
		if int64(in.C)*int64(l.K)*int64(l.K)*int64(oh)*int64(ow) > maxUnfolded || int64(l.Out)*int64(in.C)*int64(l.K)*int64(l.K) > maxUnfolded {
			return l, fmt.Errorf("%w: conv: its unfolded input (%d×%d×%d values) or its weight is over %d values", ErrArch, in.C*l.K*l.K, oh, ow, maxUnfolded)
		}
		l.OutShape = Shape{l.Out, oh, ow}
	case Dense:
		v, err := it.ints([]string{"out"}, nil)
		if err != nil {
			return l, err
		}
		l.Out = v["out"]
		if err := between("dense", "out", l.Out, 1, MaxSize); err != nil {
			return l, err
		}
		l.OutShape = Shape{l.Out, 1, 1}
	case MaxPool, AvgPool:
		v, err := it.ints([]string{"k"}, map[string]int{"stride": 0})
		if err != nil {
			return l, err
		}
		l.K, l.Stride = v["k"], v["stride"]
		if l.Stride == 0 {
			l.Stride = l.K
		}
		if err := firstErr(between(it.name, "k", l.K, 1, MaxKernel), between(it.name, "stride", l.Stride, 1, MaxKernel)); err != nil {
			return l, err
		}
		if l.K > in.H || l.K > in.W {
			return l, fmt.Errorf("%w: %s: a %d×%d window does not fit input %v", ErrArch, it.name, l.K, l.K, in)
		}
		l.OutShape = Shape{in.C, (in.H-l.K)/l.Stride + 1, (in.W-l.K)/l.Stride + 1}
	case GroupNorm:
		v, err := it.ints([]string{"groups"}, nil)
		if err != nil {
			return l, err
		}
		l.Groups = v["groups"]
		if err := between("groupnorm", "groups", l.Groups, 1, MaxGroups); err != nil {
			return l, err
		}
		if in.C%l.Groups != 0 {
			return l, fmt.Errorf("%w: groupnorm: %d groups do not divide %d channels", ErrArch, l.Groups, in.C)
		}
	case Dropout:
		if len(it.args) != 1 {
			return l, fmt.Errorf("%w: %s", ErrArch, usage("dropout"))
		}
		p, err := strconv.ParseFloat(it.args[0], 64)
		if err != nil || math.IsNaN(p) || p < 0 || p > maxDropoutRatio {
			return l, fmt.Errorf("%w: dropout: %q is not a probability from 0 to %g", ErrArch, it.args[0], maxDropoutRatio)
		}
		l.P = float64(float32(p))
	case ReLU, LayerNorm:
		if err := noArgs(); err != nil {
			return l, err
		}
	case Flatten:
		if err := noArgs(); err != nil {
			return l, err
		}
		l.OutShape = Shape{in.Size(), 1, 1}
	case "input":
		return l, fmt.Errorf("%w: input(…) must come first", ErrArch)
	default:
		return l, fmt.Errorf("%w: unknown layer %q: want conv, dense, relu, maxpool, avgpool, groupnorm, layernorm, dropout or flatten", ErrArch, clip(it.name))
	}
	return l, nil
}

// firstErr is the first of errs that is not nil: a layer reports its
// first bad argument.
func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
