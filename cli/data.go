package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
)

// MNIST's split sizes, the defaults and bounds of the flags that sample
// them.
const (
	mnistTrainExamples = 60000
	mnistTestExamples  = 10000
)

// PCG streams of the samples data mnist draws, so that the training subset,
// the evaluation subset and the split (data.Dirichlet's own stream) are
// independent draws from one seed.
const (
	trainSampleStream = 0x666c2d747261696e // "fl-train"
	evalSampleStream  = 0x666c2d6576616c73 // "fl-evals"
)

// mnistLoader returns the MNIST training and test sets and says where they
// were read from.
type mnistLoader func() (train, test *data.Dataset, from string, err error)

func loadMNIST() (train, test *data.Dataset, from string, err error) {
	dir, err := data.MNISTDir()
	if err != nil {
		return nil, nil, "", err
	}
	if train, test, err = data.LoadMNIST(dir); err != nil {
		return nil, nil, "", err
	}
	from = dir
	if dir == data.EmbeddedMNIST {
		from = "the copy built into fleetlearn"
	}
	return train, test, from, nil
}

// newDataCommand is the data command group: device datasets in the
// docs/DATASET.md format, made from public datasets or the user's own files,
// so a federation can be tried without writing code.
func newDataCommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "data",
		Short: "Write device datasets (docs/DATASET.md format) from public datasets, CSV files, images or IDX files",
		Example: "  fleetlearn data mnist --devices 3 --alpha 0.5 --out datasets\n" +
			"  fleetlearn data csv people.csv --label outcome --key user_id --devices 10 --out datasets\n" +
			"  fleetlearn data images photos --size 32x32 --devices 5 --out datasets\n" +
			"  fleetlearn data idx train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz --devices 10 --out fashion\n" +
			"  fleetlearn data gosrc --embedded --out gosrc --window 32 --stride 32 --max-devices 3\n" +
			"  fleetlearn data text --src corpus --out textsets",
	}
	cmd.AddCommand(newDataMNISTCommand(a, loadMNIST), newDataCSVCommand(a), newDataImagesCommand(a), newDataIDXCommand(a),
		newDataGoSrcCommand(a, installedGoroot), newDataTextCommand(a))
	return cmd
}

type mnistFlags struct {
	devices       int
	alpha         float64
	out           string
	seed          uint64
	trainExamples int
	evalExamples  int
	force         bool
}

func newDataMNISTCommand(_ *app, load mnistLoader) *cobra.Command {
	var f mnistFlags
	cmd := &cobra.Command{
		Use:   "mnist --devices N --alpha A --out DIR",
		Short: "Split MNIST into device datasets with label skew, plus a server evaluation set",
		Long: "mnist splits the MNIST training set across --devices datasets with the Dirichlet label skew\n" +
			"the demo uses (smaller --alpha: fewer digits per device) and writes them to DIR/device-0,\n" +
			"DIR/device-1, ... in the format of docs/DATASET.md, for fleetlearn-edge --dataset. It also\n" +
			"writes DIR/eval from the MNIST test split, for task create --server-eval-dataset. The split is\n" +
			"a function of --seed alone. MNIST is built into fleetlearn: nothing is downloaded.",
		Example: "  fleetlearn data mnist --devices 3 --alpha 0.5 --out datasets\n" +
			"  fleetlearn data mnist --devices 100 --alpha 0.1 --out datasets --train-examples 20000 --seed 7",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.check(mnistTrainExamples, mnistTestExamples); err != nil {
				return err
			}
			if err := checkOutDir(f.out, f.force); err != nil {
				return err
			}
			train, test, from, err := load()
			if err != nil {
				return fmt.Errorf("data mnist: %w", err)
			}
			// The loader's sets are MNIST's full splits; the bounds are
			// checked again against what it returned.
			if err := f.check(train.Len(), test.Len()); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "MNIST from %s: %d training, %d test examples\n", from, train.Len(), test.Len())
			return f.write(cmd.OutOrStdout(), cmd.ErrOrStderr(), train, test)
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&f.devices, "devices", 0, "device datasets to write (required)")
	fl.Float64Var(&f.alpha, "alpha", 0.5, fmt.Sprintf("Dirichlet concentration of the label skew, in [%g, %g]: 0.1 gives each device a few digits, 100 is close to IID", data.MinAlpha, data.MaxAlpha))
	fl.StringVar(&f.out, "out", "", "directory to write DIR/device-K and DIR/eval into (required)")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the split and the samples")
	fl.IntVar(&f.trainExamples, "train-examples", mnistTrainExamples, "training examples to split, a seeded sample of the training set")
	fl.IntVar(&f.evalExamples, "eval-examples", mnistTestExamples, "examples in DIR/eval, a seeded sample of the test set; 0 writes no evaluation set")
	fl.BoolVar(&f.force, "force", false, "write into a directory that is not empty, replacing the datasets there")
	for _, n := range []string{"devices", "out"} {
		cmd.MarkFlagRequired(n)
	}
	return cmd
}

