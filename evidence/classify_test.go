package evidence

import (
	"fmt"
	"testing"
	"time"
)

func code(c ErrCode) *ErrCode { return &c }

// TestClassify walks every row of docs/contract.md section 3 as pure
// Case names read like the contract's rows.
func TestClassify(t *testing.T) {
	sent := func(stream uint32) Evidence {
		return Evidence{ConnRef: "p-c1", RequestSent: true, StreamID: stream}
	}
	with := func(ev Evidence, f func(*Evidence)) Evidence { f(&ev); return ev }
	ok200 := with(sent(1), func(e *Evidence) { e.Status = 200; e.ContentStarted = true })

	tests := []row{
		{"completed: usable response reached the commit boundary", ok200, Completed, "response_complete", nil},

		{"unsent: dial or TLS failure", Evidence{DialFailed: true}, Unsent, "dial_failed", replaySafe},
		{"unsent: connection unusable before HEADERS", Evidence{ConnRef: "p-c1"}, Unsent, "connection_unusable_before_headers", replaySafe},
		{"unsent: attempt timeout before the request left", Evidence{TimedOut: true}, Unsent, "timeout_before_send", replaySafe},
		{"unsent beats a GOAWAY the request never met", with(Evidence{ConnRef: "p-c1"}, func(e *Evidence) { e.GoAway = &GoAway{LastStreamID: 1} }), Unsent, "connection_unusable_before_headers", replaySafe},

		{"refused: GOAWAY NO_ERROR, stream above last-stream id", with(sent(5), func(e *Evidence) { e.GoAway = &GoAway{LastStreamID: 3, Code: CodeNoError} }), Refused, "goaway_above_boundary", func(t *testing.T, c Classification) {
			replaySafe(t, c)
			if !c.FreshConnection || c.ProviderHealth {
				t.Errorf("graceful drain: want a fresh connection, no health impact; got %+v", c)
			}
		}},
		{"refused: RST_STREAM REFUSED_STREAM", with(sent(3), func(e *Evidence) { e.RSTStream = code(CodeRefusedStream) }), Refused, "rst_refused_stream", replaySafe},
		{"ambiguous: RST_STREAM REFUSED_STREAM from an intermediary", with(sent(3), func(e *Evidence) { e.RSTStream = code(CodeRefusedStream); e.Intermediary = true }), Ambiguous, "rst_refused_stream_via_intermediary", nil},
		{"refused: an intermediary's GOAWAY above last-stream id still proves it", with(sent(5), func(e *Evidence) {
			e.GoAway = &GoAway{LastStreamID: 3, Code: CodeNoError}
			e.Intermediary = true
		}), Refused, "goaway_above_boundary", replaySafe},
		{"refused: GOAWAY PROTOCOL_ERROR marks the route misconfigured", with(sent(5), func(e *Evidence) {
			e.GoAway = &GoAway{LastStreamID: 1, Code: CodeProtocolError}
		}), Refused, "goaway_PROTOCOL_ERROR", misconfigured},
		{"refused: GOAWAY INADEQUATE_SECURITY marks the route misconfigured", with(sent(5), func(e *Evidence) {
			e.GoAway = &GoAway{LastStreamID: 1, Code: CodeInadequateSecurity}
		}), Refused, "goaway_INADEQUATE_SECURITY", misconfigured},
		{"refused: GOAWAY HTTP_1_1_REQUIRED marks the route misconfigured", with(sent(5), func(e *Evidence) {
			e.GoAway = &GoAway{LastStreamID: 1, Code: CodeHTTP11Required}
		}), Refused, "goaway_HTTP_1_1_REQUIRED", misconfigured},
		{"refused: GOAWAY with an unknown code marks the route misconfigured", with(sent(5), func(e *Evidence) { e.GoAway = &GoAway{LastStreamID: 1, Code: 0x77} }), Refused, "goaway_UNKNOWN", misconfigured},

		{"misdirected: 421", with(sent(1), func(e *Evidence) { e.Status = 421 }), Misdirected, "421", func(t *testing.T, c Classification) {
			replaySafe(t, c)
			if !c.FreshConnection || c.ProviderHealth {
				t.Errorf("421: want fresh connection and no health impact, got %+v", c)
			}
		}},
		{"misdirected_repeated: 421 then 421 again", with(sent(1), func(e *Evidence) { e.Status = 421; e.AfterMisdirected = true }), MisdirectedRepeated, "second_421", nil},

		{"throttled: 429 with Retry-After", with(sent(1), func(e *Evidence) { e.Status = 429; e.RetryAfter = 2 * time.Second }), Throttled, "status_429", func(t *testing.T, c Classification) {
			if c.RetryAfter != 2*time.Second {
				t.Errorf("RetryAfter = %v, want 2s", c.RetryAfter)
			}
		}},
		{"throttled: 503", with(sent(1), func(e *Evidence) { e.Status = 503 }), Throttled, "status_503", nil},
		{"throttled: 529", with(sent(1), func(e *Evidence) { e.Status = 529 }), Throttled, "status_529", nil},
		{"throttled: provider says overloaded", with(sent(1), func(e *Evidence) { e.Status = 400; e.Signal = SignalOverloaded }), Throttled, "overloaded", nil},
		{"throttled: GOAWAY ENHANCE_YOUR_CALM above the boundary", with(sent(7), func(e *Evidence) {
			e.GoAway = &GoAway{LastStreamID: 5, Code: CodeEnhanceYourCalm}
		}), Throttled, "goaway_enhance_your_calm", func(t *testing.T, c Classification) {
			if !c.FreshConnection {
				t.Errorf("want a fresh connection, got %+v", c)
			}
		}},

		{"upstream_error: 500 before content", with(sent(1), func(e *Evidence) { e.Status = 500 }), UpstreamError, "status_500", health},
		{"upstream_error: 502 before content", with(sent(1), func(e *Evidence) { e.Status = 502 }), UpstreamError, "status_502", health},
		{"ambiguous: 502 from an intermediary, not in the provider's error shape", with(sent(1), func(e *Evidence) { e.Status = 502; e.Intermediary = true }), Ambiguous, "502_from_intermediary", func(t *testing.T, c Classification) {
			health(t, c)
		}},
		{"upstream_error: the provider's own 502 through an intermediary", with(sent(1), func(e *Evidence) { e.Status = 502; e.Intermediary = true; e.ProviderError = true }), UpstreamError, "status_502", health},
		{"upstream_error: 502 from an intermediary whose route honours idempotency keys", with(sent(1), func(e *Evidence) {
			e.Status = 502
			e.Intermediary = true
			e.HonoursIdempotencyKey = true
		}), UpstreamError, "status_502", health},
		{"upstream_error: 500 from an intermediary", with(sent(1), func(e *Evidence) { e.Status = 500; e.Intermediary = true }), UpstreamError, "status_500", health},
		{"throttled: 503 with Retry-After from an intermediary", with(sent(1), func(e *Evidence) { e.Status = 503; e.Intermediary = true; e.RetryAfter = time.Second }), Throttled, "status_503", nil},
		{"ambiguous: 504 from an intermediary whose route honours idempotency keys", with(sent(1), func(e *Evidence) {
			e.Status = 504
			e.Intermediary = true
			e.HonoursIdempotencyKey = true
		}), Ambiguous, "504_gateway_timeout", nil},

		{"empty_response: 2xx without usable content", with(ok200, func(e *Evidence) { e.Signal = SignalEmptyResponse }), EmptyResponse, "empty_response", func(t *testing.T, c Classification) {
			health(t, c)
		}},

		{"rejected: 400", with(sent(1), func(e *Evidence) { e.Status = 400 }), Rejected, "status_400", nil},
		{"rejected: 401", with(sent(1), func(e *Evidence) { e.Status = 401 }), Rejected, "status_401", nil},
		{"rejected: 403", with(sent(1), func(e *Evidence) { e.Status = 403 }), Rejected, "status_403", nil},
		{"rejected: 413", with(sent(1), func(e *Evidence) { e.Status = 413 }), Rejected, "status_413", nil},
		{"rejected: 422", with(sent(1), func(e *Evidence) { e.Status = 422 }), Rejected, "status_422", nil},

		{"incompatible_route: model gone", with(sent(1), func(e *Evidence) { e.Status = 404; e.Signal = SignalModelNotFound }), IncompatibleRoute, "model_not_found", nil},
		{"incompatible_route: context too long", with(sent(1), func(e *Evidence) { e.Status = 400; e.Signal = SignalContextTooLong }), IncompatibleRoute, "context_length_exceeded", nil},
		{"content_filtered is terminal and never falls back", with(sent(1), func(e *Evidence) { e.Status = 400; e.Signal = SignalContentFiltered }), ContentFiltered, "content_filtered", nil},

		{"committed_partial: stream cut after content started", with(ok200, func(e *Evidence) { e.BodyFailed = true }), CommittedPartial, "stream_failed_after_content", nil},
		{"committed_partial: clean end of a stream its framing says was cut", with(ok200, func(e *Evidence) { e.Signal = SignalStreamIncomplete }), CommittedPartial, "stream_failed_after_content", nil},
		{"committed_partial: idle timeout after content started", with(ok200, func(e *Evidence) { e.TimedOut = true; e.BodyFailed = true }), CommittedPartial, "stream_failed_after_content", nil},

		{"ambiguous: stream at the GOAWAY boundary", with(sent(5), func(e *Evidence) { e.GoAway = &GoAway{LastStreamID: 5} }), Ambiguous, "goaway_at_or_below_boundary", nil},
		{"ambiguous: stream below the GOAWAY boundary", with(sent(3), func(e *Evidence) { e.GoAway = &GoAway{LastStreamID: 5} }), Ambiguous, "goaway_at_or_below_boundary", nil},
		{"ambiguous: ENHANCE_YOUR_CALM at or below the boundary", with(sent(3), func(e *Evidence) {
			e.GoAway = &GoAway{LastStreamID: 5, Code: CodeEnhanceYourCalm}
		}), Ambiguous, "goaway_at_or_below_boundary", nil},
		{"ambiguous: connection closed with no GOAWAY", with(sent(1), func(e *Evidence) { e.ConnClosed = true }), Ambiguous, "connection_closed_without_goaway", nil},
		{"ambiguous: lost stream mapping", with(sent(1), func(e *Evidence) { e.MappingLost = true }), Ambiguous, "stream_mapping_lost", nil},
		{"ambiguous: lost mapping even when nothing looks sent", Evidence{ConnRef: "p-c1", MappingLost: true}, Ambiguous, "stream_mapping_lost", nil},
		{"ambiguous: 504", with(sent(1), func(e *Evidence) { e.Status = 504 }), Ambiguous, "504_gateway_timeout", nil},
		{"ambiguous: attempt timeout after the request was sent", with(sent(1), func(e *Evidence) { e.TimedOut = true }), Ambiguous, "timeout_after_send", nil},
		{"ambiguous: RST_STREAM other than REFUSED_STREAM", with(sent(1), func(e *Evidence) { e.RSTStream = code(CodeInternalError) }), Ambiguous, "rst_stream_INTERNAL_ERROR", nil},
		{"ambiguous: 200 headers then body failed before content", with(sent(1), func(e *Evidence) { e.Status = 200; e.BodyFailed = true }), Ambiguous, "body_failed_before_content", nil},

		{"canceled: scope ended", with(sent(1), func(e *Evidence) { e.Canceled = true }), Canceled, "scope_canceled", func(t *testing.T, c Classification) {
			if c.ProviderHealth {
				t.Error("a cancellation must never move provider health")
			}
		}},
		{"canceled beats a GOAWAY seen at the same time", with(sent(5), func(e *Evidence) { e.Canceled = true; e.GoAway = &GoAway{LastStreamID: 1} }), Canceled, "scope_canceled", nil},
		{"canceled mid-stream is still canceled, not partial", with(ok200, func(e *Evidence) { e.Canceled = true }), Canceled, "scope_canceled", nil},
	}
	runRows(t, tests)
}

