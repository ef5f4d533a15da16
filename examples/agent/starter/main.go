// Command starter asks the agent a question and prints its answer. With
// -stream it also prints the final answer as the model generates it,
// read from the durallm worker's stream endpoint: the app knows the
// call's action id before the call starts (step.ActionID), so it
// subscribes first.
//
//	go run ./examples/agent/starter -question "Where is order 42?" -stream
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/contrib/envconfig"

	"github.com/durallm/durallm/examples/agent"
	"github.com/durallm/durallm/step"
)

func main() {
	question := flag.String("question", "Where is my order?", "the question for the agent")
	id := flag.String("id", "agent-"+time.Now().Format("20060102-150405"), "the agent workflow's id")
	stream := flag.Bool("stream", false, "print the final answer as it is generated")
	streams := flag.String("streams", "http://127.0.0.1:9092", "the durallm worker's stream address (durallm dev --stream-addr)")
	flag.Parse()

	opts, err := envconfig.LoadDefaultClientOptions()
	if err != nil {
		log.Fatalln("Temporal client settings:", err)
	}
	c, err := client.Dial(opts)
	if err != nil {
		log.Fatalln("Unable to create the Temporal client:", err)
	}
	defer c.Close()

	ctx := context.Background()
	done := make(chan struct{})
	// Nothing marks a stream's normal end: stop reading once the result
	// is in, which follows the last delta.
	streamCtx, stopStream := context.WithCancel(ctx)
	defer stopStream()
	if *stream {
		// Subscribe before the call exists: the stream waits for it.
		go func() {
			defer close(done)
			if err := printStream(streamCtx, *streams, step.ActionID(*id, agent.CallAnswer)); err != nil && streamCtx.Err() == nil {
				log.Println("stream:", err)
			}
		}()
	} else {
		close(done)
	}

	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: *id, TaskQueue: agent.TaskQueue},
		agent.Agent, agent.Input{Question: *question, Stream: *stream})
	if err != nil {
		log.Fatalln("Unable to start the agent:", err)
	}
	fmt.Println("started agent", run.GetID())
	var out agent.Output
	if err := run.Get(ctx, &out); err != nil {
		log.Fatalln("The agent failed:", err)
	}
	stopStream()
	<-done
	fmt.Printf("tool: %s → %s\nanswer: %s\nactions: %s\n", out.Tool, out.ToolResult, out.Answer, strings.Join(out.Actions, ", "))
}

// printStream prints the deltas of action id's stream until it ends.
func printStream(ctx context.Context, base, id string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/streams/"+url.PathEscape(id), nil)
	if err != nil {
		return err
	}
	if tok := os.Getenv("DURALLM_STREAM_TOKEN"); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", req.URL, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Delta  string `json:"delta"`
			Reason string `json:"reason"`
		}
		if json.Unmarshal([]byte(data), &ev) == nil && ev.Delta != "" {
			fmt.Print(ev.Delta)
		}
	}
	fmt.Println()
	return sc.Err()
}