// check refuses flag values out of range for training and test sets of the
// given sizes, in terms of flags.
func (f *mnistFlags) check(trainN, testN int) error {
	switch {
	case f.out == "":
		return fmt.Errorf("%w: --out must name a directory", ErrUsage)
	case f.trainExamples < 1 || f.trainExamples > trainN:
		return fmt.Errorf("%w: --train-examples %d must be between 1 and %d, the size of the training set", ErrUsage, f.trainExamples, trainN)
	case f.devices < 1 || f.devices > f.trainExamples:
		return fmt.Errorf("%w: --devices %d must be between 1 and --train-examples %d (every device gets at least one example)",
			ErrUsage, f.devices, f.trainExamples)
	case !(f.alpha >= data.MinAlpha && f.alpha <= data.MaxAlpha):
		return fmt.Errorf("%w: --alpha %g must be between %g and %g", ErrUsage, f.alpha, data.MinAlpha, data.MaxAlpha)
	case f.evalExamples < 0 || f.evalExamples > testN:
		return fmt.Errorf("%w: --eval-examples %d must be between 0 and %d, the size of the test set", ErrUsage, f.evalExamples, testN)
	}
	return nil
}

// checkOutDir refuses to mix new datasets into a directory holding anything
// unless --force says so.
func checkOutDir(dir string, force bool) error {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("--out: %w", err)
	case !fi.IsDir():
		return fmt.Errorf("%w: --out %s exists and is not a directory", ErrUsage, dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	if len(entries) > 0 && !force {
		return fmt.Errorf("%w: --out %s is not empty; pass --force to replace the datasets in it", ErrUsage, dir)
	}
	return nil
}

func (f *mnistFlags) write(w, warn io.Writer, train, test *data.Dataset) error {
	// The whole training set is split as it is, without a copy.
	pool := train
	if f.trainExamples < train.Len() {
		pool = train.Subset(sample(train.Len(), f.trainExamples, f.seed, trainSampleStream))
	}
	parts, err := data.Dirichlet(pool.Labels, pool.NumClasses, f.devices, f.alpha, f.seed)
	if err != nil {
		return fmt.Errorf("data mnist: %w", err)
	}
	alpha := strconv.FormatFloat(f.alpha, 'g', -1, 64)
	s := &deviceSplit{
		op: "data mnist", name: "mnist-dirichlet-" + alpha, how: "Dirichlet(alpha=" + alpha + ") label skew",
		seed: f.seed, train: pool, parts: parts,
	}
	if f.evalExamples > 0 {
		s.eval = test.Subset(sample(test.Len(), f.evalExamples, f.seed, evalSampleStream))
		s.evalName, s.evalFrom = "mnist-test", "the MNIST test split"
	}
	return s.write(w, warn, f.out)
}

// maxSplitRows bounds the per-device table; larger splits get the summary
// line alone.
const maxSplitRows = 32

// printSplit shows each device's size and its most frequent labels, then
// the spread of sizes.
func printSplit(w io.Writer, hist [][]int) {
	sizes := make([]int, len(hist))
	for k, h := range hist {
		for _, c := range h {
			sizes[k] += c
		}
	}
	if len(hist) <= maxSplitRows {
		t := newTable(w, "  DATASET", "EXAMPLES", "MOST FREQUENT LABELS")
		for k, h := range hist {
			t.row(fmt.Sprintf("  device-%d", k), strconv.Itoa(sizes[k]), topLabels(h, sizes[k], 3))
		}
		t.flush()
	}
	sorted := slices.Sorted(slices.Values(sizes))
	fmt.Fprintf(w, "  examples per device: min %d, median %d, max %d\n", sorted[0], sorted[len(sorted)/2], sorted[len(sorted)-1])
}

// topLabels lists up to n labels by decreasing count with their share of
// total, such as "3 (41%) 8 (20%) 1 (9%)".
func topLabels(counts []int, total, n int) string {
	labels := make([]int, len(counts))
	for i := range labels {
		labels[i] = i
	}
	slices.SortStableFunc(labels, func(a, b int) int { return counts[b] - counts[a] })
	var parts []string
	for _, l := range labels[:min(n, len(labels))] {
		if counts[l] == 0 {
			break
		}
		parts = append(parts, fmt.Sprintf("%d (%.0f%%)", l, 100*float64(counts[l])/float64(total)))
	}
	return strings.Join(parts, " ")
}

// sample returns k of the indices [0, n), sorted, drawn as a function of
// seed and stream alone; k == n returns them all.
func sample(n, k int, seed, stream uint64) []int {
	if k >= n {
		idx := make([]int, n)
		for i := range idx {
			idx[i] = i
		}
		return idx
	}
	idx := rand.New(rand.NewPCG(seed, stream)).Perm(n)[:k]
	slices.Sort(idx)
	return idx
}

// shellQuote quotes a path for the commands printed, when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-+:,=@%", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// installedGoroot asks the go command on PATH where its GOROOT is.
func installedGoroot() (string, error) {
	var stderr bytes.Buffer
	cmd := exec.Command("go", "env", "GOROOT")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if msg := strings.TrimSpace(stderr.String()); err != nil && msg != "" {
		return "", fmt.Errorf("go env GOROOT: %w: %s", err, msg)
	}
	if err != nil {
		return "", fmt.Errorf("go env GOROOT: %w", err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", errors.New("go env GOROOT printed nothing")
	}
	return dir, nil
}

// corpusFlags are the flags data gosrc and data text share.
type corpusFlags struct {
	out            string
	window, stride int
	maxDevices     int
	force          bool
}

func (f *corpusFlags) bind(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.out, "out", "", "directory to write DIR/devices/PART, DIR/eval and DIR/public into (required)")
	fl.IntVar(&f.window, "window", data.DefaultWindow, fmt.Sprintf("tokens per example, the feature dimension, in [1, %d]", data.MaxWindow))
	fl.IntVar(&f.stride, "stride", data.DefaultStride, "tokens between the starts of consecutive examples")
	fl.IntVar(&f.maxDevices, "max-devices", 0, "write at most this many device datasets, the first parts in name order; 0 writes all")
	fl.BoolVar(&f.force, "force", false, "write into a directory that is not empty, replacing the datasets there")
	cmd.MarkFlagRequired("out")
}

// The directories data gosrc and data text write under --out; device
// datasets go one level down so that no part's name can collide with the
// other two.
const (
	gosrcDevicesDir = "devices"
	gosrcEvalDir    = "eval"
	gosrcPublicDir  = "public"
	// corpusLicense is where a corpus's licence is written, next to the
	// datasets derived from it.
	corpusLicense = "LICENSE"
	// maxLicenseBytes bounds the licence file read from a GOROOT.
	maxLicenseBytes = 64 << 10
)

// corpus is a partitioned text corpus to write as datasets.
type corpus struct {
	from    string // where the text came from, for the output
	kind    string // prefix of the manifests' names: gosrc or text
	unit    string // what one part is: "package" or "part"
	parts   []data.GoPackage
	license []byte // written to DIR/LICENSE when not nil
	// public reports the parts of the public pretraining set; nil is
	// data.PublicGoPackage's hash rule.
	public func(name string) bool
}

func newDataGoSrcCommand(_ *app, goroot func() (string, error)) *cobra.Command {
	var (
		f        corpusFlags
		root     string
		embedded bool
	)
	cmd := &cobra.Command{
		Use:   "gosrc --out DIR",
		Short: "Split the Go standard library's source into next-token device datasets, one per package",
		Long: "gosrc turns the Go standard library's source into next-token prediction datasets\n" +
			"(docs/DATASET.md, \"Go source\"): each example is a window of --window byte-level tokens and its\n" +
			"label the token after it. About one package in ten, chosen by a hash of its path, is public and\n" +
			"goes to DIR/public for pool pretraining; every other package is one device, DIR/devices/PATH\n" +
			"with / in its path written as -. The last tenth of each device's windows is held out into\n" +
			"DIR/eval, for task create --server-eval-dataset. The source's licence is written to DIR/LICENSE.\n\n" +
			"The source is --goroot's, else that of the Go installation on PATH (go env GOROOT), else the\n" +
			"copy built into fleetlearn: " + data.EmbeddedGoVersion + "'s public packages and its first private ones, which\n" +
			"--embedded also selects where Go is installed. With --max-devices up to the copy's private\n" +
			"packages, the copy writes what --goroot with a " + data.EmbeddedGoVersion + " installation writes. The output\n" +
			"depends only on the source and the flags. Nothing is downloaded.",
		Example: "  fleetlearn data gosrc --out datasets\n" +
			"  fleetlearn data csv people.csv --label outcome --key user_id --devices 10 --out datasets\n" +
			"  fleetlearn data images photos --size 32x32 --devices 5 --out datasets\n" +
			"  fleetlearn data idx train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz --devices 10 --out fashion\n" +
			"  fleetlearn data gosrc --embedded --out gosrc --window 32 --stride 32 --max-devices 3   # the same files on every machine\n" +
			"  fleetlearn data gosrc --out datasets --goroot /usr/local/go --window 128 --stride 32 --max-devices 20",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.check(); err != nil {
				return err
			}
			if embedded && root != "" {
				return fmt.Errorf("%w: --embedded and --goroot name two sources; give one", ErrUsage)
			}
			if err := checkOutDir(f.out, f.force); err != nil {
				return err
			}
			c, err := goCorpus(cmd.ErrOrStderr(), root, embedded, goroot)
			if err != nil {
				return err
			}
			return f.write(cmd.OutOrStdout(), cmd.ErrOrStderr(), c)
		},
	}
	f.bind(cmd)
	cmd.Flags().StringVar(&root, "goroot", "", "Go installation whose src to read (default: go env GOROOT, else the copy built into fleetlearn)")
	cmd.Flags().BoolVar(&embedded, "embedded", false, "read the copy of "+data.EmbeddedGoVersion+"'s source built into fleetlearn, even where Go is installed")
	return cmd
}

