package cli

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/data"
)

// Bounds of what data csv reads, so that a wrong or hostile file fails with
// a clear error rather than exhausting memory.
const (
	maxCSVBytes      = 1 << 30 // the whole file
	maxCSVRows       = 1 << 22 // data rows, after the header
	maxCSVColumns    = 4096
	maxCSVFieldBytes = 4096 // one field
	// maxSplitValues bounds examples x features of one labelled set: 1 GiB
	// of float32 features, the default limit of data.ReadDir.
	maxSplitValues = 1 << 28
)

// csvOptions say which columns of a CSV file data csv uses.
type csvOptions struct {
	label    string   // column of the class names or indices; required
	features []string // feature columns; nil: every other numeric column
	key      string   // column that groups rows for a natural split; "" for none
}

func newDataCSVCommand(_ *app) *cobra.Command {
	var (
		f splitFlags
		o csvOptions
	)
	cmd := &cobra.Command{
		Use:   "csv FILE --label COLUMN --devices N --out DIR",
		Short: "Split a CSV file into device datasets, plus a server evaluation set",
		Long: "csv reads a CSV file whose first row names the columns, one example a row. --label names the\n" +
			"column of classes: integers in [0, 255] are the class indices themselves, anything else is a\n" +
			"class name, numbered in sorted order; DIR/" + classesFile + " lists the classes, line K naming class K.\n" +
			"The features are the --features columns, in that order, else every other column whose first\n" +
			"row holds a number. Every feature must be a finite number.\n\n" +
			"--eval-fraction of the rows, a seeded sample, go to DIR/eval. With --key the rest is split\n" +
			"naturally: all rows with the same value in that column (say, a user id) go to one device, the\n" +
			"keys dealt largest first to the device with the fewest rows. Without it the rows are split as\n" +
			"data mnist splits MNIST: Dirichlet(--alpha) label skew, or IID with --alpha 0. The datasets go to\n" +
			"DIR/device-0, DIR/device-1, ... in the format of docs/DATASET.md; the output is a function of the\n" +
			"file, the flags and --seed.",
		Example: "  fleetlearn data csv people.csv --label outcome --key user_id --devices 10 --out datasets\n" +
			"  fleetlearn data csv iris.csv --label species --features sepal_length,sepal_width --devices 3 --alpha 0 --out iris",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.label == "" {
				return fmt.Errorf("%w: --label must name the column of classes", ErrUsage)
			}
			if err := f.check(); err != nil {
				return err
			}
			in, err := readCSVFile(cmd.ErrOrStderr(), args[0], o)
			if err != nil {
				return fmt.Errorf("data csv: %w", err)
			}
			return f.split(cmd.OutOrStdout(), cmd.ErrOrStderr(), "data csv", "csv", in)
		},
	}
	f.bind(cmd)
	fl := cmd.Flags()
	fl.StringVar(&o.label, "label", "", "column holding each row's class: a name, or an index in [0, 255] (required)")
	fl.StringSliceVar(&o.features, "features", nil, "feature columns, in order (default: every other column whose first row is a number)")
	fl.StringVar(&o.key, "key", "", "column grouping rows, such as a user id: each key's rows go whole to one device")
	cmd.MarkFlagRequired("label")
	return cmd
}

func readCSVFile(warn io.Writer, path string, o csvOptions) (labelled, error) {
	fh, err := os.Open(path)
	if err != nil {
		return labelled{}, err
	}
	defer fh.Close()
	if fi, err := fh.Stat(); err != nil {
		return labelled{}, err
	} else if !fi.Mode().IsRegular() {
		return labelled{}, fmt.Errorf("%s is not a regular file: %w", path, ErrInput)
	} else if fi.Size() > maxCSVBytes {
		return labelled{}, fmt.Errorf("%s: %d bytes, more than the %d data csv reads: %w", path, fi.Size(), maxCSVBytes, ErrInput)
	}
	in, skipped, err := parseCSV(fh, path, o)
	if err != nil {
		return labelled{}, err
	}
	if len(skipped) > 0 {
		fmt.Fprintf(warn, "not features, as their first row is not a number: %s; name the feature columns with --features\n",
			strings.Join(quoteAll(skipped), ", "))
	}
	return in, nil
}

