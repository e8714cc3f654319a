package edgecmd

import (
	"testing"

	"github.com/fleetlearn/fleetlearn/internal/cliflags"
)

// TestSubcommandsHaveExamples: every command of fleetlearn-edge that runs shows in
// its help how it is run.
func TestSubcommandsHaveExamples(t *testing.T) {
	for _, c := range cliflags.WithoutExample(newRootCommand(nil)) {
		t.Errorf("%s has no Example that runs it", c)
	}
}