// goCorpus reads the Go source that the flags select: --goroot, else the
// installation go env names, else the embedded copy.
func goCorpus(warn io.Writer, root string, embedded bool, goroot func() (string, error)) (*corpus, error) {
	c := &corpus{kind: "gosrc", unit: "package"}
	if root == "" && !embedded {
		var err error
		if root, err = goroot(); err != nil {
			fmt.Fprintf(warn, "no Go installation found (%v): using the copy of %s's source built into fleetlearn; --goroot DIR reads another\n",
				err, data.EmbeddedGoVersion)
			embedded = true
		}
	}
	if embedded {
		pkgs, err := data.EmbeddedGoSource(data.GoSourceOptions{})
		if err != nil {
			return nil, fmt.Errorf("data gosrc: %w", err)
		}
		c.parts, c.license = pkgs, data.EmbeddedGoLicense()
		c.from = fmt.Sprintf("the copy of %s's standard library built into fleetlearn (its public packages and first private ones)", data.EmbeddedGoVersion)
		return c, nil
	}
	src := filepath.Join(root, "src")
	if fi, err := os.Stat(src); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("%w: %s is not a directory; --goroot must name a Go installation (go env GOROOT), or leave it out for the copy built into fleetlearn",
			ErrUsage, src)
	}
	pkgs, err := data.GoSource(src, data.GoSourceOptions{})
	if err != nil {
		return nil, fmt.Errorf("data gosrc: %w", err)
	}
	c.parts, c.from = pkgs, src
	lic, err := readLicense(filepath.Join(root, "LICENSE"))
	if err != nil {
		fmt.Fprintf(warn, "warning: %v: no licence written; the Go source is under the BSD licence in a Go distribution's LICENSE file\n", err)
	}
	c.license = lic
	return c, nil
}

