package devserver

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"

	"go.temporal.io/server/common/log"
	"go.temporal.io/server/common/log/tag"
)

// levelHandler drops records below a minimum level before they reach the
// wrapped handler. The server logs hundreds of Info lines during a normal
// start, so the floor has to sit in front of whatever handler the caller
// gave us rather than rely on that handler's own level.
//
// While quiet is set (from the start of Stop) it also drops everything
// unless the floor is Debug: a graceful shutdown makes every internal
// poller log "connection refused" or "context canceled" at Warn and Error,
// which is expected and would bury the user's terminal on each Ctrl-C.
type levelHandler struct {
	floor slog.Leveler
	quiet *atomic.Bool
	inner slog.Handler
}

func (h levelHandler) Enabled(ctx context.Context, l slog.Level) bool {
	floor := h.floor.Level()
	if h.quiet.Load() && floor > slog.LevelDebug {
		return false
	}
	return l >= floor && h.inner.Enabled(ctx, l)
}

func (h levelHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.inner.Handle(ctx, r)
}

func (h levelHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return levelHandler{floor: h.floor, quiet: h.quiet, inner: h.inner.WithAttrs(attrs)}
}

func (h levelHandler) WithGroup(name string) slog.Handler {
	return levelHandler{floor: h.floor, quiet: h.quiet, inner: h.inner.WithGroup(name)}
}

// newFilteredLogger returns l restricted to records at or above floor, and
// silenced while quiet is set.
func newFilteredLogger(l *slog.Logger, floor slog.Leveler, quiet *atomic.Bool) *slog.Logger {
	return slog.New(levelHandler{floor: floor, quiet: quiet, inner: l.Handler()})
}

// serverLogger adapts the server's tag-based log.Logger interface to slog.
// The wrapped slog.Logger is expected to be already level-filtered (see
// newFilteredLogger), so the Enabled check below is cheap and tags are
// only converted for records that will be written.
type serverLogger struct {
	l *slog.Logger
}

var (
	_ log.Logger      = serverLogger{}
	_ log.WithLogger  = serverLogger{}
	_ log.SLogWrapper = serverLogger{}
)

func (s serverLogger) Debug(msg string, tags ...tag.Tag) { s.log(slog.LevelDebug, msg, tags) }
func (s serverLogger) Info(msg string, tags ...tag.Tag)  { s.log(slog.LevelInfo, msg, tags) }
func (s serverLogger) Warn(msg string, tags ...tag.Tag)  { s.log(slog.LevelWarn, msg, tags) }
func (s serverLogger) Error(msg string, tags ...tag.Tag) { s.log(slog.LevelError, msg, tags) }

// DPanic is logged as an error only, as zap does outside development mode.
func (s serverLogger) DPanic(msg string, tags ...tag.Tag) { s.log(slog.LevelError, msg, tags) }

// Panic and Fatal log the record and then panic with a *fatalError. The
// server calls them where it cannot continue (e.g. it failed to bind a
// port) and relies on them not returning: carrying on would only crash
// later on a nil listener with a misleading trace. The server's own zap
// logger calls os.Exit in Fatal; panicking instead lets Start recover the
// ones raised on its goroutine and return them as errors, and gives a
// stack trace for the rest.
func (s serverLogger) Panic(msg string, tags ...tag.Tag) { s.fatal(msg, tags) }

// Fatal: see Panic.
func (s serverLogger) Fatal(msg string, tags ...tag.Tag) { s.fatal(msg, tags) }

func (s serverLogger) fatal(msg string, tags []tag.Tag) {
	attrs := tagsToAttrs(tags)
	s.l.LogAttrs(context.Background(), slog.LevelError, msg, attrs...)
	panic(&fatalError{msg: msg, attrs: attrs})
}

// fatalError is the panic value of serverLogger.Fatal and Panic.
type fatalError struct {
	msg   string
	attrs []slog.Attr
}

func (e *fatalError) Error() string {
	var b strings.Builder
	b.WriteString(e.msg)
	for i, a := range e.attrs {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString(", ")
		}
		b.WriteString(a.String())
	}
	return b.String()
}

// recoverFatal runs f and turns a *fatalError panic raised on this
// goroutine into an error; any other panic is re-raised untouched.
func recoverFatal(f func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			fe, ok := v.(*fatalError)
			if !ok {
				panic(v)
			}
			err = fe
		}
	}()
	return f()
}

// With pre-binds tags; implementing it keeps the server from falling back
// to its slower generic tag prepender.
func (s serverLogger) With(tags ...tag.Tag) log.Logger {
	if len(tags) == 0 {
		return s
	}
	return serverLogger{l: slog.New(s.l.Handler().WithAttrs(tagsToAttrs(tags)))}
}

// SLog lets server components that want a *slog.Logger (via
// log.NewSlogLogger) use ours directly; it carries the same level floor.
func (s serverLogger) SLog() *slog.Logger { return s.l }

func (s serverLogger) log(level slog.Level, msg string, tags []tag.Tag) {
	ctx := context.Background()
	if !s.l.Enabled(ctx, level) {
		return
	}
	s.l.LogAttrs(ctx, level, msg, tagsToAttrs(tags)...)
}

func tagsToAttrs(tags []tag.Tag) []slog.Attr {
	attrs := make([]slog.Attr, 0, len(tags))
	for _, t := range tags {
		attrs = append(attrs, slog.Any(t.Key(), t.Value()))
	}
	return attrs
}