// row is one contract row as evidence, the class and reason Classify must
// give it, and an optional check of the rest of the classification.
type row struct {
	name   string
	ev     Evidence
	class  Class
	reason string
	check  func(t *testing.T, c Classification)
}

func runRows(t *testing.T, rows []row) {
	t.Helper()
	for _, tt := range rows {
		t.Run(tt.name, func(t *testing.T) {
			c := Classify(tt.ev)
			if c.Class != tt.class || c.Reason != tt.reason {
				t.Fatalf("Classify = %s/%s, want %s/%s", c.Class, c.Reason, tt.class, tt.reason)
			}
			if tt.check != nil {
				tt.check(t, c)
			}
		})
	}
}

func replaySafe(t *testing.T, c Classification) {
	t.Helper()
	if !c.Class.ReplaySafe() || c.RouteMisconfigured {
		t.Errorf("want replay-safe on the same route, got %+v", c)
	}
}

func misconfigured(t *testing.T, c Classification) {
	t.Helper()
	if !c.RouteMisconfigured || !c.Class.ReplaySafe() {
		t.Errorf("want misconfigured route, replay-safe; got %+v", c)
	}
}

func health(t *testing.T, c Classification) {
	t.Helper()
	if !c.ProviderHealth {
		t.Errorf("want a provider-health signal, got %+v", c)
	}
}

