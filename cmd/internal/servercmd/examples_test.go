package servercmd

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestSubcommandsHaveExamples: every command of fleetlearn-server that runs shows in its
// help how it is run.
func TestSubcommandsHaveExamples(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if !c.Runnable() || c.Hidden || c.Name() == "help" {
			return
		}
		if !strings.Contains(c.Example, c.CommandPath()) {
			t.Errorf("%s has no Example that runs it:\n%s", c.CommandPath(), c.Example)
		}
	}
	walk(newRootCommand(nil))
}
