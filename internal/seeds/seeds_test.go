package seeds_test

import (
	"testing"

	"github.com/fleetlearn/fleetlearn/internal/seeds"
)

func TestRead(t *testing.T) {
	got := seeds.Read(t, "example", "*.txt")
	if len(got) != 2 || string(got["a.txt"]) != "a\n" || string(got["b.txt"]) != "b\n" {
		t.Fatalf("read %q", got)
	}
}
