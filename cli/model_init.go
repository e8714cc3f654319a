package cli

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	"github.com/fleetlearn/fleetlearn/internal/countio"
	"github.com/fleetlearn/fleetlearn/internal/ident"
	"github.com/fleetlearn/fleetlearn/internal/smallfile"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/seq"
	"github.com/fleetlearn/fleetlearn/model/train"
)

// Bounds of --arch. A layer wider than 65536 or deeper than 16 layers is
// almost certainly a typo, and the file must stay under the server's
// default upload limit for model import (1 GiB), less room for the header.
const (
	archPrefix          = "mlp:"
	minArchSizes        = 2
	maxArchSizes        = 16
	maxLayerSize        = 65536
	maxInitModelBytes   = 1 << 30
	initHeaderAllowance = 64 << 10
)

// newModelInitCommand writes a seeded, untrained base model, so that a
// federation can start from nothing but the binaries.
func newModelInitCommand(_ *app) *cobra.Command {
	var (
		arch, out, name string
		input, weights  string
		seed            uint64
		force           bool
	)
	cmd := &cobra.Command{
		Use:   "init --arch mlp:SIZES|lm:SIZES|seq:LAYERS|@FILE.json -o FILE",
		Short: "Write a seeded, untrained model to a safetensors file, for model import",
		Long: "init writes a multi-layer perceptron with the layer sizes of --arch (input first, classes last;\n" +
			"ReLU between layers), its weights drawn He-uniform from --seed and its biases zero, as the demo\n" +
			"initialises its base model. The same --arch and --seed always give the same file. Tensors are\n" +
			"named fc<i>.weight [out, in] and fc<i>.bias [out], as PyTorch's nn.Linear stores them, which is\n" +
			"what the example mlp update module trains.\n\n" +
			"With lm:d=D,layers=L,context=T[,vocab=V][,hidden=F] it writes the decoder-only transformer the\n" +
			"example lm module trains (package model/lm): width D, L blocks, windows of T tokens (the\n" +
			"--window of `fleetlearn data gosrc`), a vocabulary of V ids (98, the byte vocabulary of data\n" +
			"gosrc, by default) and an MLP of width F (4·D by default).\n\n" +
			"With seq:LAYERS (or @FILE.json holding {\"input\": [C, H, W], \"layers\": [\"conv(32,5,pad=2)\", …]})\n" +
			"it writes a network of any layer list the seq update module trains: conv(OUT,K[,stride=S][,pad=P]),\n" +
			"dense(OUT), relu, maxpool(K[,stride=S]), avgpool(K[,stride=S]), groupnorm(G), layernorm,\n" +
			"dropout(P) and flatten, on examples of --input's shape, ending in dense(CLASSES). The list is\n" +
			"kept in the file (metadata fleetlearn.arch), so the module, the server's evaluation and model\n" +
			"export read the same network. Tensors are named <i>.weight and <i>.bias after the layer's\n" +
			"position, as PyTorch's nn.Sequential names them; --weights takes them from a safetensors file\n" +
			"trained elsewhere instead of drawing them (docs/MODELS.md).",
		Example: "  fleetlearn model init --arch mlp:784,128,10 -o base.safetensors\n" +
			"  fleetlearn model init --arch mlp:784,256,64,10 --seed 7 -o base.safetensors --name mnist-deep\n" +
			"  fleetlearn model init --arch lm:d=128,layers=4,context=64 -o lm.safetensors --name gocode-init\n" +
			"  fleetlearn model init --arch 'seq:conv(32,5,pad=2),relu,maxpool(2),conv(64,5,pad=2),relu,maxpool(2),dense(2048),relu,dense(10)' -o cnn.safetensors --name fmnist-cnn",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var (
				m      *model.Model
				params int64
			)
			if strings.HasPrefix(arch, seq.Prefix) || strings.HasPrefix(arch, "@") {
				a, err := parseSeqArch(arch, input)
				if err != nil {
					return err
				}
				if weights != "" {
					if m, err = seqWeights(a, weights); err != nil {
						return err
					}
				} else if m, err = train.InitSeq(a, seed); err != nil {
					return fmt.Errorf("%w: --arch %q: %v", ErrUsage, arch, err)
				}
				params = int64(m.Layout().Size())
				arch = a.String()
			} else if weights != "" {
				return fmt.Errorf("%w: --weights goes with a seq: architecture", ErrUsage)
			} else if strings.HasPrefix(arch, lmArchPrefix) {
				c, err := parseLMArch(arch)
				if err != nil {
					return err
				}
				if m, err = train.InitLM(c, seed); err != nil {
					return fmt.Errorf("%w: --arch %q: %v", ErrUsage, arch, err)
				}
				params = int64(m.Layout().Size())
			} else {
				sizes, n, err := parseArch(arch)
				if err != nil {
					return err
				}
				if m, err = train.InitMLP(sizes, seed); err != nil {
					return fmt.Errorf("model init: %w", err)
				}
				params = n
			}
			if err := ident.Name(name); err != nil {
				return fmt.Errorf("%w: --name %q %v", ErrUsage, name, err)
			}
			// Fail before the work, not only at the end.
			if _, err := os.Lstat(out); err == nil && !force {
				return fmt.Errorf("%w: %s exists; pass --force to replace it", ErrUsage, out)
			}
			if !cmd.Flags().Changed("name") && m.Tensors[0].Name == "tok_emb.weight" {
				name = "gocode-init"
			}
			m.Lineage.Source = fmt.Sprintf("fleetlearn model init --arch %s --seed %d", arch, seed)
			if weights != "" {
				m.Lineage.Source = fmt.Sprintf("fleetlearn model init --arch %s --weights %s", arch, filepath.Base(weights))
			}
			sum, size, err := writeModelFile(out, m, force)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "wrote %s: %s, %d parameters in %d tensors, seed %d (%s)\n",
				out, arch, params, len(m.Tensors), seed, byteSize(uint64(size)))
			printModelHashes(w, "", sum, m.HashHex())
			_, err = fmt.Fprintf(w, "next: fleetlearn model import %s --name %s\n", shellQuote(out), shellQuote(name))
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&arch, "arch", "", fmt.Sprintf("architecture: mlp: then %d to %d comma-separated layer sizes from 1 to %d, input first; or lm:d=D,layers=L,context=T[,vocab=V][,hidden=F]; or seq:LAYERS or @FILE.json, a layer list (required)",
		minArchSizes, maxArchSizes, maxLayerSize))
	fl.StringVar(&input, "input", "1x28x28", "seq: one example's shape, CxHxW or D, when the list does not start with input(…); 1x28x28 is what data mnist and data idx write")
	fl.StringVar(&weights, "weights", "", "seq: take the tensors from this safetensors file (e.g. a PyTorch state dict saved with safetensors) instead of drawing them")
	fl.StringVarP(&out, "output", "o", "", "safetensors file to write (required); it appears only once complete")
	fl.Uint64Var(&seed, "seed", 1, "seed of the initial weights")
	fl.StringVar(&name, "name", "mnist", "model name for the printed model import command (gocode-init for lm:, the pool then trains it into gocode)")
	fl.BoolVar(&force, "force", false, "replace --output if it exists")
	for _, n := range []string{"arch", "output"} {
		cmd.MarkFlagRequired(n)
	}
	return cmd
}

