package data

// A CSV file of examples, one a row, as a user exports it from a
// spreadsheet or a database. The file may come from anyone, so every
// dimension of it is bounded and an error names the file, line and column
// to fix.

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
)

// Default bounds of ReadCSV; DefaultMaxFeatureValues is ReadImageFolder's
// too.
const (
	// DefaultCSVMaxBytes bounds the CSV input.
	DefaultCSVMaxBytes = 1 << 30
	// DefaultCSVMaxRows bounds the data rows, after the header.
	DefaultCSVMaxRows = 1 << 22
	// DefaultMaxFeatureValues bounds examples x features of one dataset:
	// 1 GiB of float32 features, the most ReadDir reads by default.
	DefaultMaxFeatureValues = 1 << 28
)

// Structural bounds, far above any real file's, that keep a hostile one
// from costing memory in proportion to its width.
const (
	maxCSVColumns    = 4096
	maxCSVFieldBytes = 4096
)

// CSVOptions say which columns of a CSV file ReadCSV uses, and bound what it
// reads. Zero bounds take the defaults.
type CSVOptions struct {
	// Label names the column of classes; required.
	Label string
	// Features names the feature columns, in order. Nil takes every other
	// column (but Key) whose first data row holds a number.
	Features []string
	// Key names a column that groups rows, such as a user id, for a
	// natural partition; "" for none.
	Key string

	// MaxBytes bounds the input, MaxRows the data rows and MaxValues the
	// feature values in all (rows x features); more is ErrTooLarge.
	MaxBytes  int64
	MaxRows   int
	MaxValues int
}

func (o *CSVOptions) fill() error {
	if o.Label == "" {
		return fmt.Errorf("no label column: %w", ErrInvalidArgument)
	}
	if o.Key == o.Label {
		return fmt.Errorf("key and label name the same column %q: %w", o.Key, ErrInvalidArgument)
	}
	for i, c := range o.Features {
		if c == o.Label || (o.Key != "" && c == o.Key) || slices.Contains(o.Features[:i], c) {
			return fmt.Errorf("features name column %q twice, or as the label or key: %w", c, ErrInvalidArgument)
		}
	}
	if o.MaxBytes < 0 || o.MaxRows < 0 || o.MaxValues < 0 {
		return fmt.Errorf("negative bound (max bytes %d, max rows %d, max values %d): %w",
			o.MaxBytes, o.MaxRows, o.MaxValues, ErrInvalidArgument)
	}
	if o.MaxBytes == 0 {
		o.MaxBytes = DefaultCSVMaxBytes
	}
	if o.MaxRows == 0 {
		o.MaxRows = DefaultCSVMaxRows
	}
	if o.MaxValues == 0 {
		o.MaxValues = DefaultMaxFeatureValues
	}
	return nil
}

// CSVDataset is what ReadCSV read.
type CSVDataset struct {
	// Dataset holds one example per data row, in file order.
	Dataset *Dataset
	// Classes are the class names by label: the labels themselves when
	// every one is a plain integer in [0, 255], else the distinct labels
	// in sorted order.
	Classes []string
	// Keys are each row's value in the Key column; nil without Key.
	Keys []string
	// Skipped are the columns the default features left out because their
	// first data row is not a number; nil when Features is set.
	Skipped []string
}

// A CSVColumnError reports a column named in CSVOptions that the file lacks.
// It wraps ErrInvalidArgument.
type CSVColumnError struct {
	Name   string   // the file, as given to ReadCSV
	Option string   // the option naming the column: "label", "key" or "features"
	Column string   // the column named
	Header []string // the file's columns, in order
}

func (e *CSVColumnError) Error() string {
	return fmt.Sprintf("%s column %q: %s has no such column; its columns are %s",
		e.Option, e.Column, e.Name, strings.Join(quoteAll(e.Header), ", "))
}

func (e *CSVColumnError) Unwrap() error { return ErrInvalidArgument }

// ReadCSVFile reads the CSV file at path with ReadCSV, naming it path in
// errors. A file that is not regular, or larger than opts allows, is
// refused before it is read.
func ReadCSVFile(path string, opts CSVOptions) (*CSVDataset, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	if fi, err := fh.Stat(); err != nil {
		return nil, err
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file: %w", path, ErrInvalidArgument)
	} else if fi.Size() > opts.MaxBytes {
		return nil, fmt.Errorf("%s: %d bytes, more than %d: %w", path, fi.Size(), opts.MaxBytes, ErrTooLarge)
	}
	return ReadCSV(fh, path, opts)
}

