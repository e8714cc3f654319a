// Command build compiles the third-party programs that Fleetlearn's tests
// run (package testtool) into their cache, so that go test finds them
// instead of building them inside a test's time limit.
//
//	go run ./internal/testtool/build            # every tool
//	go run ./internal/testtool/build nats       # just the nats CLI
//
// It prints how long each build took; a tool already in the cache is not
// rebuilt. The control plane's seven take about 15 minutes on 2 cores with
// empty Go caches (most of it kube-apiserver), and 1.6 GB of module cache
// and 7 GB of build cache.
package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

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
	start := time.Now()
	for _, t := range tools {
		if bin, err := t.Path(root); err == nil {
			if _, err := os.Stat(bin); err == nil {
				fmt.Printf("have %s, %s: %s\n", t.Name, t.About, bin)
				continue
			}
		}
		began := time.Now()
		bin, err := t.Build(context.Background(), root)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("built %s, %s, in %s: %s\n", t.Name, t.About, time.Since(began).Round(time.Second), bin)
	}
	fmt.Printf("tools ready in %s\n", time.Since(start).Round(time.Second))
}
