package cli_test

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/cli"
)

// Command groups beyond the built-in ones join the root the same way they do.
func ExampleNewRootCommand() {
	root := cli.NewRootCommand()
	root.AddCommand(&cobra.Command{Use: "pool", Short: "Run jobs on the compute pool"})
	for _, c := range root.Commands() {
		fmt.Println(c.Name())
	}
	// Output:
	// audit
	// data
	// demo
	// device
	// dp
	// model
	// module
	// nats
	// pool
	// task
	// token
	// version
}