// parseArch parses --arch strictly: "mlp:" and then 2 to 16 layer sizes,
// each decimal digits only, from 1 to 65536. It returns the sizes and the
// model's parameter count, which must fit the import limit.
func parseArch(arch string) ([]int, int64, error) {
	usage := func(format string, args ...any) error {
		return fmt.Errorf("%w: --arch %q: "+format, append([]any{ErrUsage, arch}, args...)...)
	}
	spec, ok := strings.CutPrefix(arch, archPrefix)
	if !ok {
		return nil, 0, usage("want %sSIZES, such as mlp:784,128,10, or %sd=D,layers=L,context=T", archPrefix, lmArchPrefix)
	}
	fields := strings.Split(spec, ",")
	if len(fields) < minArchSizes || len(fields) > maxArchSizes {
		return nil, 0, usage("%d layer sizes, want %d to %d: the input size, any hidden sizes, the number of classes",
			len(fields), minArchSizes, maxArchSizes)
	}
	sizes := make([]int, len(fields))
	for i, s := range fields {
		n, err := strconv.Atoi(s)
		if s == "" || strings.Trim(s, "0123456789") != "" || err != nil || n < 1 || n > maxLayerSize {
			return nil, 0, usage("layer size %q is not a whole number from 1 to %d", s, maxLayerSize)
		}
		sizes[i] = n
	}
	var params int64
	for i := 1; i < len(sizes); i++ {
		params += int64(sizes[i-1])*int64(sizes[i]) + int64(sizes[i])
	}
	if params*4 > maxInitModelBytes-initHeaderAllowance {
		return nil, 0, usage("%d parameters (%s of float32) exceed what model import accepts by default (%s)",
			params, byteSize(uint64(params)*4), byteSize(maxInitModelBytes))
	}
	return sizes, params, nil
}

