package cli_test

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/cli"
)

// Command groups beyond the built-in ones join the root the same way they do.
func ExampleNewRootCommand() {
	root := cli.NewRootCommand()
	root.AddCommand(&cobra.Command{Use: "lab", Short: "Experiments of this deployment"})
	for _, c := range root.Commands() {
		fmt.Println(c.Name())
	}
	// Output:
	// audit
	// data
	// demo
	// device
	// dp
	// lab
	// model
	// module
	// nats
	// pool
	// task
	// token
	// version
}