// TestClassifyNeverPermitsReplayOfAnExecutedRequest checks an invariant
// over a grid of evidence: whatever the combination, a classification that
// says replay-safe never comes from evidence showing the server answered
// with content or might have processed the stream.
func TestClassifyNeverPermitsReplayOfAnExecutedRequest(t *testing.T) {
	for _, status := range []int{0, 200, 421, 429, 500, 503, 504} {
		for _, started := range []bool{false, true} {
			for _, goaway := range []*GoAway{nil, {LastStreamID: 3}, {LastStreamID: 5}, {LastStreamID: 9, Code: CodeEnhanceYourCalm}} {
				for _, closed := range []bool{false, true} {
					ev := Evidence{RequestSent: true, StreamID: 5, Status: status, ContentStarted: started && status == 200, GoAway: goaway, ConnClosed: closed, BodyFailed: closed && status != 0}
					c := Classify(ev)
					name := fmt.Sprintf("status=%d started=%v goaway=%v closed=%v → %s", status, started, goaway, closed, c.Class)
					if c.Class.ReplaySafe() && status == 0 && (goaway == nil || goaway.LastStreamID >= 5) {
						t.Errorf("%s: replay-safe without proof of non-processing", name)
					}
					if c.Class.ReplaySafe() && ev.ContentStarted {
						t.Errorf("%s: replay-safe after content started", name)
					}
				}
			}
		}
	}
}

