package cli

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
)

// splitSets reads what a data subcommand wrote to dir: devices device
// datasets and the evaluation set, each checked against dim and classes.
// It returns the devices' datasets, then the evaluation set last.
func splitSets(t *testing.T, dir string, devices, dim, classes int) []*data.Dataset {
	t.Helper()
	var sets []*data.Dataset
	for _, name := range append(deviceNames(devices), "eval") {
		d, _ := readDataset(t, filepath.Join(dir, name))
		if err := d.Validate(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if d.Dim != dim || d.NumClasses != classes || d.Len() == 0 {
			t.Fatalf("%s: %d examples, dim %d, %d classes; want dim %d, %d classes", name, d.Len(), d.Dim, d.NumClasses, dim, classes)
		}
		sets = append(sets, d)
	}
	if _, err := os.Stat(filepath.Join(dir, fmt.Sprintf("device-%d", devices))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("device-%d exists: %v", devices, err)
	}
	return sets
}

func deviceNames(n int) []string {
	var names []string
	for k := range n {
		names = append(names, fmt.Sprintf("device-%d", k))
	}
	return names
}

// coversOnce checks that the ids of the examples, read by id from their
// features, name each of [0, n) exactly once across sets.
func coversOnce(t *testing.T, sets []*data.Dataset, n int, id func(features []float32) int) {
	t.Helper()
	seen := make([]int, n)
	for _, d := range sets {
		for i := range d.Len() {
			j := id(d.Features[i*d.Dim : (i+1)*d.Dim])
			if j < 0 || j >= n {
				t.Fatalf("example with id %d, outside [0, %d)", j, n)
			}
			seen[j]++
		}
	}
	for j, c := range seen {
		if c != 1 {
			t.Errorf("example %d written %d times", j, c)
		}
	}
}

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

func writeTestFile(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestDataCSVByKey(t *testing.T) {
	const n, devices = 200, 4
	src := writeTestFile(t, filepath.Join(t.TempDir(), "people.csv"), peopleCSV(n))
	out := filepath.Join(t.TempDir(), "sets")
	r := execute(t, newDataCSVCommand(&app{}), src, "--label", "outcome", "--key", "user", "--devices", fmt.Sprint(devices),
		"--eval-fraction", "0.1", "--out", out, "--seed", "3")
	if r.err != nil {
		t.Fatal(r.err)
	}
	// id and age are features; name is text and user the key.
	sets := splitSets(t, out, devices, 2, 3)
	coversOnce(t, sets, n, func(x []float32) int { return int(x[0]) })
	if got := sets[devices].Len(); got != n/10 {
		t.Errorf("eval holds %d rows, want %d", got, n/10)
	}
	// Every user's rows are on one device.
	owner := map[int]int{}
	for k, d := range sets[:devices] {
		for i := range d.Len() {
			id := int(d.Features[i*2])
			if d.Features[i*2+1] != float32(20+id%50)+0.5 {
				t.Fatalf("row %d: age %v", id, d.Features[i*2+1])
			}
			if o, ok := owner[id%13]; ok && o != k {
				t.Fatalf("user u%02d on devices %d and %d", id%13, o, k)
			}
			owner[id%13] = k
		}
	}
	// Class names in sorted order: leave, stay, upgrade.
	classes, err := os.ReadFile(filepath.Join(out, classesFile))
	if err != nil || string(classes) != "leave\nstay\nupgrade\n" {
		t.Errorf("%s: %q, %v", classesFile, classes, err)
	}
	want := map[string]uint8{"leave": 0, "stay": 1, "upgrade": 2}
	outcomes := []string{"stay", "leave", "upgrade"}
	for _, d := range sets {
		for i := range d.Len() {
			id := int(d.Features[i*2])
			if d.Labels[i] != want[outcomes[(id*7)%3]] {
				t.Fatalf("row %d: label %d", id, d.Labels[i])
			}
		}
	}
	_, m := readDataset(t, filepath.Join(out, "device-0"))
	if m.Name != "csv-by-key/device-0" {
		t.Errorf("manifest name %q", m.Name)
	}
	for _, s := range []string{`natural split by column "user" (13 keys)`, "wrote the 3 class names"} {
		if !strings.Contains(r.out, s) {
			t.Errorf("output lacks %q:\n%s", s, r.out)
		}
	}
	if !strings.Contains(r.errOut, `"name"`) {
		t.Errorf("stderr does not name the skipped text column: %q", r.errOut)
	}
	if entries, _ := os.ReadDir(filepath.Dir(out)); len(entries) != 1 {
		t.Errorf("staging left behind: %v", entries)
	}

	// The same seed writes the same files.
	again := filepath.Join(t.TempDir(), "again")
	if r := execute(t, newDataCSVCommand(&app{}), src, "--label", "outcome", "--key", "user", "--devices", fmt.Sprint(devices),
		"--eval-fraction", "0.1", "--out", again, "--seed", "3"); r.err != nil {
		t.Fatal(r.err)
	}
	for _, name := range append(deviceNames(devices), "eval") {
		a, _ := os.ReadFile(filepath.Join(out, name, data.ManifestFile))
		b, _ := os.ReadFile(filepath.Join(again, name, data.ManifestFile))
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs between two runs with one seed", name)
		}
	}
}

func TestDataCSVSplits(t *testing.T) {
	const n = 300
	src := writeTestFile(t, filepath.Join(t.TempDir(), "people.csv"), peopleCSV(n))
	for _, tc := range []struct {
		alpha, name string
	}{{"0", "csv-iid"}, {"0.5", "csv-dirichlet-0.5"}} {
		out := filepath.Join(t.TempDir(), "sets")
		r := execute(t, newDataCSVCommand(&app{}), src, "--label", "outcome", "--features", "age,id", "--devices", "3",
			"--alpha", tc.alpha, "--out", out)
		if r.err != nil {
			t.Fatal(r.err)
		}
		sets := splitSets(t, out, 3, 2, 3)
		// --features sets the order: id is second.
		coversOnce(t, sets, n, func(x []float32) int { return int(x[1]) })
		_, m := readDataset(t, filepath.Join(out, "device-2"))
		if m.Name != tc.name+"/device-2" {
			t.Errorf("alpha %s: manifest name %q", tc.alpha, m.Name)
		}
	}
}

func TestDataCSVRefuses(t *testing.T) {
	dir := t.TempDir()
	bad := peopleCSV(20)
	lines := strings.Split(bad, "\n")
	lines[16] = "15,person 15,u02,abc,stay" // line 17 of the file
	bad = strings.Join(lines, "\n")
	for _, tc := range []struct {
		name, content string
		args          []string
		want          string
		is            error
	}{
		{"bad number", bad, nil, `people.csv:17: column "age": "abc" is not a number`, ErrInput},
		{"infinite", "x,label\n1,a\n+Inf,b\n", nil, `people.csv:3: column "x": "+Inf" is not a number`, ErrInput},
		{"explicit feature", "x,t,label\n1,a,a\n", []string{"--features", "t"}, `people.csv:2: column "t": "a" is not a number`, ErrInput},
		{"field count", "x,label\n1,a\n2\n", nil, "people.csv:3: column 1: wrong number of fields", ErrInput},
		{"no label column", "x,y\n1,2\n", nil, `--label "label": `, ErrUsage},
		{"no rows", "x,outcome\n", nil, "no data rows", ErrInput},
		{"empty", "", nil, "is empty", ErrInput},
		{"no features", "t,outcome\nabc,a\n", nil, "--features", ErrInput},
		{"duplicate column", "x,x,outcome\n1,2,a\n", nil, `two columns are named "x"`, ErrInput},
		{"too few keys", "x,k,outcome\n1,a,a\n2,a,b\n3,b,a\n", []string{"--key", "k", "--eval-fraction", "0"}, "distinct keys", ErrUsage},
		{"too many devices", "x,outcome\n1,a\n2,b\n", nil, "--devices 3", ErrUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := writeTestFile(t, filepath.Join(dir, tc.name, "people.csv"), tc.content)
			out := filepath.Join(dir, tc.name, "out")
			label := "outcome"
			if !strings.Contains(tc.content, "outcome") && tc.name != "empty" {
				label = "label"
			}
			args := append([]string{src, "--label", label, "--devices", "3", "--out", out}, tc.args...)
			r := execute(t, newDataCSVCommand(&app{}), args...)
			if !errors.Is(r.err, tc.is) || !strings.Contains(r.err.Error(), tc.want) {
				t.Fatalf("error %v, want %v naming %q", r.err, tc.is, tc.want)
			}
			if !strings.HasPrefix(r.err.Error(), "data csv: ") && !errors.Is(r.err, ErrUsage) {
				t.Errorf("error %q lacks the command's name", r.err)
			}
			// Nothing is left behind: neither the output nor a staging
			// directory.
			entries, _ := os.ReadDir(filepath.Join(dir, tc.name))
			if len(entries) != 1 {
				t.Errorf("left behind: %v", entries)
			}
		})
	}
}