// readLicense reads a licence file of bounded size.
func readLicense(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxLicenseBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxLicenseBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxLicenseBytes)
	}
	return b, nil
}

func newDataTextCommand(_ *app) *cobra.Command {
	var (
		f      corpusFlags
		src    string
		public []string
	)
	cmd := &cobra.Command{
		Use:   "text --src DIR --out OUT",
		Short: "Split a directory of text files into next-token device datasets, one per subdirectory",
		Long: "text makes next-token prediction datasets, as data gosrc does, from any directory of text files:\n" +
			"each subdirectory of --src is one part, and its files at any depth, in path order, are its text.\n" +
			"Names starting with . or _, symbolic links and files with a NUL byte (binary) are skipped, and\n" +
			"files directly in --src belong to no part. Parts named by --public (by default about one in ten,\n" +
			"by a hash of the name) go to OUT/public for pool pretraining; every other part is one device,\n" +
			"OUT/devices/NAME, and the last tenth of its windows goes to OUT/eval. Tokens are bytes: tab,\n" +
			"newline and printable ASCII have their own ids, every other byte (UTF-8 beyond ASCII) shares\n" +
			fmt.Sprintf("one. A part is cut after %d MiB and the corpus after %d MiB; more than %d files and\n",
				data.DefaultTextMaxPartBytes>>20, data.DefaultTextMaxTotalBytes>>20, data.DefaultTextMaxEntries) +
			fmt.Sprintf("directories, or a tree deeper than %d, is refused.", data.DefaultTextMaxDepth),
		Example: "  fleetlearn data text --src corpus --out datasets --window 32 --stride 32   # corpus/alice, corpus/bob, ... one device each\n" +
			"  fleetlearn data text --src corpus --out datasets --public shared,wiki --max-devices 10",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.check(); err != nil {
				return err
			}
			if src == "" {
				return fmt.Errorf("%w: --src must name a directory whose subdirectories are the parts", ErrUsage)
			}
			if err := checkOutDir(f.out, f.force); err != nil {
				return err
			}
			parts, st, err := data.TextCorpus(src, data.TextCorpusOptions{})
			if errors.Is(err, data.ErrTooLarge) {
				return fmt.Errorf("%w: %v; give a smaller tree", ErrInput, err)
			}
			if err != nil {
				return fmt.Errorf("data text: %w", err)
			}
			warn := cmd.ErrOrStderr()
			if st.TopLevelFiles > 0 {
				fmt.Fprintf(warn, "warning: %d files directly in %s belong to no part: put them in a subdirectory to use them\n", st.TopLevelFiles, src)
			}
			if st.BinaryFiles > 0 {
				fmt.Fprintf(warn, "skipped %d binary files (with a NUL byte)\n", st.BinaryFiles)
			}
			if len(parts) == 0 {
				return fmt.Errorf("%w: %s has no subdirectory holding text; each subdirectory of --src is one device's part", ErrUsage, src)
			}
			c := &corpus{kind: "text", unit: "part", parts: parts, from: src}
			if len(public) > 0 {
				names := map[string]bool{}
				for _, p := range parts {
					names[p.Path] = true
				}
				chosen := map[string]bool{}
				for _, n := range public {
					if !names[n] {
						return fmt.Errorf("%w: --public %s: %s has no part (subdirectory with text) of that name", ErrUsage, n, src)
					}
					chosen[n] = true
				}
				c.public = func(name string) bool { return chosen[name] }
			}
			return f.write(cmd.OutOrStdout(), warn, c)
		},
	}
	f.bind(cmd)
	cmd.Flags().StringVar(&src, "src", "", "directory whose subdirectories are the parts (required)")
	cmd.Flags().StringSliceVar(&public, "public", nil, "parts (subdirectory names) that form the public pretraining set (default: about one in ten, by a hash of the name)")
	cmd.MarkFlagRequired("src")
	return cmd
}

