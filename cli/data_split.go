package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/data"
)

// classesFile lists the class names of a labelled split, one a line: line K
// (from 0) names class K.
const classesFile = "classes.txt"

// deviceSplit is what data mnist, csv, images and idx write to --out:
// OUT/device-K for each part, OUT/eval when there is an evaluation set, and
// the class names when the source had them.
type deviceSplit struct {
	op       string        // command, such as "data csv", prefixing errors
	name     string        // manifest name of the devices, before "/device-K"
	how      string        // the split, as printed: "Dirichlet(alpha=0.5) label skew"
	seed     uint64        // printed
	train    *data.Dataset // the examples split across devices
	parts    [][]int       // indices into train, one slice per device
	eval     *data.Dataset // nil writes no evaluation set
	evalName string        // manifest name of the evaluation set
	evalFrom string        // where the evaluation set came from, as printed
	classes  []string      // written to OUT/classes.txt when not nil
}

// write stages every dataset in a directory next to out and moves it into
// place only once all are written, so an error leaves no half-written split
// behind: a new out is renamed into place whole, and into an existing one
// (--force) each dataset replaces the one of its name.
func (s *deviceSplit) write(w, warn io.Writer, out string) error {
	hist, err := data.Stats(s.train.Labels, s.train.NumClasses, s.parts)
	if err != nil {
		return fmt.Errorf("%s: %w", s.op, err)
	}
	out = filepath.Clean(out)
	abs, err := filepath.Abs(out)
	if err != nil {
		return fmt.Errorf("%s: %w", s.op, err)
	}
	parent := filepath.Dir(out)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return fmt.Errorf("%s: %w", s.op, err)
	}
	stage, err := os.MkdirTemp(parent, "."+filepath.Base(out)+".tmp-*")
	if err != nil {
		return fmt.Errorf("%s: %w", s.op, err)
	}
	// After a successful install stage no longer exists and this is a no-op.
	defer os.RemoveAll(stage)

	idx := make([]int, 0, s.train.Len())
	for k, part := range s.parts {
		idx = append(idx[:0], part...)
		name := fmt.Sprintf("device-%d", k)
		if err := data.WriteDir(filepath.Join(stage, name), s.train.Subset(idx), s.name+"/"+name); err != nil {
			return fmt.Errorf("%s: %w", s.op, err)
		}
	}
	if s.eval != nil {
		if err := data.WriteDir(filepath.Join(stage, "eval"), s.eval, s.evalName); err != nil {
			return fmt.Errorf("%s: %w", s.op, err)
		}
	}
	if s.classes != nil {
		text := strings.Join(s.classes, "\n") + "\n"
		if err := os.WriteFile(filepath.Join(stage, classesFile), []byte(text), 0o600); err != nil {
			return fmt.Errorf("%s: %w", s.op, err)
		}
	}
	if err := install(stage, out); err != nil {
		return fmt.Errorf("%s: %w", s.op, err)
	}

	// Datasets of an earlier, larger split would otherwise pass for part of
	// this one.
	for k := len(s.parts); ; k++ {
		stale := filepath.Join(out, fmt.Sprintf("device-%d", k))
		if _, err := os.Stat(stale); err != nil {
			break
		}
		fmt.Fprintf(warn, "warning: %s is not part of this split; remove it before enrolling devices on this directory\n", stale)
	}

	fmt.Fprintf(w, "wrote %d device datasets to %s: %d training examples, %s, seed %d\n",
		len(s.parts), abs, s.train.Len(), s.how, s.seed)
	printSplit(w, hist)
	if s.eval != nil {
		fmt.Fprintf(w, "wrote the server evaluation set %s: %d examples of %s\n",
			filepath.Join(abs, "eval"), s.eval.Len(), s.evalFrom)
	}
	if s.classes != nil {
		fmt.Fprintf(w, "wrote the %d class names to %s: line K (from 0) names label K\n",
			len(s.classes), filepath.Join(abs, classesFile))
	}

	last := "0"
	if len(s.parts) > 1 {
		last = "0 to " + strconv.Itoa(len(s.parts)-1)
	}
	fmt.Fprintf(w, "\nNext, for each device K (%s), each agent with its own --data-dir:\n", last)
	fmt.Fprintf(w, "  fleetlearn device token --ttl 1h > token-K\n")
	fmt.Fprintf(w, "  fleetlearn-edge enroll --api HOST:7070 --ca ca.crt --token-file token-K --data-dir edge-K\n")
	fmt.Fprintf(w, "  fleetlearn-edge --data-dir edge-K --dataset %s\n", shellQuote(filepath.Join(abs, "device-K")))
	if s.eval != nil {
		fmt.Fprintf(w, "and have the server evaluate each committed model on the evaluation set (a path on the server's host):\n")
		fmt.Fprintf(w, "  fleetlearn task create --name NAME --model VERSION --module SHA256 --server-eval-dataset %s ...\n",
			shellQuote(filepath.Join(abs, "eval")))
	}
	return nil
}

