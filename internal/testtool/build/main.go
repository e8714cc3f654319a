// Command build compiles the third-party programs that Fleetlearn's tests
// run (package testtool) into their cache, so that go test finds them
// instead of building them inside a test's time limit.
//
//	go run ./internal/testtool/build            # every tool
//	go run ./internal/testtool/build nats       # just the nats CLI
package main

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/fleetlearn/fleetlearn/internal/testtool"
)

func main() {
	root, err := testtool.RepoRoot(".")
	if err != nil {
		fmt.Fprintln(os.Stderr, err, "(run this from the Fleetlearn repository)")
		os.Exit(2)
	}
	tools := testtool.All
	if len(os.Args) > 1 {
		tools = nil
		for _, name := range os.Args[1:] {
			i := slices.IndexFunc(testtool.All, func(t testtool.Tool) bool { return t.Name == name })
			if i < 0 {
				fmt.Fprintf(os.Stderr, "build: no tool %q; the tools are:", name)
				for _, t := range testtool.All {
					fmt.Fprintf(os.Stderr, " %s", t.Name)
				}
				fmt.Fprintln(os.Stderr)
				os.Exit(2)
			}
			tools = append(tools, testtool.All[i])
		}
	}
	for _, t := range tools {
		bin, err := t.Build(context.Background(), root)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("built %s, %s: %s\n", t.Name, t.About, bin)
	}
}