// TestClassifyEdgeRows are the rows whose evidence only a layer above the
// engine knows (why the context ended, how the activity ended, a request
// that can never be sent) and the edge cases of docs/recovery.md. Each row
// is named after the defect it pins.
func TestClassifyEdgeRows(t *testing.T) {
	sent := Evidence{ConnRef: "p-c1", RequestSent: true, StreamID: 3}
	with := func(ev Evidence, f func(*Evidence)) Evidence { f(&ev); return ev }
	streaming := with(sent, func(e *Evidence) { e.Status = 200; e.ContentStarted = true })
	tests := []row{
		{"canceled: the action's scope ended", with(streaming, func(e *Evidence) { e.Canceled, e.Stop = true, StopScope }), Canceled, "scope_canceled", nil},
		{"committed_partial: worker shutdown mid-stream keeps the committed partial", with(streaming, func(e *Evidence) { e.Canceled, e.Stop = true, StopWorkerShutdown }), CommittedPartial, "worker_stopped_after_content", nil},
		{"committed_partial: activity paused mid-stream keeps the committed partial", with(streaming, func(e *Evidence) { e.Canceled, e.Stop = true, StopPaused }), CommittedPartial, "paused_after_content", nil},
		{"ambiguous: worker shutdown after the request left, before content", with(sent, func(e *Evidence) { e.Canceled, e.Stop = true, StopWorkerShutdown }), Ambiguous, "worker_stopped_mid_attempt", func(t *testing.T, c Classification) {
			if c.ProviderHealth {
				t.Error("a worker stopping is not the provider's doing: provider health must not move")
			}
		}},
		{"ambiguous: GOAWAY above the boundary after response HEADERS", with(sent, func(e *Evidence) {
			e.StreamID = 5
			e.ResponseHeaders = true
			e.GoAway = &GoAway{LastStreamID: 3}
		}), Ambiguous, "goaway_after_response_headers", nil},
		{"ambiguous: worker shutdown after 200 headers, before content", with(sent, func(e *Evidence) { e.Status = 200; e.Canceled, e.Stop = true, StopWorkerShutdown }), Ambiguous, "body_failed_before_content", nil},
		{"unsent: worker shutdown before the request left", Evidence{ConnRef: "p-c1", Canceled: true, Stop: StopWorkerShutdown}, Unsent, "worker_stopped_before_send", replaySafe},
		{"unsent: Temporal lost the attempt before its request left", Evidence{Canceled: true, Stop: StopTemporalLost}, Unsent, "temporal_lost_before_send", func(t *testing.T, c Classification) {
			replaySafe(t, c)
			if c.ProviderHealth {
				t.Error("a stop Temporal caused is not the provider's doing: provider health must not move")
			}
		}},
		{"ambiguous: Temporal lost the attempt as its HEADERS left (the cut raced the send)", with(sent, func(e *Evidence) { e.Canceled, e.Stop = true, StopTemporalLost }), Ambiguous, "temporal_lost_mid_attempt", func(t *testing.T, c Classification) {
			if c.ProviderHealth {
				t.Error("a stop Temporal caused is not the provider's doing: provider health must not move")
			}
		}},
		{"ambiguous: Temporal lost the attempt while the transport held its request", Evidence{ConnRef: "p-c1", MaybeSent: true, Canceled: true, Stop: StopTemporalLost}, Ambiguous, "temporal_lost_mid_attempt", nil},
		{"throttled: worker shutdown cannot hide a 429 already read", with(sent, func(e *Evidence) { e.Status = 429; e.Canceled, e.Stop = true, StopWorkerShutdown }), Throttled, "status_429", nil},

		{"unsent: ScheduleToStart timed out", Evidence{Activity: ActivityQueueTimeout}, Unsent, "no_worker_took_the_attempt", replaySafe},
		{"ambiguous: worker lost mid-attempt", Evidence{Activity: ActivityWorkerLost, ConnRef: "p-c1"}, Ambiguous, "worker_lost_mid_attempt", nil},
		{"committed_partial: automatic replay ignores the commit boundary (worker lost after content_started)", Evidence{Activity: ActivityWorkerLost, ConnRef: "p-c1", ContentStarted: true}, CommittedPartial, "worker_lost_after_content", nil},
		{"ambiguous: Temporal timed the attempt out", Evidence{Activity: ActivityTimedOut}, Ambiguous, "attempt_timeout", nil},
		{"committed_partial: Temporal timed the attempt out after content", Evidence{Activity: ActivityTimedOut, ContentStarted: true}, CommittedPartial, "attempt_timeout_after_content", nil},
		{"ambiguous: the activity failed without an outcome", Evidence{Activity: ActivityFailed}, Ambiguous, "activity_failed", nil},

		{"rejected: an idempotency key the client cannot encode", Evidence{Unsendable: UnsendableInvalid}, Rejected, "invalid_request", nil},
		{"incompatible_route: the route cannot express the request", Evidence{Unsendable: UnsendableRoute}, IncompatibleRoute, "route_cannot_express_request", nil},
		{"incompatible_route: the route is not configured on the worker", Evidence{Unsendable: UnsendableNoRoute}, IncompatibleRoute, "route_not_configured", nil},

		{"unsent: a fleet-wide limit had no room before the deadline", Evidence{Capacity: &Capacity{Wait: time.Millisecond, Limit: "tokens", NoRoom: true, In: 90 * time.Second}}, Unsent, "fleet_limit_tokens", func(t *testing.T, c Classification) {
			replaySafe(t, c)
			if c.ProviderHealth {
				t.Error("the fleet's own limit is not the provider's doing: provider health must not move")
			}
			if c.RetryAfter != 90*time.Second {
				t.Errorf("RetryAfter %v, want when the limit expects room", c.RetryAfter)
			}
		}},
		{"canceled: the scope ended while the attempt waited for room", Evidence{Canceled: true, Stop: StopScope, Capacity: &Capacity{Wait: time.Second, Limit: "requests"}}, Canceled, "scope_canceled", nil},
		{"unsent: the worker stopped while the attempt waited for room", Evidence{Canceled: true, Stop: StopWorkerShutdown, Capacity: &Capacity{Wait: time.Second, Limit: "requests"}}, Unsent, "worker_stopped_before_send", replaySafe},
		{"completed: an attempt that waited for room and was sent", with(streaming, func(e *Evidence) { e.Capacity = &Capacity{Wait: time.Second, Limit: "requests"} }), Completed, "response_complete", nil},

		{"ambiguous: response HEADERS (a 103) then REFUSED_STREAM", with(sent, func(e *Evidence) { e.ResponseHeaders = true; e.RSTStream = code(CodeRefusedStream) }), Ambiguous, "rst_refused_stream_after_response_headers", nil},
		{"ambiguous: TransportReplays counted but never used in Classify (a replay whose last stream was refused)", with(sent, func(e *Evidence) {
			e.TransportReplays = 1
			e.StreamID = 5
			e.GoAway = &GoAway{LastStreamID: 3}
		}), Ambiguous, "transport_replayed", nil},
		{"ambiguous: a transport replay whose last stream was throttled", with(sent, func(e *Evidence) { e.TransportReplays = 1; e.Status = 429 }), Ambiguous, "transport_replayed", nil},
		{"completed: a transport replay whose last stream completed", with(streaming, func(e *Evidence) { e.TransportReplays = 1 }), Completed, "response_complete", nil},
	}
	runRows(t, tests)
}