// install moves the staged directory to out: whole when out is missing or
// empty, else entry by entry, each replacing the entry of its name.
func install(stage, out string) error {
	entries, err := os.ReadDir(out)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return os.Rename(stage, out)
	case err != nil:
		return err
	case len(entries) == 0:
		if err := os.Remove(out); err != nil {
			return err
		}
		return os.Rename(stage, out)
	}
	staged, err := os.ReadDir(stage)
	if err != nil {
		return err
	}
	for _, e := range staged {
		dst := filepath.Join(out, e.Name())
		if err := os.RemoveAll(dst); err != nil {
			return err
		}
		if err := os.Rename(filepath.Join(stage, e.Name()), dst); err != nil {
			return err
		}
	}
	return nil
}

// splitFlags are the flags data csv, images and idx share: how to split one
// labelled set into device datasets and an evaluation set.
type splitFlags struct {
	devices      int
	alpha        float64
	evalFraction float64
	out          string
	seed         uint64
	force        bool
}

// defaultEvalFraction is the share of examples held out for DIR/eval.
const defaultEvalFraction = 0.1

func (f *splitFlags) bind(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.IntVar(&f.devices, "devices", 0, "device datasets to write (required)")
	fl.Float64Var(&f.alpha, "alpha", 0.5, fmt.Sprintf("Dirichlet concentration of the label skew, in [%g, %g]: 0.1 gives each device a few classes, 100 is close to IID; 0 splits IID", data.MinAlpha, data.MaxAlpha))
	fl.Float64Var(&f.evalFraction, "eval-fraction", defaultEvalFraction, "share of the examples, a seeded sample, held out into DIR/eval, in [0, 0.9]; 0 writes no evaluation set")
	fl.StringVar(&f.out, "out", "", "directory to write DIR/device-K, DIR/eval and DIR/"+classesFile+" into (required)")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the split and the evaluation sample")
	fl.BoolVar(&f.force, "force", false, "write into a directory that is not empty, replacing the datasets there")
	for _, n := range []string{"devices", "out"} {
		cmd.MarkFlagRequired(n)
	}
}

// check refuses flag values out of range before any input is read.
func (f *splitFlags) check() error {
	switch {
	case f.out == "":
		return fmt.Errorf("%w: --out must name a directory", ErrUsage)
	case f.devices < 1:
		return fmt.Errorf("%w: --devices %d must be at least 1", ErrUsage, f.devices)
	case f.alpha != 0 && !(f.alpha >= data.MinAlpha && f.alpha <= data.MaxAlpha):
		return fmt.Errorf("%w: --alpha %g must be 0 (IID) or between %g and %g", ErrUsage, f.alpha, data.MinAlpha, data.MaxAlpha)
	case !(f.evalFraction >= 0 && f.evalFraction <= 0.9):
		return fmt.Errorf("%w: --eval-fraction %g must be between 0 and 0.9", ErrUsage, f.evalFraction)
	}
	return checkOutDir(f.out, f.force)
}

// labelled is one labelled set read by data csv, images or idx, before it
// is split.
type labelled struct {
	set     *data.Dataset
	classes []string // class names by index; nil when labels are their own names
	// keys, when not nil, is each example's group (such as a user id), and
	// the split is natural: every group goes whole to one device.
	keys    []string
	keyName string // the column keys came from, as printed
	from    string // what was read, as printed
}

