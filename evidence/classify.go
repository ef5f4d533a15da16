package evidence

import "strconv"

// Classify turns one attempt's evidence into the contract's classification
// (docs/contract.md section 3). It is a pure function of the evidence: it never
// looks at an error's type, label or message, so a transport failure wrapped
// by an SDK, or a GOAWAY wearing a gRPC status, classifies the same as the
// bare event.
//
// It is the one place a class is decided (docs/contract.md section 1.2). Facts
// only a higher layer knows (why the context ended, how the activity
// ended, a request that can never be sent) arrive as Evidence fields, and
// no layer rewrites the result.
//
// The order of the checks is the contract's precedence: a canceled scope
// first (a cancellation is never a provider failure), then how the
// activity ended when it returned nothing, then a request refused before
// sending, then anything the response itself proves, then what the frames
// prove about a request that got no response, and, when nothing proves the
// request unprocessed, ambiguous. A transport replay overrides all but a
// completed last stream: an earlier stream may have been processed.
func Classify(ev Evidence) Classification {
	c := classify(ev)
	if ev.TransportReplays > 0 && c.Class != Completed && c.Class != CommittedPartial && c.Class != Canceled {
		// A lower layer sent the request again: whatever the last stream
		// says, an earlier one may have been processed.
		return ambiguous("transport_replayed", c.ProviderHealth)
	}
	return c
}

func classify(ev Evidence) Classification {
	switch {
	case ev.Canceled && (ev.Stop == StopScope || ev.Stop == ""):
		return Classification{Class: Canceled, Reason: "scope_canceled"}
	case ev.Activity != "":
		return classifyActivityEnd(ev)
	case ev.Capacity != nil && ev.Capacity.NoRoom && !ev.RequestSent && !ev.MaybeSent:
		// The fleet's own limit, not the provider: never health.
		return Classification{Class: Unsent, Reason: "fleet_limit_" + ev.Capacity.Limit, RetryAfter: ev.Capacity.In}
	case ev.Unsendable != "" && !ev.RequestSent && !ev.MaybeSent:
		return classifyUnsendable(ev.Unsendable)
	case ev.Canceled:
		// The worker is stopping, the activity was paused, or Temporal
		// lost track of it before it was sent: the action goes on, so
		// what the attempt had done decides, as for a timer that ended it.
		ev.TimedOut = true
		if ev.ContentStarted {
			return Classification{Class: CommittedPartial, Reason: stopReason(ev.Stop, "after_content")}
		}
		c := classifyEnded(ev)
		// The worker, an operator or Temporal ended it, not the provider.
		c.ProviderHealth = false
		switch c.Reason {
		case "timeout_before_send":
			c.Reason = stopReason(ev.Stop, "before_send")
		case "timeout_after_send", "context_ended_while_sending":
			c.Reason = stopReason(ev.Stop, "mid_attempt")
		}
		return c
	default:
		return classifyEnded(ev)
	}
}

func classifyEnded(ev Evidence) Classification {
	if ev.Status != 0 {
		return classifyResponse(ev)
	}
	return classifyNoResponse(ev)
}

// stopReason names a stop the action did not ask for:
// "worker_stopped_after_content", "paused_mid_attempt",
// "temporal_lost_before_send", ...
func stopReason(s StopCause, what string) string {
	switch s {
	case StopPaused:
		return "paused_" + what
	case StopTemporalLost:
		return "temporal_lost_" + what
	}
	return "worker_stopped_" + what
}

// classifyActivityEnd classifies an attempt whose activity returned no
// outcome, from what the workflow saw of it. The last heartbeat can prove
// that content started (the attempt committed); it can never prove that
// the request was not sent.
func classifyActivityEnd(ev Evidence) Classification {
	switch ev.Activity {
	case ActivityQueueTimeout:
		return Classification{Class: Unsent, Reason: "no_worker_took_the_attempt"}
	case ActivityWorkerLost:
		if ev.ContentStarted {
			return Classification{Class: CommittedPartial, Reason: "worker_lost_after_content"}
		}
		return ambiguous("worker_lost_mid_attempt", false)
	case ActivityTimedOut:
		if ev.ContentStarted {
			return Classification{Class: CommittedPartial, Reason: "attempt_timeout_after_content"}
		}
		return ambiguous("attempt_timeout", false)
	default:
		if ev.ContentStarted {
			return Classification{Class: CommittedPartial, Reason: "activity_failed_after_content"}
		}
		return ambiguous("activity_failed", false)
	}
}

