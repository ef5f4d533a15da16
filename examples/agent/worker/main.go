// Command worker runs the agent example's own worker: the Agent workflow
// and its activities, on the task queue "agent". The LLM calls run on a
// durallm worker (`durallm dev` starts one), not here.
//
//	go run ./cmd/durallm dev            # in one terminal
//	go run ./examples/agent/worker      # in another
//	go run ./examples/agent/starter     # in a third
package main

import (
	"flag"
	"log"
	"os"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/contrib/envconfig"
	"go.temporal.io/sdk/worker"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/examples/agent"
	"github.com/durallm/durallm/resultstore"
)

func main() {
	results := flag.String("result-dir", envOr("DURALLM_RESULT_DIR", ".durallm/results"),
		"the durallm workers' result store (durallm dev keeps it in DATA_DIR/results)")
	flag.Parse()

	// TEMPORAL_ADDRESS and friends, or 127.0.0.1:7233 where `durallm dev`
	// listens.
	opts, err := envconfig.LoadDefaultClientOptions()
	if err != nil {
		log.Fatalln("Temporal client settings:", err)
	}
	// The one line that keeps the agent's conversation out of its
	// history: every payload over 2 KiB (each call's request, each tool's
	// result, the conversation carried across Continue-As-New) goes to
	// the durallm workers' result store, history holding a reference.
	store := resultstore.Dir{Path: *results}
	opts.DataConverter = durallm.DataConverter(store)
	c, err := client.Dial(opts)
	if err != nil {
		log.Fatalln("Unable to create the Temporal client:", err)
	}
	defer c.Close()

	w := worker.New(c, agent.TaskQueue, worker.Options{})
	w.RegisterWorkflow(agent.Agent)
	w.RegisterActivity(&agent.Activities{Results: store})
	if err := w.Run(worker.InterruptCh()); err != nil {
		log.Fatalln("Unable to start the worker:", err)
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
