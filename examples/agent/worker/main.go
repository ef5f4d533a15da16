// Command worker runs the agent example's own worker: the Agent workflow
// and its tool activity, on the task queue "agent". The LLM calls run on
// a durallm worker (`durallm dev` starts one), not here.
//
//	go run ./cmd/durallm dev            # in one terminal
//	go run ./examples/agent/worker      # in another
//	go run ./examples/agent/starter     # in a third
package main

import (
	"log"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/contrib/envconfig"
	"go.temporal.io/sdk/worker"

	"github.com/durallm/durallm/examples/agent"
)

func main() {
	// TEMPORAL_ADDRESS and friends, or 127.0.0.1:7233 where `durallm dev`
	// listens.
	opts, err := envconfig.LoadDefaultClientOptions()
	if err != nil {
		log.Fatalln("Temporal client settings:", err)
	}
	c, err := client.Dial(opts)
	if err != nil {
		log.Fatalln("Unable to create the Temporal client:", err)
	}
	defer c.Close()

	w := worker.New(c, agent.TaskQueue, worker.Options{})
	w.RegisterWorkflow(agent.Agent)
	w.RegisterActivity(&agent.Activities{})
	if err := w.Run(worker.InterruptCh()); err != nil {
		log.Fatalln("Unable to start the worker:", err)
	}
}
