// Package actionshape is what a parent workflow sees of one LLM call, in
// a form two runs of the same case can be compared by: the scripted
// actions of testsuite/actiontest against the real LLMAction with the real
// activities, in the SDK's test environment and on a Temporal server
// (internal/e2e records the server's shapes the actiontest comparison
// reads, for what the test environment cannot show).
package actionshape

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"

	"go.temporal.io/sdk/workflow"

	"github.com/durallm/durallm"
	"github.com/durallm/durallm/step"
	"github.com/durallm/durallm/workflows"
)

// CallName is the name Parent makes its call under.
const CallName = "ask"

// Call is what Parent saw of its one call: the result, and what
// errors.As and errors.Is made of the error.
type Call struct {
	Result   workflows.ActionResult `json:"result"`
	Err      bool                   `json:"err"`
	Action   *durallm.ActionError   `json:"action,omitempty"`
	Awaiting bool                   `json:"awaiting"`
}

// Input is Parent's input: the action, and the durallm task queue (empty:
// step's default).
type Input struct {
	Action    workflows.ActionInput `json:"action"`
	TaskQueue string                `json:"task_queue,omitempty"`
}

// Parent is a workflow that makes one call, named CallName, with
// step.Call and reports what it saw. It reports even when it is canceled:
// step.Call waits for the action's end.
func Parent(ctx workflow.Context, in Input) (Call, error) {
	var opts []step.Option
	if in.TaskQueue != "" {
		opts = append(opts, step.TaskQueue(in.TaskQueue))
	}
	res, err := step.Call(ctx, CallName, in.Action, opts...)
	c := Call{Result: res, Err: err != nil, Awaiting: errors.Is(err, durallm.ErrAwaitingReconciliation)}
	var ae *durallm.ActionError
	if errors.As(err, &ae) {
		c.Action = ae
	}
	return c, nil
}

// volatile are the keys whose values differ from run to run (times, ids,
// connection refs, byte counts, a stored result's digest); they are
// compared by presence only.
var volatile = map[string]bool{
	"at": true, "scheduled": true, "deadline": true, "duration": true, "elapsed": true, "first_byte": true,
	"attempt_id": true, "conn_ref": true, "authority": true, "request_bytes": true, "response_bytes": true,
	"id": true, "created": true, "model": true, "debug_len": true, "prompt_tokens": true, "completion_tokens": true, "total_tokens": true, "stream_id": true,
	"result_ref": true,
}

// Of is v as JSON, with each volatile value replaced by its JSON kind
// and the keys named in ignore left out wherever they are (a fact one of
// the runs may or may not have seen, such as a connection the provider
// closes as the attempt ends).
func Of(v any, ignore ...string) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	var walk func(any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if slices.Contains(ignore, k) {
					delete(x, k)
					continue
				}
				if volatile[k] {
					x[k] = fmt.Sprintf("<%T>", e)
					continue
				}
				x[k] = walk(e)
			}
		case []any:
			for i, e := range x {
				x[i] = walk(e)
			}
		}
		return v
	}
	return walk(m), nil
}

// Diff lists, one a line and sorted, the paths where shapes a and b
// differ, each with the two values under the names given; empty when they
// agree.
func Diff(aName string, a any, bName string, b any) string {
	var out []string
	var walk func(path string, a, b any)
	walk = func(path string, a, b any) {
		am, aok := a.(map[string]any)
		bm, bok := b.(map[string]any)
		if aok && bok {
			keys := map[string]bool{}
			for k := range am {
				keys[k] = true
			}
			for k := range bm {
				keys[k] = true
			}
			for k := range keys {
				walk(path+"."+k, am[k], bm[k])
			}
			return
		}
		as, aok := a.([]any)
		bs, bok := b.([]any)
		if aok && bok && len(as) == len(bs) {
			for i := range as {
				walk(fmt.Sprintf("%s[%d]", path, i), as[i], bs[i])
			}
			return
		}
		if !reflect.DeepEqual(a, b) {
			out = append(out, fmt.Sprintf("%s: %s %v, %s %v", path, aName, a, bName, b))
		}
	}
	walk("", a, b)
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// Read reads shapes recorded by Write: case name → shape.
func Read(path string) (map[string]any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("actionshape: %s: %w", path, err)
	}
	return m, nil
}

// Write writes shapes, case name → shape, indented and sorted by name.
func Write(path string, shapes map[string]any) error {
	b, err := json.MarshalIndent(shapes, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
