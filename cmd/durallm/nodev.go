//go:build nodev

package main

import (
	"fmt"
	"io"
)

// In a production build the development tools are not linked; asking for
// one says so, and where to find it, instead of "unknown command".
func init() {
	for name, summary := range devTools {
		commands[name] = command{"(not in this build) " + summary, func(_ []string, _, stderr io.Writer) int {
			fmt.Fprintf(stderr, "durallm %s: not in this build: it was built with -tags nodev, the production build, which leaves out the development tools.\n"+
				"From a checkout, run: go run ./cmd/durallm %s\n", name, name)
			return exitUsage
		}}
	}
}
