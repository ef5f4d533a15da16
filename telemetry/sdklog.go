package telemetry

import (
	"log/slog"

	sdklog "go.temporal.io/sdk/log"
)

// TemporalLogger is the logger to give the Temporal SDK
// (client.Options.Logger, which its workers use too): l, with every value
// the SDK logs under its "Result" key withheld. The SDK logs an
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
func (s sdkLogger) Warn(msg string, keyvals ...any)  { s.next.Warn(msg, withhold(keyvals)...) }
func (s sdkLogger) Error(msg string, keyvals ...any) { s.next.Error(msg, withhold(keyvals)...) }

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
