// Command durallm runs durable, recovery-safe LLM calls on Temporal.
//
//	durallm dev                      embedded Temporal server + UI + worker + demo
//	durallm worker                   a worker against any Temporal server
//	durallm gateway                  the OpenAI-compatible front door (/v1/chat/completions)
//	durallm run|start                start an action (run waits for its result)
//	durallm status|cancel|reconcile  steer one action
//	durallm list                     list actions by state
//	durallm check-path --via URL     the recovery runbook through a proxy path
//
// Every subcommand has --help. See docs/cli.md.
//
// Built with -tags nodev (the production build, as in the Dockerfile) it
// leaves out dev, chaos, demo-provider and check-path, and with them the embedded
// Temporal server: see devtools.go and nodev.go.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// Exit codes. They let scripts tell a completed action from a failed,
// canceled or indeterminate one without parsing output.
const (
	exitOK             = 0 // completed, completed_partial or reconciled; or the command succeeded
	exitError          = 1 // the command could not do its work (connection, server, I/O)
	exitUsage          = 2 // bad flags or input; nothing was started
	exitFailed         = 3 // the action ended failed
	exitRejected       = 4 // the action ended rejected
	exitCanceled       = 5 // the action ended canceled
	exitIndeterminate  = 6 // the action ended indeterminate
	exitAwaiting       = 7 // run --wait gave up while the action awaits reconciliation
	exitSpendExhausted = 8 // the action ended spend_exhausted: its budget was spent
)

type command struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

var commands = map[string]command{
	"worker":       {"run a worker against a Temporal server (TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, ...)", runWorker},
	"gateway":      {"serve the OpenAI chat-completions and Anthropic Messages APIs with durable actions behind them", runGateway},
	"run":          {"start an action and wait for its result", func(a []string, o, e io.Writer) int { return runStart(a, o, e, true) }},
	"start":        {"start an action and print its id", func(a []string, o, e io.Writer) int { return runStart(a, o, e, false) }},
	"status":       {"print an action's state and attempt timeline", runStatus},
	"cancel":       {"cancel an action with an origin", runCancel},
	"reconcile":    {"deliver a verdict on an action awaiting reconciliation", runReconcile},
	"list":         {"list actions in a state", runList},
	"load":         {"drive happy actions at a concurrency and report actions/s and latency percentiles", runLoad},
	"codec-server": {"serve the payload codec for the Temporal UI and CLI (payloads by reference, encrypted payloads)", runCodecServer},
}

// The development tools (dev, chaos, demo-provider, check-path) link the
// embedded Temporal server, the chaos harness and the fault-injecting
// provider. A
// production build leaves them out with -tags nodev (the Dockerfile
// does); devtools.go adds them otherwise, so `go run ./cmd/durallm dev`
// stays the newcomer's one command.
var devTools = map[string]string{
	"dev":           "run the embedded Temporal server and UI, a worker and the demonstration",
	"chaos":         "run actions through haproxy while reloading it, and check the invariants",
	"demo-provider": "serve the fault-injecting demo provider on its own (for docker-compose)",
	"check-path":    "run the recovery runbook through a proxy path to the fault-injecting provider: what it preserved, what it hid",
}

func main() {
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "durallm: unknown command %q\n\n", args[0])
		usage(stderr)
		return exitUsage
	}
	return cmd.run(args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: durallm <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-14s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'durallm <command> --help' for a command's flags. Exit codes:")
	fmt.Fprintln(w, "  0 completed (or partial, or reconciled) · 1 error · 2 usage · 3 failed · 4 rejected · 5 canceled · 6 indeterminate · 7 still awaiting reconciliation · 8 spend_exhausted")
}

// newFlags makes a FlagSet whose --help prints the command's usage.
func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("durallm "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: durallm %s %s\n\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses flags; ok is false with the exit code to return.
func parse(fs *flag.FlagSet, args []string) (code int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, false
		}
		return exitUsage, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected arguments: %s\n", fs.Name(), strings.Join(fs.Args(), " "))
		return exitUsage, false
	}
	return 0, true
}

// listFlag collects a repeatable, comma-separated flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}