func (f *corpusFlags) check() error {
	switch {
	case f.out == "":
		return fmt.Errorf("%w: --out must name a directory", ErrUsage)
	case f.window < 1 || f.window > data.MaxWindow:
		return fmt.Errorf("%w: --window %d must be between 1 and %d", ErrUsage, f.window, data.MaxWindow)
	case f.stride < 1:
		return fmt.Errorf("%w: --stride %d must be at least 1", ErrUsage, f.stride)
	case f.maxDevices < 0:
		return fmt.Errorf("%w: --max-devices %d must be 0 (all) or more", ErrUsage, f.maxDevices)
	}
	return nil
}

// gosrcDirName is a package path as one directory name: every byte outside
// letters, digits, '.', '_' and '-' becomes '-', so "net/http" is
// "net-http".
func gosrcDirName(path string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			return r
		}
		return '-'
	}, path)
}

func (f *corpusFlags) write(w, warn io.Writer, c *corpus) error {
	op := "data " + c.kind
	opts := data.WindowOptions{Window: f.window, Stride: f.stride}
	var (
		devices     []data.GoPackageSplit
		public      []*data.Dataset
		publicPaths []string
		textBytes   int
	)
	dirs := map[string]string{}
	for _, p := range c.parts {
		s, err := data.SplitGoPackage(p, opts)
		if err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		if c.public != nil {
			s.Public = c.public(p.Path)
		}
		textBytes += len(p.Text)
		if s.Public {
			public = append(public, s.Train, s.HeldOut)
			publicPaths = append(publicPaths, p.Path)
			continue
		}
		if f.maxDevices > 0 && len(devices) == f.maxDevices {
			continue
		}
		if s.Train.Len() == 0 {
			// Too short for one training window at this --window.
			continue
		}
		name := gosrcDirName(p.Path)
		if other, dup := dirs[name]; dup {
			return fmt.Errorf("%s: %ss %s and %s would both be written to %s", op, c.unit, other, p.Path, name)
		}
		dirs[name] = p.Path
		devices = append(devices, s)
	}
	if len(devices) == 0 {
		return fmt.Errorf("%w: %s holds no private %s long enough for a --window %d training example", ErrUsage, c.from, c.unit, f.window)
	}

	abs, err := filepath.Abs(f.out)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	devRoot := filepath.Join(f.out, gosrcDevicesDir)
	if err := os.MkdirAll(devRoot, 0o700); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	held := make([]*data.Dataset, 0, len(devices))
	for _, s := range devices {
		if err := data.WriteDir(filepath.Join(devRoot, gosrcDirName(s.Path)), s.Train, c.kind+"/"+s.Path); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		held = append(held, s.HeldOut)
	}
	eval, err := data.ConcatDatasets(held...)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := data.WriteDir(filepath.Join(f.out, gosrcEvalDir), eval, c.kind+"-heldout"); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	var pub *data.Dataset
	if len(public) > 0 {
		if pub, err = data.ConcatDatasets(public...); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		if err := data.WriteDir(filepath.Join(f.out, gosrcPublicDir), pub, c.kind+"-public"); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
	}
	if c.license != nil {
		if err := atomicfile.WriteFile(filepath.Join(f.out, corpusLicense), c.license, 0o644); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
	}
	// Device datasets of an earlier run with other parts would otherwise
	// pass for part of this one.
	if entries, err := os.ReadDir(devRoot); err == nil {
		for _, e := range entries {
			if _, ours := dirs[e.Name()]; !ours {
				fmt.Fprintf(warn, "warning: %s is not part of this split; remove it before enrolling devices on this directory\n",
					filepath.Join(devRoot, e.Name()))
			}
		}
	}

	what := "Text"
	if c.kind == "gosrc" {
		what = "Go source"
	}
	fmt.Fprintf(w, "%s from %s: %s, %d bytes; windows of %d tokens, stride %d, %d-token vocabulary\n",
		what, c.from, plural(len(c.parts), c.unit), textBytes, f.window, f.stride, data.VocabSize)
	fmt.Fprintf(w, "wrote %d device datasets to %s:\n", len(devices), filepath.Join(abs, gosrcDevicesDir))
	sizes := make([]int, len(devices))
	for i, s := range devices {
		sizes[i] = s.Train.Len()
	}
	if len(devices) <= maxSplitRows {
		t := newTable(w, "  DATASET", strings.ToUpper(c.unit), "EXAMPLES", "HELD OUT")
		for _, s := range devices {
			t.row("  "+gosrcDirName(s.Path), s.Path, strconv.Itoa(s.Train.Len()), strconv.Itoa(s.HeldOut.Len()))
		}
		t.flush()
	}
	sorted := slices.Sorted(slices.Values(sizes))
	fmt.Fprintf(w, "  examples per device: min %d, median %d, max %d\n", sorted[0], sorted[len(sorted)/2], sorted[len(sorted)-1])
	fmt.Fprintf(w, "wrote the server evaluation set %s: %d held-out examples of those devices' %ss\n",
		filepath.Join(abs, gosrcEvalDir), eval.Len(), c.unit)
	if pub != nil {
		fmt.Fprintf(w, "wrote the public pretraining set %s: %d examples of %s (%s)\n",
			filepath.Join(abs, gosrcPublicDir), pub.Len(), plural(len(publicPaths), c.unit), strings.Join(publicPaths, " "))
	} else {
		fmt.Fprintf(w, "no %s fell in the public bucket: no public pretraining set written\n", c.unit)
	}
	if c.license != nil {
		fmt.Fprintf(w, "wrote the source's licence to %s: keep it with the datasets, which are derived from the source\n",
			filepath.Join(abs, corpusLicense))
	}
	fmt.Fprintf(w, "\nNext, for each device dataset, each agent with its own --data-dir:\n")
	fmt.Fprintf(w, "  fleetlearn-edge --data-dir edge-K --dataset %s\n", shellQuote(filepath.Join(abs, gosrcDevicesDir, strings.ToUpper(c.unit))))
	fmt.Fprintf(w, "and have the server evaluate on %s with task create --server-eval-dataset.\n", shellQuote(filepath.Join(abs, gosrcEvalDir)))
	return nil
}