func classifyUnsendable(u Unsendable) Classification {
	if u == UnsendableInvalid {
		return Classification{Class: Rejected, Reason: string(u)}
	}
	return Classification{Class: IncompatibleRoute, Reason: string(u)}
}

func classifyResponse(ev Evidence) Classification {
	s := ev.Status
	is2xx := s >= 200 && s < 300
	switch {
	case is2xx && ev.ContentStarted && (ev.BodyFailed || ev.TimedOut || ev.Signal == SignalStreamIncomplete):
		return Classification{Class: CommittedPartial, Reason: "stream_failed_after_content"}
	case ev.Signal == SignalContentFiltered:
		return Classification{Class: ContentFiltered, Reason: "content_filtered"}
	case s == 421 && ev.AfterMisdirected:
		return Classification{Class: MisdirectedRepeated, Reason: "second_421"}
	case s == 421:
		return Classification{Class: Misdirected, Reason: "421", FreshConnection: true}
	case s == 429 || s == 503 || s == 529:
		return throttled(ev, "status_"+strconv.Itoa(s))
	case ev.Signal == SignalOverloaded:
		return throttled(ev, "overloaded")
	case s == 504:
		return ambiguous("504_gateway_timeout", true)
	case s == 502 && ev.Intermediary && !ev.ProviderError && !ev.HonoursIdempotencyKey:
		// A proxy's own 502 speaks for the proxy: it may have forwarded
		// the request and lost the answer (Caddy answers one when a reload
		// cuts a request in flight). Only the provider's own error object,
		// or a key the provider deduplicates, makes another attempt safe.
		return ambiguous("502_from_intermediary", true)
	case s >= 500:
		return Classification{Class: UpstreamError, Reason: "status_" + strconv.Itoa(s), ProviderHealth: true}
	case ev.Signal == SignalModelNotFound || ev.Signal == SignalContextTooLong:
		return Classification{Class: IncompatibleRoute, Reason: string(ev.Signal)}
	case s >= 400:
		return Classification{Class: Rejected, Reason: "status_" + strconv.Itoa(s)}
	case !is2xx:
		// 1xx and 3xx are never final answers from an LLM API.
		return Classification{Class: Rejected, Reason: "unexpected_status_" + strconv.Itoa(s)}
	case ev.BodyFailed || ev.TimedOut || ev.Signal == SignalStreamIncomplete:
		// Headers said 200 and then the body died before any content: the
		// provider ran the request, and its answer is lost.
		return ambiguous("body_failed_before_content", true)
	case ev.Signal == SignalEmptyResponse:
		// Executed and unusable: another route may do better; the same
		// route would most likely answer the same.
		return Classification{Class: EmptyResponse, Reason: "empty_response", ProviderHealth: true}
	default:
		return Classification{Class: Completed, Reason: "response_complete"}
	}
}

func classifyNoResponse(ev Evidence) Classification {
	if ev.ProtocolMismatch != "" {
		// The server does not speak the protocol tried, so it cannot have
		// read the request as one (an HTTP/1.1 server answered the
		// HTTP/2 preface, an h2c server the HTTP/1.1 request line): a
		// configuration error, never an ambiguity. The reason names the
		// fix; the same route would fail the same way, so only a fallback
		// may follow.
		return Classification{Class: Unsent, Reason: mismatchReason(ev.ProtocolMismatch), FreshConnection: ev.ConnRef != "", RouteMisconfigured: true}
	}
	if ev.HTTPVersion == ProtoHTTP11 {
		return classifyHTTP1NoResponse(ev)
	}
	switch {
	case ev.MappingLost:
		return ambiguous("stream_mapping_lost", false)
	case ev.DialFailed:
		return unsentDialFailed
	case !ev.RequestSent && !ev.MaybeSent:
		if ev.TimedOut {
			return unsentTimedOut
		}
		return Classification{Class: Unsent, Reason: "connection_unusable_before_headers", FreshConnection: ev.ConnRef != ""}
	case !ev.RequestSent:
		// MaybeSent: the context ended while the transport held the
		// request and nothing proves its HEADERS did not leave. With no
		// stream id, no frame fact applies.
		return ambiguous("context_ended_while_sending", true)
	case ev.RSTStream != nil && *ev.RSTStream == CodeRefusedStream && ev.ResponseHeaders:
		// The server sent response HEADERS (a 1xx) on the stream: it acted
		// on it, so its REFUSED_STREAM no longer proves non-processing.
		return ambiguous("rst_refused_stream_after_response_headers", true)
	case ev.RSTStream != nil && *ev.RSTStream == CodeRefusedStream && ev.Intermediary:
		// A proxy's REFUSED_STREAM speaks for the proxy, and haproxy sends
		// it when the origin failed after the request was forwarded to it.
		return ambiguous("rst_refused_stream_via_intermediary", true)
	case ev.RSTStream != nil && *ev.RSTStream == CodeRefusedStream:
		return Classification{Class: Refused, Reason: "rst_refused_stream", FreshConnection: true}
	case ev.GoAway != nil && ev.StreamID > ev.GoAway.LastStreamID && !ev.ResponseHeaders:
		return classifyGoAwayRefusal(ev)
	case ev.GoAway != nil && ev.StreamID > ev.GoAway.LastStreamID:
		// Above the boundary, but the server had sent response HEADERS
		// on the stream: it acted on it.
		return ambiguous("goaway_after_response_headers", true)
	case ev.GoAway != nil:
		return ambiguous("goaway_at_or_below_boundary", true)
	case ev.RSTStream != nil:
		return ambiguous("rst_stream_"+ev.RSTStream.Label(), true)
	case ev.ConnClosed:
		return ambiguous("connection_closed_without_goaway", true)
	case ev.TimedOut:
		return ambiguous("timeout_after_send", true)
	default:
		return ambiguous("no_response", true)
	}
}