// errCSVTooLong ends a read past maxCSVBytes; a plain io.LimitReader would
// end it with a silent EOF mid-row.
var errCSVTooLong = fmt.Errorf("more than %d bytes", maxCSVBytes)

type capReader struct {
	r    io.Reader
	left int64
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, errCSVTooLong
	}
	p = p[:min(int64(len(p)), c.left)]
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

// parseCSV reads a CSV file with a header row into a labelled set; name is
// the file's name in errors. It also returns the columns left out of the
// default features because their first row is not a number.
func parseCSV(r io.Reader, name string, o csvOptions) (in labelled, skipped []string, err error) {
	cr := csv.NewReader(&capReader{r: r, left: maxCSVBytes})
	cr.ReuseRecord = true
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return labelled{}, nil, fmt.Errorf("%s is empty: the first row must name the columns: %w", name, ErrInput)
	}
	if err != nil {
		return labelled{}, nil, csvReadErr(name, err)
	}
	if len(header) > maxCSVColumns {
		return labelled{}, nil, fmt.Errorf("%s: %d columns, more than %d: %w", name, len(header), maxCSVColumns, ErrInput)
	}
	header = slices.Clone(header)
	header[0] = strings.TrimPrefix(header[0], "\ufeff") // a byte order mark some spreadsheets write
	col := make(map[string]int, len(header))
	for i, h := range header {
		if len(h) > maxCSVFieldBytes {
			return labelled{}, nil, fmt.Errorf("%s:1: column %d: name longer than %d bytes: %w", name, i+1, maxCSVFieldBytes, ErrInput)
		}
		if _, dup := col[h]; dup {
			return labelled{}, nil, fmt.Errorf("%s:1: two columns are named %q: %w", name, h, ErrInput)
		}
		col[h] = i
	}
	find := func(flag, c string) (int, error) {
		i, ok := col[c]
		if !ok {
			return 0, fmt.Errorf("%w: %s %q: %s has no such column; its columns are %s", ErrUsage, flag, c, name, strings.Join(quoteAll(header), ", "))
		}
		return i, nil
	}
	labelCol, err := find("--label", o.label)
	if err != nil {
		return labelled{}, nil, err
	}
	keyCol := -1
	if o.key != "" {
		if keyCol, err = find("--key", o.key); err != nil {
			return labelled{}, nil, err
		}
		if keyCol == labelCol {
			return labelled{}, nil, fmt.Errorf("%w: --key and --label name the same column %q", ErrUsage, o.key)
		}
	}
	var featCols []int
	for _, c := range o.features {
		i, err := find("--features", c)
		if err != nil {
			return labelled{}, nil, err
		}
		if i == labelCol || i == keyCol || slices.Contains(featCols, i) {
			return labelled{}, nil, fmt.Errorf("%w: --features names column %q twice, or as the label or key", ErrUsage, c)
		}
		featCols = append(featCols, i)
	}

	var (
		features []float32
		names    []string // each row's label
		keys     []string // each row's key, when --key
		interned = map[string]string{}
		classSet = map[string]bool{}
	)
	intern := func(s string) string {
		if v, ok := interned[s]; ok {
			return v
		}
		s = strings.Clone(s) // ReuseRecord: the record's memory is reused
		interned[s] = s
		return s
	}
	for rows := 0; ; rows++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return labelled{}, nil, csvReadErr(name, err)
		}
		line, _ := cr.FieldPos(0)
		if rows == maxCSVRows {
			return labelled{}, nil, fmt.Errorf("%s:%d: more than %d rows: %w", name, line, maxCSVRows, ErrInput)
		}
		for i, v := range rec {
			if len(v) > maxCSVFieldBytes {
				l, _ := cr.FieldPos(i)
				return labelled{}, nil, fmt.Errorf("%s:%d: column %q: field longer than %d bytes: %w", name, l, header[i], maxCSVFieldBytes, ErrInput)
			}
		}
		if rows == 0 && o.features == nil {
			// The first row decides which columns are numeric; every later
			// row must then hold numbers there too.
			for i, v := range rec {
				if i == labelCol || i == keyCol {
					continue
				}
				if _, ok := parseFeature(v); ok {
					featCols = append(featCols, i)
				} else {
					skipped = append(skipped, header[i])
				}
			}
			if len(featCols) == 0 {
				return labelled{}, nil, fmt.Errorf("%s:%d: no column but the label and key holds a number; name the feature columns with --features: %w",
					name, line, ErrInput)
			}
		}
		if (rows+1)*len(featCols) > maxSplitValues {
			return labelled{}, nil, fmt.Errorf("%s:%d: more than %d feature values in all: %w", name, line, maxSplitValues, ErrInput)
		}
		for _, i := range featCols {
			x, ok := parseFeature(rec[i])
			if !ok {
				l, _ := cr.FieldPos(i)
				return labelled{}, nil, fmt.Errorf("%s:%d: column %q: %q is not a number: %w", name, l, header[i], rec[i], ErrInput)
			}
			features = append(features, x)
		}
		label := rec[labelCol]
		if label == "" || strings.ContainsFunc(label, unicode.IsControl) {
			l, _ := cr.FieldPos(labelCol)
			return labelled{}, nil, fmt.Errorf("%s:%d: column %q: label %q is empty or holds a control character: %w", name, l, header[labelCol], label, ErrInput)
		}
		label = intern(label)
		if !classSet[label] {
			if len(classSet) == data.MaxClasses {
				l, _ := cr.FieldPos(labelCol)
				return labelled{}, nil, fmt.Errorf("%s:%d: column %q: more than %d classes: %w", name, l, header[labelCol], data.MaxClasses, ErrInput)
			}
			classSet[label] = true
		}
		names = append(names, label)
		if keyCol >= 0 {
			keys = append(keys, intern(rec[keyCol]))
		}
	}
	if len(names) == 0 {
		return labelled{}, nil, fmt.Errorf("%s has a header row but no data rows: %w", name, ErrInput)
	}

	classes, index := classIndex(classSet)
	set := &data.Dataset{Features: features, Labels: make([]uint8, len(names)), Dim: len(featCols), NumClasses: len(classes)}
	for i, l := range names {
		set.Labels[i] = index[l]
	}
	in = labelled{set: set, classes: classes, keys: keys, keyName: o.key, from: name}
	return in, skipped, nil
}

