// Command gensdk writes the generated files of one SDK version; run it from
// that version's directory with the version as its argument (go generate
// does): go run ../internal/gensdk/cmd 4.
package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/fleetlearn/fleetlearn/wasm/sdk/internal/gensdk"
)

func main() {
	v := 2
	if len(os.Args) > 1 {
		n, err := strconv.Atoi(os.Args[1])
		if err != nil {
			fmt.Fprintf(os.Stderr, "gensdk: %q is not an ABI version\n", os.Args[1])
			os.Exit(2)
		}
		v = n
	}
	files, err := gensdk.Generate("..", v)
	if err == nil {
		for name, b := range files {
			if err = os.WriteFile(name, b, 0o644); err != nil {
				break
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