// writeModelFile writes m as safetensors to path atomically, never over an
// existing file unless force, and returns the file's SHA-256 and size.
func writeModelFile(path string, m *model.Model, force bool) (string, int64, error) {
	f, err := atomicfile.Create(path, 0o644)
	if err != nil {
		return "", 0, fmt.Errorf("model init: %w", err)
	}
	defer f.Abort()
	h := sha256.New()
	cw := &countio.Writer{W: io.MultiWriter(f, h)}
	bw := bufio.NewWriterSize(cw, 64<<10)
	if err := model.WriteSafetensors(bw, m); err != nil {
		return "", 0, fmt.Errorf("model init: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return "", 0, fmt.Errorf("model init: %w", err)
	}
	commit := f.CommitNew
	if force {
		commit = f.Commit
	}
	if err := commit(); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return "", 0, fmt.Errorf("%w: %s exists; pass --force to replace it", ErrUsage, path)
		}
		return "", 0, fmt.Errorf("model init: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), cw.N, nil
}

const lmArchPrefix = "lm:"

// parseLMArch parses --arch lm:KEY=N,...: d, layers and context are
// required, vocab and hidden optional; every key once, values decimal, and
// the model must fit the import limit.
func parseLMArch(arch string) (train.LMConfig, error) {
	usage := func(format string, args ...any) error {
		return fmt.Errorf("%w: --arch %q: "+format, append([]any{ErrUsage, arch}, args...)...)
	}
	c := train.LMConfig{Vocab: data.VocabSize}
	fields := map[string]*int{"d": &c.Dim, "layers": &c.Layers, "context": &c.Context, "vocab": &c.Vocab, "hidden": &c.Hidden}
	seen := map[string]bool{}
	for _, kv := range strings.Split(strings.TrimPrefix(arch, lmArchPrefix), ",") {
		k, v, ok := strings.Cut(kv, "=")
		dst, known := fields[k]
		if !ok || !known {
			return c, usage("%q is not KEY=N with KEY one of d, layers, context, vocab, hidden", kv)
		}
		if seen[k] {
			return c, usage("%s given twice", k)
		}
		seen[k] = true
		n, err := strconv.Atoi(v)
		if v == "" || strings.Trim(v, "0123456789") != "" || err != nil || n < 1 || n > maxLayerSize {
			return c, usage("%s=%q is not a whole number from 1 to %d", k, v, maxLayerSize)
		}
		*dst = n
	}
	for _, k := range []string{"d", "layers", "context"} {
		if !seen[k] {
			return c, usage("%s=N is required (for example lm:d=128,layers=4,context=64)", k)
		}
	}
	h := int64(c.Hidden)
	if h == 0 {
		h = 4 * int64(c.Dim)
	}
	d := int64(c.Dim)
	params := int64(c.Vocab)*d*2 + int64(c.Context)*d + int64(c.Layers)*(4*d*d+2*h*d+h+7*d) + 2*d
	if params*4 > maxInitModelBytes-initHeaderAllowance {
		return c, usage("%d parameters (%s of float32) exceed what model import accepts by default (%s)",
			params, byteSize(uint64(params)*4), byteSize(maxInitModelBytes))
	}
	return c, nil
}

// parseSeqArch parses a layer list given inline (seq:…) or as @FILE.json,
// with input the shape to use when the list has none.
func parseSeqArch(arch, input string) (*seq.Arch, error) {
	usage := func(err error) error {
		return fmt.Errorf("%w: --arch %q: %v", ErrUsage, arch, err)
	}
	if path, ok := strings.CutPrefix(arch, "@"); ok {
		b, err := smallfile.Read(path, 1<<20)
		if err != nil {
			return nil, fmt.Errorf("%w: --arch: %v", ErrUsage, err)
		}
		a, err := seq.ParseJSON(b)
		if err != nil {
			return nil, usage(err)
		}
		return a, nil
	}
	var in seq.Shape
	dims := strings.Split(input, "x")
	if len(dims) != 1 && len(dims) != 3 {
		return nil, fmt.Errorf("%w: --input %q: want CxHxW (such as 1x28x28) or D", ErrUsage, input)
	}
	v := [3]int{1, 1, 1}
	for i, d := range dims {
		n, err := strconv.Atoi(d)
		if err != nil || n < 1 || n > seq.MaxSize {
			return nil, fmt.Errorf("%w: --input %q: %q is not a whole number from 1 to %d", ErrUsage, input, d, seq.MaxSize)
		}
		v[i] = n
	}
	in = seq.Shape{C: v[0], H: v[1], W: v[2]}
	a, err := seq.ParseWithInput(arch, in)
	if err != nil {
		return nil, usage(err)
	}
	if a.Params()*4 > maxInitModelBytes-initHeaderAllowance {
		return nil, usage(fmt.Errorf("%d parameters (%s of float32) exceed what model import accepts by default (%s)",
			a.Params(), byteSize(uint64(a.Params())*4), byteSize(maxInitModelBytes)))
	}
	return a, nil
}

// seqWeights reads a safetensors file trained elsewhere and orders its
// tensors as a's: every tensor the list needs, with its PyTorch shape, and
// nothing else (LoRA adapters of dense layers aside).
func seqWeights(a *seq.Arch, path string) (*model.Model, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: --weights: %v", ErrUsage, err)
	}
	defer f.Close()
	m, err := model.ReadSafetensors(bufio.NewReader(f), model.WithMaxTensorBytes(maxInitModelBytes))
	if err != nil {
		return nil, fmt.Errorf("model init: --weights %s: %w", path, err)
	}
	names := make([]string, len(m.Tensors))
	shapes := make([][]int, len(m.Tensors))
	for i, t := range m.Tensors {
		names[i], shapes[i] = t.Name, t.Shape
	}
	if _, err := a.Bind(names, shapes); err != nil {
		return nil, fmt.Errorf("%w: --weights %s does not fit the layer list: %v", ErrUsage, path, err)
	}
	byName := map[string]model.Tensor{}
	for _, t := range m.Tensors {
		byName[t.Name] = t
	}
	var ts []model.Tensor
	for _, p := range a.ParamList() {
		ts = append(ts, byName[p.Name])
		if !p.Bias {
			base := strings.TrimSuffix(p.Name, ".weight")
			for _, ad := range []string{base + ".lora_a", base + ".lora_b"} {
				if t, ok := byName[ad]; ok {
					ts = append(ts, t)
				}
			}
		}
	}
	out, err := model.New(ts...)
	if err != nil {
		return nil, fmt.Errorf("model init: --weights %s: %w", path, err)
	}
	out.Arch = a.String()
	return out, nil
}