// ReadCSV reads a CSV file (RFC 4180, as encoding/csv reads it) whose first
// row names the columns, one example a further row; name is the file's name
// in errors. Column names must be distinct; a leading byte order mark is
// ignored.
//
// A row's label is its Label value, which may be neither empty nor hold a
// control character. When every label is an integer in [0, 255] written
// plainly ("7", not "07") the integers are the classes, as many as the
// largest plus one; otherwise each distinct label is a class, numbered in
// sorted (byte) order. A feature is a decimal or hexadecimal number, spaces
// around it allowed, finite as a float32.
//
// Errors begin with the file's name, and its line and column where there is
// one. A row that does not parse is ErrCSV; a file past a bound, or with
// more than MaxClasses classes, ErrTooLarge; a column named in opts that the
// file lacks a *CSVColumnError; default features finding no numeric column
// ErrNoFeatures.
func ReadCSV(r io.Reader, name string, opts CSVOptions) (*CSVDataset, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	tooLong := fmt.Errorf("more than %d bytes: %w", opts.MaxBytes, ErrTooLarge)
	cr := csv.NewReader(&capReader{r: r, left: opts.MaxBytes, err: tooLong})
	cr.ReuseRecord = true
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s is empty: the first row must name the columns: %w", name, ErrCSV)
	}
	if err != nil {
		return nil, csvReadErr(name, err)
	}
	if len(header) > maxCSVColumns {
		return nil, fmt.Errorf("%s: %d columns, more than %d: %w", name, len(header), maxCSVColumns, ErrTooLarge)
	}
	header = slices.Clone(header)
	header[0] = strings.TrimPrefix(header[0], "\ufeff") // a byte order mark some spreadsheets write
	col := make(map[string]int, len(header))
	for i, h := range header {
		if len(h) > maxCSVFieldBytes {
			return nil, fmt.Errorf("%s:1: column %d: name longer than %d bytes: %w", name, i+1, maxCSVFieldBytes, ErrTooLarge)
		}
		if _, dup := col[h]; dup {
			return nil, fmt.Errorf("%s:1: two columns are named %q: %w", name, h, ErrCSV)
		}
		col[h] = i
	}
	find := func(option, c string) (int, error) {
		i, ok := col[c]
		if !ok {
			return 0, &CSVColumnError{Name: name, Option: option, Column: c, Header: header}
		}
		return i, nil
	}
	labelCol, err := find("label", opts.Label)
	if err != nil {
		return nil, err
	}
	keyCol := -1
	if opts.Key != "" {
		if keyCol, err = find("key", opts.Key); err != nil {
			return nil, err
		}
	}
	var featCols []int
	for _, c := range opts.Features {
		i, err := find("features", c)
		if err != nil {
			return nil, err
		}
		featCols = append(featCols, i)
	}

	var (
		features []float32
		names    []string // each row's label
		keys     []string // each row's key, when Key
		skipped  []string
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
			return nil, csvReadErr(name, err)
		}
		line, _ := cr.FieldPos(0)
		if rows == opts.MaxRows {
			return nil, fmt.Errorf("%s:%d: more than %d rows: %w", name, line, opts.MaxRows, ErrTooLarge)
		}
		for i, v := range rec {
			if len(v) > maxCSVFieldBytes {
				l, _ := cr.FieldPos(i)
				return nil, fmt.Errorf("%s:%d: column %q: field longer than %d bytes: %w", name, l, header[i], maxCSVFieldBytes, ErrTooLarge)
			}
		}
		if rows == 0 && opts.Features == nil {
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
				return nil, fmt.Errorf("%s:%d: no column but the label and key holds a number: %w", name, line, ErrNoFeatures)
			}
		}
		if (rows+1)*len(featCols) > opts.MaxValues {
			return nil, fmt.Errorf("%s:%d: more than %d feature values in all: %w", name, line, opts.MaxValues, ErrTooLarge)
		}
		for _, i := range featCols {
			x, ok := parseFeature(rec[i])
			if !ok {
				l, _ := cr.FieldPos(i)
				return nil, fmt.Errorf("%s:%d: column %q: %q is not a number: %w", name, l, header[i], rec[i], ErrCSV)
			}
			features = append(features, x)
		}
		label := rec[labelCol]
		if label == "" || strings.ContainsFunc(label, unicode.IsControl) {
			l, _ := cr.FieldPos(labelCol)
			return nil, fmt.Errorf("%s:%d: column %q: label %q is empty or holds a control character: %w", name, l, header[labelCol], label, ErrCSV)
		}
		label = intern(label)
		if !classSet[label] {
			if len(classSet) == MaxClasses {
				l, _ := cr.FieldPos(labelCol)
				return nil, fmt.Errorf("%s:%d: column %q: more than %d classes: %w", name, l, header[labelCol], MaxClasses, ErrTooLarge)
			}
			classSet[label] = true
		}
		names = append(names, label)
		if keyCol >= 0 {
			keys = append(keys, intern(rec[keyCol]))
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%s has a header row but no data rows: %w", name, ErrCSV)
	}

	classes, index := classIndex(classSet)
	set := &Dataset{Features: features, Labels: make([]uint8, len(names)), Dim: len(featCols), NumClasses: len(classes)}
	for i, l := range names {
		set.Labels[i] = index[l]
	}
	return &CSVDataset{Dataset: set, Classes: classes, Keys: keys, Skipped: skipped}, nil
}

// capReader fails a read past its limit with err, where an io.LimitReader
// would end it with an EOF that encoding/csv takes for a complete last row.
type capReader struct {
	r    io.Reader
	left int64
	err  error
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		// An input of exactly the limit is whole: only a byte past it fails.
		var b [1]byte
		if n, err := io.ReadAtLeast(c.r, b[:], 1); n == 0 {
			return 0, err
		}
		return 0, c.err
	}
	p = p[:min(int64(len(p)), c.left)]
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

// classIndex numbers the classes: when every name is an integer in
// [0, 255] written plainly, that integer, else the name's place in sorted
// order. It returns the class names by index.
func classIndex(set map[string]bool) ([]string, map[string]uint8) {
	index := make(map[string]uint8, len(set))
	top := -1
	for s := range set {
		v, err := strconv.Atoi(s)
		if err != nil || v < 0 || v >= MaxClasses || strconv.Itoa(v) != s {
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

func parseFeature(s string) (float32, bool) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(v) || math.Abs(v) > math.MaxFloat32 {
		return 0, false
	}
	return float32(v), true
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strconv.Quote(s)
	}
	return out
}

// csvReadErr names the file in an encoding/csv error, which already says
// the line and column.
func csvReadErr(name string, err error) error {
	if errors.Is(err, ErrTooLarge) {
		return fmt.Errorf("%s: %w", name, err)
	}
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s:%d: column %d: %w: %w", name, pe.Line, pe.Column, pe.Err, ErrCSV)
	}
	return fmt.Errorf("%s: %w", name, err)
}
