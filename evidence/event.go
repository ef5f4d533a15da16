package evidence

import (
	"context"
	"log/slog"
)

// AttemptEvent is the message of the one structured log event each
// attempt emits.
const AttemptEvent = "llm.attempt"

// LogAttempt emits the attempt's one structured event. It writes only the
// contract's evidence fields and classification, and extra (the workflow
// adds its decision: next, why, next_route, wait; and the attempt's
// usage, cost and budget reservation, docs/contract.md section 2.3):
// never content, headers, keys or GOAWAY debug data (Evidence holds none
// of them). A truncated answer and a repeated 421 log at Warn, the rest at
// Info: an ambiguous attempt is handled by design (docs/contract.md
// section 2.3).
func LogAttempt(ctx context.Context, logger *slog.Logger, ev Evidence, c Classification, extra ...slog.Attr) {
	level := slog.LevelInfo
	if c.Class == CommittedPartial || c.Class == MisdirectedRepeated {
		level = slog.LevelWarn
	}
	if !logger.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 32)
	attrs = append(attrs,
		slog.String("action_ref", ev.ActionRef),
		slog.Int("attempt", ev.Attempt),
		slog.String("attempt_id", ev.AttemptID),
		slog.String("route", ev.Route),
		slog.String("gen_ai.provider.name", ev.Provider),
		slog.String("gen_ai.request.model", ev.Model),
		slog.String("authority", ev.Authority),
		slog.String("http_version", ev.HTTPVersion),
		slog.String("conn_ref", ev.ConnRef),
		slog.Bool("conn_fresh", ev.ConnFresh),
		slog.Uint64("stream_id", uint64(ev.StreamID)),
		slog.Bool("request_sent", ev.RequestSent),
		slog.Int64("request_bytes", ev.RequestBytes),
		slog.Bool("response_headers", ev.ResponseHeaders),
		slog.Bool("content_started", ev.ContentStarted),
		slog.Int64("response_bytes", ev.ResponseBytes),
		slog.Int("status", ev.Status),
		slog.Duration("retry_after", ev.RetryAfter),
		slog.Duration("elapsed", ev.Elapsed),
		slog.String("classification", string(c.Class)),
		slog.String("reason", c.Reason),
	)
	if ev.GoAway != nil {
		attrs = append(attrs,
			slog.Uint64("goaway_last_stream_id", uint64(ev.GoAway.LastStreamID)),
			slog.String("goaway_code", ev.GoAway.Code.String()))
	}
	if ev.RSTStream != nil {
		attrs = append(attrs, slog.String("rst_stream_code", ev.RSTStream.String()))
	}
	if ev.TransportReplays > 0 {
		attrs = append(attrs, slog.Int("transport_replays", ev.TransportReplays))
	}
	if ev.MappingLost {
		attrs = append(attrs, slog.Bool("mapping_lost", true))
	}
	if ev.MaybeSent {
		attrs = append(attrs, slog.Bool("maybe_sent", true))
	}
	if ev.ProviderError {
		attrs = append(attrs, slog.Bool("provider_error", true))
	}
	if ev.Signal != SignalNone {
		attrs = append(attrs, slog.String("signal", string(ev.Signal)))
	}
	if ev.Stop != "" {
		attrs = append(attrs, slog.String("stop", string(ev.Stop)))
	}
	if ev.Unsendable != "" {
		attrs = append(attrs, slog.String("unsendable", string(ev.Unsendable)))
	}
	if ev.Activity != "" {
		attrs = append(attrs, slog.String("activity", string(ev.Activity)))
	}
	attrs = append(attrs, extra...)
	logger.LogAttrs(ctx, level, AttemptEvent, attrs...)
}
