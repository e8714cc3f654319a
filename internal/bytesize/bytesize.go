// Package bytesize parses the sizes operators type on command lines
// ("512MiB", "2GiB", "1073741824"), the one parser behind every memory and
// capacity flag.
package bytesize

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Max bounds a size: 1 PiB is more than any one machine or quota.
const Max = 1 << 50

// ErrSize reports text that is not a size.
var ErrSize = errors.New("bytesize: want a size such as 512MiB, 2GiB or a byte count")

var units = []struct {
	suffix string
	mult   float64
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

// Parse reads a non-negative size: a number (decimals allowed with a unit)
// optionally followed by B, KiB, MiB, GiB or TiB, up to Max.
func Parse(s string) (int64, error) {
	num, mult := strings.TrimSpace(s), 1.0
	for _, u := range units {
		if n, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(v) || v < 0 || v*mult > Max || mult == 1 && v != math.Trunc(v) {
		return 0, fmt.Errorf("%q: %w", s, ErrSize)
	}
	return int64(math.Round(v * mult)), nil
}

// Value is a flag holding a size (it implements pflag.Value and
// flag.Value).
type Value int64

func (v *Value) String() string { return strconv.FormatInt(int64(*v), 10) }

// Set parses s with Parse.
func (v *Value) Set(s string) error {
	n, err := Parse(s)
	if err != nil {
		return err
	}
	*v = Value(n)
	return nil
}

// Type names the flag's kind in help output.
func (*Value) Type() string { return "bytes" }