// classIndex numbers the classes: when every name is an integer in
// [0, 255] written plainly, that integer, else the name's place in sorted
// order. It returns the class names by index.
func classIndex(set map[string]bool) ([]string, map[string]uint8) {
	index := make(map[string]uint8, len(set))
	top := -1
	for s := range set {
		v, err := strconv.Atoi(s)
		if err != nil || v < 0 || v >= data.MaxClasses || strconv.Itoa(v) != s {
			top = -1
			break
		}
		top = max(top, v)
		index[s] = uint8(v)
	}
	if top >= 0 {
		classes := make([]string, top+1)
		for i := range classes {
			classes[i] = strconv.Itoa(i)
		}
		return classes, index
	}
	classes := slices.Sorted(maps.Keys(set))
	for i, s := range classes {
		index[s] = uint8(i)
	}
	return classes, index
}

// parseFeature parses a feature: a decimal or hexadecimal number, spaces
// around it allowed, that is finite as a float32.
func parseFeature(s string) (float32, bool) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(v) || math.Abs(v) > math.MaxFloat32 {
		return 0, false
	}
	return float32(v), true
}

// csvReadErr names the file in an encoding/csv error, which already says
// the line and column.
func csvReadErr(name string, err error) error {
	if errors.Is(err, errCSVTooLong) {
		return fmt.Errorf("%s: %w: %w", name, err, ErrInput)
	}
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s:%d: column %d: %w: %w", name, pe.Line, pe.Column, pe.Err, ErrInput)
	}
	return fmt.Errorf("%s: %w", name, err)
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strconv.Quote(s)
	}
	return out
}
