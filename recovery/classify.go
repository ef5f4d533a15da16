package recovery

import "strconv"

// Classify turns one attempt's evidence into the contract's classification
// (CONTRACT.md section 3). It is a pure function of the evidence: it never
// looks at an error's type, label or message, so a transport failure wrapped
// by an SDK, or a GOAWAY wearing a gRPC status, classifies the same as the
// bare event.
//
// The order of the checks is the contract's precedence: a canceled scope
// first (a cancellation is never a provider failure), then anything the
// response itself proves, then what the frames prove about a request that
// got no response, and, when nothing proves the request unprocessed,
// ambiguous.
func Classify(ev Evidence) Classification {
	switch {
	case ev.Canceled:
		return Classification{Class: Canceled, Reason: "scope_canceled", Terminal: true}
	case ev.Status != 0:
		return classifyResponse(ev)
	default:
		return classifyNoResponse(ev)
	}
}

func classifyResponse(ev Evidence) Classification {
	s := ev.Status
	is2xx := s >= 200 && s < 300
	switch {
	case is2xx && ev.ContentStarted && (ev.BodyFailed || ev.TimedOut || ev.Signal == SignalStreamIncomplete):
		return Classification{Class: CommittedPartial, Reason: "stream_failed_after_content", Terminal: true}
	case ev.Signal == SignalContentFiltered:
		return Classification{Class: ContentFiltered, Reason: "content_filtered", Terminal: true}
	case s == 421 && ev.AfterMisdirected:
		return Classification{Class: MisdirectedRepeated, Reason: "421_on_fresh_connection", Terminal: true}
	case s == 421:
		return Classification{Class: Misdirected, Reason: "421", ReplaySafe: true, SameRoute: true, FreshConnection: true}
	case s == 429 || s == 503 || s == 529:
		return throttled(ev, "status_"+strconv.Itoa(s))
	case ev.Signal == SignalOverloaded:
		return throttled(ev, "overloaded")
	case s == 504:
		return ambiguous("504_gateway_timeout", true)
	case s >= 500:
		return Classification{Class: UpstreamError, Reason: "status_" + strconv.Itoa(s), SameRoute: true, Fallback: true, ProviderHealth: true}
	case ev.Signal == SignalModelNotFound || ev.Signal == SignalContextTooLong:
		return Classification{Class: IncompatibleRoute, Reason: string(ev.Signal), Fallback: true}
	case s >= 400:
		return Classification{Class: Rejected, Reason: "status_" + strconv.Itoa(s), Terminal: true}
	case !is2xx:
		// 1xx and 3xx are never final answers from an LLM API.
		return Classification{Class: Rejected, Reason: "unexpected_status_" + strconv.Itoa(s), Terminal: true}
	case ev.BodyFailed || ev.TimedOut || ev.Signal == SignalStreamIncomplete:
		// Headers said 200 and then the body died before any content: the
		// provider ran the request, and its answer is lost.
		return ambiguous("body_failed_before_content", true)
	case ev.Signal == SignalEmptyResponse:
		return Classification{Class: EmptyResponse, Reason: "empty_response", Fallback: true, SameRoute: true, ProviderHealth: true}
	default:
		return Classification{Class: Completed, Reason: "response_complete", Terminal: true}
	}
}

func classifyNoResponse(ev Evidence) Classification {
	switch {
	case ev.MappingLost:
		return ambiguous("stream_mapping_lost", false)
	case ev.DialFailed:
		return Classification{Class: Unsent, Reason: "dial_failed", ReplaySafe: true, SameRoute: true, Fallback: true, ProviderHealth: true}
	case !ev.RequestSent && !ev.MaybeSent:
		if ev.TimedOut {
			return Classification{Class: Unsent, Reason: "timeout_before_send", ReplaySafe: true, SameRoute: true, Fallback: true}
		}
		return Classification{Class: Unsent, Reason: "connection_unusable_before_headers", ReplaySafe: true, SameRoute: true, Fallback: true, FreshConnection: ev.ConnRef != ""}
	case !ev.RequestSent:
		return ambiguous("context_ended_while_sending", true) // MaybeSent: no stream, so no frame fact applies
	case ev.RSTStream != nil && *ev.RSTStream == CodeRefusedStream && ev.Intermediary:
		// A proxy's REFUSED_STREAM speaks for the proxy, and haproxy sends
		// it when the origin failed after the request was forwarded to it.
		return ambiguous("rst_refused_stream_via_intermediary", true)
	case ev.RSTStream != nil && *ev.RSTStream == CodeRefusedStream:
		return Classification{Class: Refused, Reason: "rst_refused_stream", ReplaySafe: true, SameRoute: true, Fallback: true, FreshConnection: true}
	case ev.GoAway != nil && ev.StreamID > ev.GoAway.LastStreamID:
		return classifyGoAwayRefusal(ev)
	case ev.GoAway != nil:
		return ambiguous("goaway_at_or_below_boundary", true)
	case ev.RSTStream != nil:
		return ambiguous("rst_stream_"+ev.RSTStream.String(), true)
	case ev.ConnClosed:
		return ambiguous("connection_closed_without_goaway", true)
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
		return Classification{Class: Refused, Reason: "goaway_above_boundary", ReplaySafe: true, SameRoute: true, Fallback: true, FreshConnection: true}
	case CodeEnhanceYourCalm:
		c := throttled(ev, "goaway_enhance_your_calm")
		c.FreshConnection = true
		return c
	default:
		// Reconnecting identically will fail identically; the request was
		// not processed, so it may still fall back.
		return Classification{Class: Refused, Reason: "goaway_" + code.String(), ReplaySafe: true, Fallback: true, FreshConnection: true, RouteMisconfigured: true, ProviderHealth: true}
	}
}

func throttled(ev Evidence, reason string) Classification {
	return Classification{Class: Throttled, Reason: reason, ReplaySafe: true, SameRoute: true, Fallback: true, ProviderHealth: true, RetryAfter: ev.RetryAfter}
}

func ambiguous(reason string, health bool) Classification {
	return Classification{Class: Ambiguous, Reason: reason, NeedsReconciliation: true, ProviderHealth: health}
}
