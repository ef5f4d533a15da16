package telemetry

import (
	"context"
	"errors"
	"log/slog"

	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
)

// TemporalLogger is the logger to give the Temporal SDK
// (client.Options.Logger, which its workers use too): l, with every value
// the SDK logs under its "Result" key withheld, and its lines about a
// canceled activity a level lower (see Warn). The SDK logs an
// activity's whole encoded result when the activity returns after its
// deadline ("Activity complete after timeout."), and without a payload
// codec that is generated text, which is never written to a log
// (docs/contract.md section 7). The line itself is kept: it says which
// activity returned late.
func TemporalLogger(l *slog.Logger) sdklog.Logger {
	// One frame more than the SDK's adapter expects: ours.
	return sdkLogger{next: sdklog.Skip(sdklog.NewStructuredLogger(l), 1)}
}

// withheld is what a withheld value is logged as.
const withheld = "[withheld: may hold generated text]"

// sdkResultKey is the key the SDK logs results under.
const sdkResultKey = "Result"

type sdkLogger struct{ next sdklog.Logger }

func (s sdkLogger) Debug(msg string, keyvals ...any) { s.next.Debug(msg, withhold(keyvals)...) }
func (s sdkLogger) Info(msg string, keyvals ...any)  { s.next.Info(msg, withhold(keyvals)...) }

// Warn and Error log a line about a canceled activity (its "Error" a
// cancellation) one step lower, at Debug and Info: the workflow canceled
// it because its action's scope ended (a user's cancel, say), an outcome
// durallm expects, not a fault to act on. Every other warning and error
// keeps its level.
func (s sdkLogger) Warn(msg string, keyvals ...any) {
	if canceled(keyvals) {
		s.next.Debug(msg, withhold(keyvals)...)
		return
	}
	s.next.Warn(msg, withhold(keyvals)...)
}

func (s sdkLogger) Error(msg string, keyvals ...any) {
	if canceled(keyvals) {
		s.next.Info(msg, withhold(keyvals)...)
		return
	}
	s.next.Error(msg, withhold(keyvals)...)
}

// sdkErrorKey is the key the SDK logs errors under.
const sdkErrorKey = "Error"

// canceled reports whether the line's error is a cancellation.
func canceled(keyvals []any) bool {
	for i := 0; i+1 < len(keyvals); i += 2 {
		if k, ok := keyvals[i].(string); ok && k == sdkErrorKey {
			err, _ := keyvals[i+1].(error)
			return err != nil && (errors.Is(err, context.Canceled) || temporal.IsCanceledError(err))
		}
	}
	return false
}

// With implements sdklog.WithLogger.
func (s sdkLogger) With(keyvals ...any) sdklog.Logger {
	return sdkLogger{next: sdklog.With(s.next, withhold(keyvals)...)}
}

// WithCallerSkip implements sdklog.WithSkipCallers.
func (s sdkLogger) WithCallerSkip(depth int) sdklog.Logger {
	return sdkLogger{next: sdklog.Skip(s.next, depth)}
}

// withhold returns keyvals with the value of every result key replaced,
// copying only when there is one (keyvals is the SDK's).
func withhold(keyvals []any) []any {
	var out []any
	for i := 0; i+1 < len(keyvals); i += 2 {
		if k, ok := keyvals[i].(string); !ok || k != sdkResultKey {
			continue
		}
		if out == nil {
			out = append([]any(nil), keyvals...)
		}
		out[i+1] = withheld
	}
	if out == nil {
		return keyvals
	}
	return out
}