// The unsent rows HTTP/2 and HTTP/1.1 share.
var (
	unsentDialFailed = Classification{Class: Unsent, Reason: "dial_failed", ProviderHealth: true}
	unsentTimedOut   = Classification{Class: Unsent, Reason: "timeout_before_send"}
)

// mismatchReason names what the server speaks, and so the fix: set the
// route's http_version to it.
func mismatchReason(speaks string) string {
	switch speaks {
	case MismatchHTTP11:
		return "server_speaks_http1.1_set_http_version"
	case MismatchHTTP2:
		return "server_speaks_only_http2_set_http_version"
	default:
		return "server_does_not_speak_http2_set_http_version"
	}
}

// classifyHTTP1NoResponse classifies an HTTP/1.1 attempt that got no
// response. HTTP/1.1 has no last-stream id and no REFUSED_STREAM: the only
// proof of non-processing is that no request byte was written, which the
// engine counts exactly.
func classifyHTTP1NoResponse(ev Evidence) Classification {
	switch {
	case ev.DialFailed:
		return unsentDialFailed
	case !ev.RequestSent && ev.TimedOut:
		return unsentTimedOut
	case !ev.RequestSent:
		return Classification{Class: Unsent, Reason: "connection_unusable_before_request", FreshConnection: ev.ConnRef != ""}
	case ev.ResponseHeaders:
		// Some answer came but not a readable status line and headers.
		return ambiguous("http1_answer_cut_before_status", true)
	case ev.ConnClosed && !ev.ConnFresh:
		// The keep-alive race: a reused connection the server closed as
		// the request reached it, or after it read it. No byte of answer
		// says which.
		return ambiguous("http1_reused_connection_closed_after_request", true)
	case ev.ConnClosed:
		return ambiguous("http1_connection_closed_after_request", true)
	case ev.TimedOut:
		return ambiguous("timeout_after_send", true)
	default:
		return ambiguous("no_response", true)
	}
}

// classifyGoAwayRefusal reads the GOAWAY error code from the frame: the
// stream was provably not processed, and the code says how to go on.
func classifyGoAwayRefusal(ev Evidence) Classification {
	switch code := ev.GoAway.Code; code {
	case CodeNoError:
		return Classification{Class: Refused, Reason: "goaway_above_boundary", FreshConnection: true}
	case CodeEnhanceYourCalm:
		c := throttled(ev, "goaway_enhance_your_calm")
		c.FreshConnection = true
		return c
	default:
		// Reconnecting identically will fail identically; the request was
		// not processed, so it may still fall back.
		return Classification{Class: Refused, Reason: "goaway_" + code.Label(), FreshConnection: true, RouteMisconfigured: true, ProviderHealth: true}
	}
}

func throttled(ev Evidence, reason string) Classification {
	return Classification{Class: Throttled, Reason: reason, ProviderHealth: true, RetryAfter: ev.RetryAfter}
}

func ambiguous(reason string, health bool) Classification {
	return Classification{Class: Ambiguous, Reason: reason, ProviderHealth: health}
}
