package bytesize

import (
	"errors"
	"testing"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "1073741824": 1 << 30, "512MiB": 512 << 20, "1.5GiB": 3 << 29,
		"2 GiB": 2 << 30, "1TiB": 1 << 40, "10B": 10, "4KiB": 4096, "1024TiB": Max} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "lots", "-1", "1.5", "NaN", "1025TiB", "1GB", "GiB", "1e400"} {
		if got, err := Parse(in); !errors.Is(err, ErrSize) {
			t.Errorf("Parse(%q) = %d, %v; want ErrSize", in, got, err)
		}
	}
}

func TestValue(t *testing.T) {
	var v Value
	if err := v.Set("256MiB"); err != nil || v != 256<<20 || v.String() != "268435456" || v.Type() != "bytes" {
		t.Fatalf("Set: %v, %v", v, err)
	}
	if err := v.Set("x"); err == nil || v != 256<<20 {
		t.Fatalf("a bad Set changed the value to %v (%v)", v, err)
	}
}
