package data

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// peopleCSV is a CSV of n rows: an id feature, a text column, the user
// key, a numeric feature and a string label.
func peopleCSV(n int) string {
	var b strings.Builder
	b.WriteString("id,name,user,age,outcome\n")
	outcomes := []string{"stay", "leave", "upgrade"}
	for i := range n {
		fmt.Fprintf(&b, "%d,person %d,u%02d,%d.5,%s\n", i, i, i%13, 20+i%50, outcomes[(i*7)%3])
	}
	return b.String()
}

func TestReadCSV(t *testing.T) {
	const n = 40
	res, err := ReadCSV(strings.NewReader(peopleCSV(n)), "people.csv", CSVOptions{Label: "outcome", Key: "user"})
	if err != nil {
		t.Fatal(err)
	}
	d := res.Dataset
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	// id and age are the default features, in file order; name is text
	// and user the key.
	if d.Len() != n || d.Dim != 2 || d.NumClasses != 3 {
		t.Fatalf("%d rows, dim %d, %d classes", d.Len(), d.Dim, d.NumClasses)
	}
	if !slices.Equal(res.Skipped, []string{"name"}) {
		t.Errorf("skipped %q, want [name]", res.Skipped)
	}
	// Class names in sorted order.
	if !slices.Equal(res.Classes, []string{"leave", "stay", "upgrade"}) {
		t.Errorf("classes %q", res.Classes)
	}
	want := map[string]uint8{"leave": 0, "stay": 1, "upgrade": 2}
	outcomes := []string{"stay", "leave", "upgrade"}
	for i := range n {
		if d.Features[2*i] != float32(i) || d.Features[2*i+1] != float32(20+i%50)+0.5 {
			t.Fatalf("row %d: features %v", i, d.Features[2*i:2*i+2])
		}
		if d.Labels[i] != want[outcomes[(i*7)%3]] {
			t.Fatalf("row %d: label %d", i, d.Labels[i])
		}
		if res.Keys[i] != fmt.Sprintf("u%02d", i%13) {
			t.Fatalf("row %d: key %q", i, res.Keys[i])
		}
	}

	// Features name the columns and their order; nothing is skipped.
	res, err = ReadCSV(strings.NewReader(peopleCSV(n)), "people.csv", CSVOptions{Label: "outcome", Features: []string{"age", "id"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Dataset.Dim != 2 || res.Dataset.Features[2*7+1] != 7 || res.Skipped != nil || res.Keys != nil {
		t.Errorf("dim %d, row 7 %v, skipped %q, keys %d", res.Dataset.Dim, res.Dataset.Features[14:16], res.Skipped, len(res.Keys))
	}
}

func TestCSVIntegerLabels(t *testing.T) {
	res, err := ReadCSV(strings.NewReader("f,label\n0.5,2\n1.5,0\n2.5,2\n"), "x.csv", CSVOptions{Label: "label"})
	if err != nil {
		t.Fatal(err)
	}
	// Integers are the class indices; class 1 has no rows.
	if d := res.Dataset; d.NumClasses != 3 || string(d.Labels) != "\x02\x00\x02" || strings.Join(res.Classes, " ") != "0 1 2" {
		t.Errorf("%d classes %q, labels %v", d.NumClasses, res.Classes, d.Labels)
	}
	// One label not written plainly makes them all names.
	res, err = ReadCSV(strings.NewReader("f,label\n0.5,2\n1.5,07\n"), "x.csv", CSVOptions{Label: "label"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(res.Classes, " ") != "07 2" || string(res.Dataset.Labels) != "\x01\x00" {
		t.Errorf("classes %q, labels %v", res.Classes, res.Dataset.Labels)
	}
}

func TestReadCSVSpellings(t *testing.T) {
	// A byte order mark, quoted fields, hexadecimal and spaced numbers.
	res, err := ReadCSV(strings.NewReader("\ufeffx,\"label\"\n\" 0x1p3 \",\"a,b\"\n-2.5e1,c\n"), "x.csv", CSVOptions{Label: "label"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Dataset.Features, []float32{8, -25}) || !slices.Equal(res.Classes, []string{"a,b", "c"}) {
		t.Errorf("features %v, classes %q", res.Dataset.Features, res.Classes)
	}
}

func TestReadCSVErrors(t *testing.T) {
	bad := peopleCSV(20)
	lines := strings.Split(bad, "\n")
	lines[16] = "15,person 15,u02,abc,stay" // line 17 of the file
	bad = strings.Join(lines, "\n")
	var manyClasses strings.Builder
	manyClasses.WriteString("x,label\n")
	for i := range MaxClasses + 1 {
		fmt.Fprintf(&manyClasses, "1,c%d\n", i)
	}
	for _, tc := range []struct {
		name, content string
		opts          CSVOptions
		want          string
		is            error
	}{
		{"bad number", bad, CSVOptions{Label: "outcome"}, `x.csv:17: column "age": "abc" is not a number`, ErrCSV},
		{"infinite", "x,label\n1,a\n+Inf,b\n", CSVOptions{}, `x.csv:3: column "x": "+Inf" is not a number`, ErrCSV},
		{"float32 overflow", "x,label\n1e39,a\n", CSVOptions{}, "no column but the label and key holds a number", ErrNoFeatures},
		{"explicit feature", "x,t,label\n1,a,a\n", CSVOptions{Features: []string{"t"}}, `x.csv:2: column "t": "a" is not a number`, ErrCSV},
		{"field count", "x,label\n1,a\n2\n", CSVOptions{}, "x.csv:3: column 1: wrong number of fields", ErrCSV},
		{"bare quote", "x,label\n1,a\"b\n", CSVOptions{}, `bare " in non-quoted-field`, ErrCSV},
		{"empty label", "x,label\n1,\n", CSVOptions{}, `x.csv:2: column "label": label "" is empty`, ErrCSV},
		{"control label", "x,label\n1,\"a\nb\"\n", CSVOptions{}, `x.csv:2: column "label": label "a\nb" is empty or holds a control character`, ErrCSV},
		{"no label column", "x,y\n1,2\n", CSVOptions{}, `label column "label": x.csv has no such column; its columns are "x", "y"`, ErrInvalidArgument},
		{"no key column", "x,label\n1,2\n", CSVOptions{Key: "user"}, `key column "user"`, ErrInvalidArgument},
		{"no feature column", "x,label\n1,2\n", CSVOptions{Features: []string{"y"}}, `features column "y"`, ErrInvalidArgument},
		{"key is label", "x,label\n1,2\n", CSVOptions{Key: "label"}, "same column", ErrInvalidArgument},
		{"feature twice", "x,label\n1,2\n", CSVOptions{Features: []string{"x", "x"}}, `column "x" twice`, ErrInvalidArgument},
		{"negative bound", "x,label\n1,2\n", CSVOptions{MaxRows: -1}, "negative bound", ErrInvalidArgument},
		{"no rows", "x,label\n", CSVOptions{}, "x.csv has a header row but no data rows", ErrCSV},
		{"empty", "", CSVOptions{}, "x.csv is empty", ErrCSV},
		{"no features", "t,label\nabc,a\n", CSVOptions{}, "x.csv:2: no column but the label and key holds a number", ErrNoFeatures},
		{"duplicate column", "x,x,label\n1,2,a\n", CSVOptions{}, `x.csv:1: two columns are named "x"`, ErrCSV},
		{"rows", "x,label\n1,a\n2,b\n3,c\n", CSVOptions{MaxRows: 2}, "x.csv:4: more than 2 rows", ErrTooLarge},
		{"values", "x,y,label\n1,2,a\n3,4,b\n", CSVOptions{MaxValues: 3}, "x.csv:3: more than 3 feature values", ErrTooLarge},
		{"bytes", "x,label\n1,a\n2,b\n", CSVOptions{MaxBytes: 12}, "x.csv: more than 12 bytes", ErrTooLarge},
		{"classes", manyClasses.String(), CSVOptions{}, `x.csv:258: column "label": more than 256 classes`, ErrTooLarge},
		{"columns", strings.Repeat("c,", maxCSVColumns) + "label\n", CSVOptions{}, "columns, more than 4096", ErrTooLarge},
		{"field", "x,label\n1," + strings.Repeat("a", maxCSVFieldBytes+1) + "\n", CSVOptions{}, `x.csv:2: column "label": field longer than 4096 bytes`, ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.opts.Label == "" {
				tc.opts.Label = "label"
			}
			res, err := ReadCSV(strings.NewReader(tc.content), "x.csv", tc.opts)
			if !errors.Is(err, tc.is) || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, %v; want %v naming %q", res, err, tc.is, tc.want)
			}
		})
	}

	// A file of exactly MaxBytes is whole.
	if _, err := ReadCSV(strings.NewReader("x,label\n1,a\n"), "x.csv", CSVOptions{Label: "label", MaxBytes: 12}); err != nil {
		t.Errorf("12 bytes, MaxBytes 12: %v", err)
	}

	var ce *CSVColumnError
	_, err := ReadCSV(strings.NewReader("a,b\n1,2\n"), "x.csv", CSVOptions{Label: "b", Key: "k"})
	if !errors.As(err, &ce) || ce.Name != "x.csv" || ce.Option != "key" || ce.Column != "k" || !slices.Equal(ce.Header, []string{"a", "b"}) {
		t.Errorf("%#v", ce)
	}
}

func TestReadCSVFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "people.csv")
	if err := os.WriteFile(path, []byte(peopleCSV(10)), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := ReadCSVFile(path, CSVOptions{Label: "outcome"})
	if err != nil || res.Dataset.Len() != 10 {
		t.Fatalf("%v, %v", res, err)
	}
	// Too large is refused from the file's size, before it is read.
	if _, err := ReadCSVFile(path, CSVOptions{Label: "outcome", MaxBytes: 100}); !errors.Is(err, ErrTooLarge) ||
		!strings.Contains(err.Error(), "bytes, more than 100") {
		t.Errorf("small MaxBytes: %v", err)
	}
	if _, err := ReadCSVFile(dir, CSVOptions{Label: "outcome"}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("directory: %v", err)
	}
	if _, err := ReadCSVFile(filepath.Join(dir, "missing.csv"), CSVOptions{Label: "outcome"}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
	// An option error comes before the file is opened.
	if _, err := ReadCSVFile(filepath.Join(dir, "missing.csv"), CSVOptions{}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("no label: %v", err)
	}
}

// FuzzCSVDataset: any input either fails with one of the package's errors
// or gives a valid dataset whose classes and keys line up with its rows.
func FuzzCSVDataset(f *testing.F) {
	f.Add([]byte(peopleCSV(5)), "user")
	f.Add([]byte("x,label\n1,a\n2,b\n"), "")
	f.Add([]byte("\ufeffx,\"label\"\n\"1\",\"a\"\"b\"\n"), "x")
	f.Fuzz(func(t *testing.T, b []byte, key string) {
		o := CSVOptions{Label: "label", Key: key}
		if strings.Contains(string(b), "outcome") {
			o.Label = "outcome"
		}
		res, err := ReadCSV(bytes.NewReader(b), "fuzz.csv", o)
		if err != nil {
			// The CLI sorts errors into usage and input by these.
			for _, s := range []error{ErrCSV, ErrTooLarge, ErrNoFeatures, ErrInvalidArgument} {
				if errors.Is(err, s) {
					return
				}
			}
			t.Fatalf("error of no sentinel: %v", err)
		}
		d := res.Dataset
		if err := d.Validate(); err != nil {
			t.Fatal(err)
		}
		if len(res.Classes) != d.NumClasses || d.Len() == 0 {
			t.Fatalf("%d class names for %d classes, %d rows", len(res.Classes), d.NumClasses, d.Len())
		}
		if key != "" && len(res.Keys) != d.Len() {
			t.Fatalf("%d keys for %d rows", len(res.Keys), d.Len())
		}
	})
}
