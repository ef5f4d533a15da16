package telemetry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
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

// An activity the workflow canceled is an outcome durallm expects (a
// user's cancel): the SDK's lines about it are not warnings or errors,
// while a real activity error still is one.
func TestTheSDKsLinesAboutACanceledActivityAreNotWarningsOrErrors(t *testing.T) {
	canceled := fmt.Errorf("durallm: attempt 1 of act-1 canceled: %w (%w)", context.Canceled, temporal.NewCanceledError("details"))
	for _, tt := range []struct {
		name  string
		log   func(sdklog.Logger)
		level string
	}{
		{"the activity returned its cancellation", func(l sdklog.Logger) {
			l.Error("Activity error.", "ActivityType", "CallModel", "Error", canceled)
		}, "INFO"},
		{"a heartbeat found the activity canceled", func(l sdklog.Logger) {
			l.Warn("RecordActivityHeartbeat with error", "ActivityType", "CallModel", "Error", context.Canceled)
		}, "DEBUG"},
		{"a heartbeat found it canceled, through a derived logger", func(l sdklog.Logger) {
			sdklog.With(l, "Namespace", "default").Warn("RecordActivityHeartbeat with error", "Error", temporal.NewCanceledError())
		}, "DEBUG"},
		{"a real activity error", func(l sdklog.Logger) {
			l.Error("Activity error.", "ActivityType", "CallModel", "Error", errors.New("boom"))
		}, "ERROR"},
		{"a real heartbeat error", func(l sdklog.Logger) {
			l.Warn("RecordActivityHeartbeat with error", "Error", errors.New("unavailable"))
		}, "WARN"},
	} {
		var buf bytes.Buffer
		tt.log(TemporalLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))))
		if !strings.Contains(buf.String(), "level="+tt.level+" ") {
			t.Errorf("%s: logged %q, want level %s", tt.name, buf.String(), tt.level)
		}
	}
}
