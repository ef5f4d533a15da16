package telemetry

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	sdklog "go.temporal.io/sdk/log"
)

// The line the Temporal SDK logs for an activity that returned after its
// deadline carries the whole result: what reaches the log keeps the line
// and withholds the result, however the SDK's logger is derived.
func TestTheSDKsLateActivityLineNeverLogsTheResult(t *testing.T) {
	const answer = "ANSWER-CANARY-0815"
	var buf bytes.Buffer
	l := TemporalLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	late := func(l sdklog.Logger) {
		l.Info("Activity complete after timeout.", "WorkflowID", "act-1", "ActivityType", "CallModel", "Attempt", 1,
			"Result", `payloads:{data:"{\"response\":{\"text\":\"`+answer+`\"}}"}`, "Error", nil)
	}
	late(l)
	late(sdklog.With(l, "Namespace", "default"))
	late(sdklog.Skip(l, 1))
	l.(sdklog.WithLogger).With("Result", answer).Warn("derived")
	out := buf.String()
	if strings.Contains(out, answer) {
		t.Fatalf("the log holds the result:\n%s", out)
	}
	if strings.Count(out, "Activity complete after timeout.") != 3 || strings.Count(out, withheld) != 4 || !strings.Contains(out, "WorkflowID=act-1") {
		t.Fatalf("the lines are not kept as they are, bar the result:\n%s", out)
	}
	// The source is the SDK's caller, not this adapter.
	var src bytes.Buffer
	TemporalLogger(slog.New(slog.NewJSONHandler(&src, &slog.HandlerOptions{AddSource: true}))).Info("x")
	if !strings.Contains(src.String(), "sdklog_test.go") {
		t.Fatalf("source: %s", src.String())
	}
}
