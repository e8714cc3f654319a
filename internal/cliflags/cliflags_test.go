package cliflags

import (
	"slices"
	"testing"

	"github.com/spf13/cobra"
)

func TestSingleDash(t *testing.T) {
	root := &cobra.Command{Use: "x"}
	root.Flags().String("data-dir", "", "")
	root.Flags().BoolP("verbose", "v", false, "")
	sub := &cobra.Command{Use: "enroll"}
	sub.Flags().String("api", "", "")
	root.AddCommand(sub)
	in := []string{"-data-dir", "d", "-data-dir=e", "--data-dir", "f", "-v", "enroll", "-api=h:1", "-n", "-5", "-unknown", "--", "-data-dir"}
	want := []string{"--data-dir", "d", "--data-dir=e", "--data-dir", "f", "-v", "enroll", "--api=h:1", "-n", "-5", "-unknown", "--", "-data-dir"}
	if got := SingleDash(root, in); !slices.Equal(got, want) {
		t.Fatalf("SingleDash =\n%q, want\n%q", got, want)
	}
	if in[0] != "-data-dir" {
		t.Error("SingleDash changed its input")
	}
}
