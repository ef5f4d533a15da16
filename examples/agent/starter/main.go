// Command starter asks the agent a question and prints its answer. With
// -stream it also prints each turn as the model generates it (its text,
// and the tools it calls), read from the durallm worker's stream
// endpoint: a turn's action id is known before its call starts
// (agent.CallName, step.ActionID), so the starter follows turn after turn
// by id. With -stop it sends a running agent the stop signal instead.
//
//	go run ./examples/agent/starter -question "Where is order 42?" -stream
//	go run ./examples/agent/starter -stop agent-20260101-120000
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

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/examples/agent"
	"github.com/durallm/durallm/resultstore"
	"github.com/durallm/durallm/step"
)

func main() {
	question := flag.String("question", "Where is my order?", "the question for the agent")
	id := flag.String("id", "agent-"+time.Now().Format("20060102-150405"), "the agent workflow's id")
	stream := flag.Bool("stream", false, "print each turn as it is generated")
	streams := flag.String("streams", "http://127.0.0.1:9092", "the durallm worker's stream address (durallm dev --stream-addr)")
	results := flag.String("result-dir", envOr("DURALLM_RESULT_DIR", ".durallm/results"), "the durallm workers' result store (durallm dev keeps it in DATA_DIR/results)")
	stop := flag.String("stop", "", "send the agent with this workflow id the stop signal, and exit")
	flag.Parse()

	opts, err := envconfig.LoadDefaultClientOptions()
	if err != nil {
		log.Fatalln("Temporal client settings:", err)
	}
	// The worker's converter: the agent's input and output travel by
	// reference when large, as its history holds them.
	opts.DataConverter = durallm.DataConverter(resultstore.Dir{Path: *results})
	c, err := client.Dial(opts)
	if err != nil {
		log.Fatalln("Unable to create the Temporal client:", err)
	}
	defer c.Close()
	ctx := context.Background()

	if *stop != "" {
		if err := c.SignalWorkflow(ctx, *stop, "", agent.SignalStop, nil); err != nil {
			log.Fatalln("Unable to stop the agent:", err)
		}
		fmt.Println("asked agent", *stop, "to stop")
		return
	}

	// Nothing marks the end of the last turn's stream before the agent's
	// result: stop following once the result is in, which follows it.
	streamCtx, stopStream := context.WithCancel(ctx)
	defer stopStream()
	done := make(chan struct{})
	if *stream {
		// Follow each turn from its first event, opened before or after
		// its call starts: the worker keeps a stream's events a while.
		go func() {
			defer close(done)
			for turn := 1; streamCtx.Err() == nil; turn++ {
				if err := printTurn(streamCtx, *streams, turn, step.ActionID(*id, agent.CallName(turn))); err != nil && streamCtx.Err() == nil {
					log.Println("stream:", err)
					return
				}
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
	err = run.Get(ctx, &out)
	stopStream()
	<-done
	if err != nil {
		log.Fatalln("The agent failed:", err)
	}
	fmt.Println()
	for _, t := range out.Tools {
		fmt.Printf("turn %d called %s\n", t.Turn, t.Name)
	}
	fmt.Printf("answer (turn %d): %s\n", out.Turns, out.Answer)
	if out.Stopped {
		fmt.Println("(stopped)")
	}
	fmt.Printf("actions: %s\n", strings.Join(out.Actions, ", "))
}

// printTurn prints turn's stream (action id's), from its first event to
// its end: the text as it comes, and the name of each tool it calls.
func printTurn(ctx context.Context, base string, turn int, id string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/streams/"+url.PathEscape(id)+"?starting_after=0", nil)
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
	sc.Buffer(nil, 1<<20)
	started := false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Kind     string `json:"kind"`
			Delta    string `json:"delta"`
			ToolCall *struct {
				Name string `json:"name"`
			} `json:"tool_call"`
		}
		if json.Unmarshal([]byte(data), &ev) != nil {
			continue
		}
		if !started {
			started = true
			fmt.Printf("turn %d: ", turn)
		}
		switch {
		case ev.Kind == "content":
			fmt.Print(ev.Delta)
		case ev.Kind == "tool_call" && ev.ToolCall != nil && ev.ToolCall.Name != "":
			fmt.Printf("[calls %s] ", ev.ToolCall.Name)
		case ev.Kind == "end":
			fmt.Println()
			return nil
		}
	}
	return sc.Err()
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