// TestClassifyHTTP1 walks the HTTP/1.1 rows (docs/recovery.md): with no
// last-stream id and no REFUSED_STREAM, only "no request byte written"
// proves non-processing; a protocol mismatch is a configuration error.
func TestClassifyHTTP1(t *testing.T) {
	h1 := func(f func(*Evidence)) Evidence {
		ev := Evidence{HTTPVersion: ProtoHTTP11, ConnRef: "p-c1", ConnFresh: true}
		f(&ev)
		return ev
	}
	written := func(e *Evidence) { e.RequestSent, e.RequestBytes = true, 180 }
	tests := []row{
		{"unsent: HTTP/1.1 dial or TLS failure", Evidence{HTTPVersion: ProtoHTTP11, DialFailed: true}, Unsent, "dial_failed", replaySafe},
		{"unsent: HTTP/1.1 no request byte written", h1(func(e *Evidence) { e.ConnClosed = true }), Unsent, "connection_unusable_before_request", replaySafe},
		{"unsent: HTTP/1.1 timer before any request byte", h1(func(e *Evidence) { e.TimedOut = true }), Unsent, "timeout_before_send", replaySafe},
		{"unsent: HTTP/1.1 reused connection, nothing written", h1(func(e *Evidence) { e.ConnFresh = false; e.ConnClosed = true }), Unsent, "connection_unusable_before_request", replaySafe},
		{"ambiguous: HTTP/1.1 request written, connection closed, no response", h1(func(e *Evidence) { written(e); e.ConnClosed = true }), Ambiguous, "http1_connection_closed_after_request", nil},
		{"ambiguous: HTTP/1.1 keep-alive race lost (reused connection closed after the request)", h1(func(e *Evidence) { written(e); e.ConnFresh = false; e.ConnClosed = true }), Ambiguous, "http1_reused_connection_closed_after_request", nil},
		{"ambiguous: HTTP/1.1 answer cut before its status line ended", h1(func(e *Evidence) { written(e); e.ResponseHeaders = true; e.ConnClosed = true }), Ambiguous, "http1_answer_cut_before_status", nil},
		{"ambiguous: HTTP/1.1 timer after the request was written", h1(func(e *Evidence) { written(e); e.TimedOut = true }), Ambiguous, "timeout_after_send", nil},
		{"completed: HTTP/1.1 response complete (Connection: close after it too)", h1(func(e *Evidence) { written(e); e.Status = 200; e.ContentStarted = true }), Completed, "response_complete", nil},
		{"ambiguous: HTTP/1.1 body cut before content", h1(func(e *Evidence) { written(e); e.Status = 200; e.BodyFailed = true }), Ambiguous, "body_failed_before_content", nil},
		{"committed_partial: HTTP/1.1 chunked body cut after content", h1(func(e *Evidence) { written(e); e.Status = 200; e.ContentStarted = true; e.BodyFailed = true }), CommittedPartial, "stream_failed_after_content", nil},
		{"throttled: HTTP/1.1 429", h1(func(e *Evidence) { written(e); e.Status = 429 }), Throttled, "status_429", nil},

		{"unsent: the HTTP/2 preface answered by HTTP/1.1 400", Evidence{HTTPVersion: ProtoHTTP2, ConnRef: "p-c1", RequestSent: true, StreamID: 1, ConnClosed: true, ProtocolMismatch: MismatchHTTP11}, Unsent, "server_speaks_http1.1_set_http_version", misconfiguredUnsent},
		{"unsent: an h2c server closed before any HTTP/2 byte", Evidence{HTTPVersion: ProtoHTTP2, ConnRef: "p-c1", RequestSent: true, StreamID: 1, ConnClosed: true, ProtocolMismatch: MismatchNotHTTP2}, Unsent, "server_does_not_speak_http2_set_http_version", misconfiguredUnsent},
		{"unsent: a protocol mismatch beats lost framing", Evidence{HTTPVersion: ProtoHTTP2, ConnRef: "p-c1", RequestSent: true, MappingLost: true, ProtocolMismatch: MismatchHTTP11}, Unsent, "server_speaks_http1.1_set_http_version", misconfiguredUnsent},
		{"unsent: ALPN chose HTTP/1.1 for a route that asked for HTTP/2", Evidence{DialFailed: true, ProtocolMismatch: MismatchHTTP11}, Unsent, "server_speaks_http1.1_set_http_version", misconfiguredUnsent},
		{"unsent: an HTTP/1.1 request answered by an HTTP/2 SETTINGS frame", h1(func(e *Evidence) {
			written(e)
			e.ResponseHeaders = true
			e.ProtocolMismatch = MismatchHTTP2
		}), Unsent, "server_speaks_only_http2_set_http_version", misconfiguredUnsent},
	}
	runRows(t, tests)
}

func misconfiguredUnsent(t *testing.T, c Classification) {
	t.Helper()
	if !c.Class.ReplaySafe() || !c.RouteMisconfigured || c.ProviderHealth {
		t.Errorf("a protocol mismatch is a configuration error: want route misconfigured, no health impact, no verdict; got %+v", c)
	}
}
