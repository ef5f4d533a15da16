//go:build !nodev

package main

// The development tools, in every build but -tags nodev.
func init() {
	commands["dev"] = command{devTools["dev"], runDev}
	commands["chaos"] = command{devTools["chaos"], runChaos}
	commands["demo-provider"] = command{devTools["demo-provider"], runDemoProvider}
	commands["check-path"] = command{devTools["check-path"], runCheckPath}
}