// fromData sorts an error of package data's readers into the CLI's
// sentinels, keeping its message: a bad argument is ErrUsage, a file that
// is malformed or past a bound ErrInput.
func fromData(err error) error {
	switch {
	case errors.Is(err, data.ErrInvalidArgument):
		return dataError{err, ErrUsage}
	case errors.Is(err, data.ErrCSV), errors.Is(err, data.ErrImage),
		errors.Is(err, data.ErrTooLarge), errors.Is(err, data.ErrNoFeatures):
		return dataError{err, ErrInput}
	}
	return err
}

type dataError struct{ err, kind error }

func (e dataError) Error() string   { return e.err.Error() }
func (e dataError) Unwrap() []error { return []error{e.err, e.kind} }

// split holds out the evaluation sample, partitions the rest as the flags
// say and writes the datasets. kind prefixes the manifests' names.
func (f *splitFlags) split(w, warn io.Writer, op, kind string, in labelled) error {
	n := in.set.Len()
	held := int(math.Round(f.evalFraction * float64(n)))
	if f.evalFraction > 0 && held == 0 {
		held = 1
	}
	evalIdx := sample(n, held, f.seed, evalSampleStream)
	if held == 0 {
		evalIdx = nil
	}
	rest := make([]int, 0, n-len(evalIdx))
	for i, j := 0, 0; i < n; i++ {
		if j < len(evalIdx) && evalIdx[j] == i {
			j++
			continue
		}
		rest = append(rest, i)
	}
	if f.devices > len(rest) {
		return fmt.Errorf("%w: --devices %d is more than the %d training examples (after --eval-fraction %g): every device needs one",
			ErrUsage, f.devices, len(rest), f.evalFraction)
	}
	train := in.set.Subset(rest)

	s := &deviceSplit{op: op, seed: f.seed, train: train, classes: in.classes}
	var err error
	switch {
	case in.keys != nil:
		keys := make([]string, len(rest))
		for i, j := range rest {
			keys[i] = in.keys[j]
		}
		var groups int
		if s.parts, groups, err = byKey(keys, f.devices); err != nil {
			return err
		}
		s.name = kind + "-by-key"
		s.how = fmt.Sprintf("natural split by column %q (%d keys)", in.keyName, groups)
	case f.alpha == 0:
		if s.parts, err = data.IID(train.Len(), f.devices, f.seed); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		s.name, s.how = kind+"-iid", "IID split"
	default:
		s.parts, err = data.Dirichlet(train.Labels, train.NumClasses, f.devices, f.alpha, f.seed)
		if errors.Is(err, data.ErrPartition) {
			return fmt.Errorf("%w: %v; raise --alpha, give fewer --devices, or --alpha 0 for an IID split", ErrUsage, err)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		alpha := strconv.FormatFloat(f.alpha, 'g', -1, 64)
		s.name, s.how = kind+"-dirichlet-"+alpha, "Dirichlet(alpha="+alpha+") label skew"
	}
	if len(evalIdx) > 0 {
		s.eval, s.evalName, s.evalFrom = in.set.Subset(evalIdx), kind+"-eval", "a seeded sample of "+in.from
	}
	fmt.Fprintf(w, "%s: %d examples, %d features, %d classes\n", in.from, n, in.set.Dim, in.set.NumClasses)
	return s.write(w, warn, f.out)
}

// byKey splits examples by their key: every distinct key goes whole to one
// device. Keys are dealt in decreasing order of size (ties by key) to the
// device holding fewest examples (ties by index), which is deterministic
// and keeps devices balanced as far as the keys allow.
func byKey(keys []string, devices int) (parts [][]int, groups int, err error) {
	rows := map[string][]int{}
	for i, k := range keys {
		rows[k] = append(rows[k], i)
	}
	if len(rows) < devices {
		return nil, 0, fmt.Errorf("%w: --devices %d is more than the %d distinct keys: each key goes whole to one device", ErrUsage, devices, len(rows))
	}
	order := slices.SortedFunc(maps.Keys(rows), func(a, b string) int {
		if d := len(rows[b]) - len(rows[a]); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	parts = make([][]int, devices)
	for _, k := range order {
		dst := 0
		for d := range parts {
			if len(parts[d]) < len(parts[dst]) {
				dst = d
			}
		}
		parts[dst] = append(parts[dst], rows[k]...)
	}
	for _, p := range parts {
		slices.Sort(p)
	}
	return parts, len(rows), nil
}
