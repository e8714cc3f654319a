// Command gensdk writes wasm/sdk/v2's generated files; run it from
// wasm/sdk/v2 (go generate does).
package main

import (
	"fmt"
	"os"

	"github.com/fleetlearn/fleetlearn/wasm/sdk/internal/gensdk"
)

func main() {
	files, err := gensdk.Generate("..")
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
