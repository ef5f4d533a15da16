package exchange

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/durallm/durallm/evidence"
	"github.com/durallm/durallm/providers"
	"github.com/durallm/durallm/providers/routes"
	"github.com/durallm/durallm/recovery"
)

// The metadata keys a request on a route with a provider record carries
// (routes.ProviderRecordStoredCompletions), which the lookup lists by.
const (
	// MetadataAttemptID holds the attempt's id (X-Durallm-Attempt).
	MetadataAttemptID = "durallm_attempt_id"
	// MetadataActionID holds the action's id (its workflow id).
	MetadataActionID = "durallm_action_id"
)

// OpenAI's bounds on a request's metadata: at most 16 pairs, keys of at
// most 64 characters, values of at most 512.
const (
	metadataMaxPairs    = 16
	metadataMaxKeyLen   = 64
	metadataMaxValueLen = 512
)

// RecordIDs name an attempt in its provider's record.
type RecordIDs struct {
	// AttemptID is the attempt's id; required on a route with a
	// provider record.
	AttemptID string
	// ActionRef is the action's id.
	ActionRef string
}

// withProviderRecord is r as a route with stored completions sends it:
// "store": true, and the caller's metadata (kept) with the attempt's and
// the action's ids added. What cannot be sent that way is refused before
// anything is sent, wrapping ErrUnsupported, so the action may fall back
// to a route without a record: a caller's "store" other than true, a
// metadata member that is not an object of strings, one that already
// holds durallm's keys with other values, or one the ids would take past
// OpenAI's bounds. The errors name the member, never a value or a key.
func withProviderRecord(r providers.Request, ids RecordIDs) (providers.Request, error) {
	refuse := func(format string, a ...any) (providers.Request, error) {
		return r, fmt.Errorf("%w: provider_record: "+format, append([]any{ErrUnsupported}, a...)...)
	}
	if ids.AttemptID == "" {
		return refuse("the request names no attempt to record")
	}
	if raw, ok := r.Params["store"]; ok && string(raw) != "true" {
		return refuse(`params["store"]: the route stores every request (store: true); send the request on a route without provider_record`)
	}
	meta := map[string]string{}
	if raw, ok := r.Params["metadata"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &meta); err != nil {
			return refuse(`params["metadata"]: not an object of strings`)
		}
	}
	for k, v := range map[string]string{MetadataAttemptID: ids.AttemptID, MetadataActionID: ids.ActionRef} {
		if had, ok := meta[k]; ok && had != v {
			return refuse(`params["metadata"]: the key %s is durallm's own`, k)
		}
		meta[k] = v
	}
	if len(meta) > metadataMaxPairs {
		return refuse(`params["metadata"]: %d pairs with durallm's, the provider takes at most %d`, len(meta), metadataMaxPairs)
	}
	for k, v := range meta {
		switch {
		case utf8.RuneCountInString(k) > metadataMaxKeyLen:
			return refuse(`params["metadata"]: a key is longer than %d characters`, metadataMaxKeyLen)
		case utf8.RuneCountInString(v) > metadataMaxValueLen:
			return refuse(`params["metadata"]: a value (the action id, or one of the caller's) is longer than %d characters`, metadataMaxValueLen)
		}
	}
	b, err := json.Marshal(meta)
	if err != nil {
		return refuse(`params["metadata"]: %v`, err)
	}
	params := make(map[string]json.RawMessage, len(r.Params)+2)
	for k, v := range r.Params {
		params[k] = v
	}
	params["store"], params["metadata"] = json.RawMessage("true"), b
	r.Params = params
	return r, nil
}

// FindLimit is how many stored completions one lookup reads: the first,
// which settles the attempt, and enough more to count the duplicates.
const FindLimit = 4

// ErrLookupFailed is wrapped by FindStored's error when the provider
// answered the lookup with an error status.
var ErrLookupFailed = errors.New("exchange: the provider's record could not be listed")

// Found is what one lookup of a provider's record found.
type Found struct {
	// Completions are the stored completions that carry the attempt's
	// id, oldest first, at most FindLimit.
	Completions []StoredCompletion
	// More says the provider has more of them than FindLimit.
	More bool
	// Foreign counts listed completions that do not carry the attempt's
	// id (a provider that ignored the filter); they are left out.
	Foreign int
	// Signal is what the list's body said that the wire cannot: pass it
	// to the lookup's recovery.Attempt.Finish.
	Signal evidence.Signal
}

// StoredCompletion is one completion a provider kept.
type StoredCompletion struct {
	// Response is the stored answer, read as an answer is (Raw holds the
	// whole stored object).
	Response providers.Response
	// Usable says it is a usable answer (no signal against it: it has
	// content and is not still in progress).
	Usable bool
	// Created is when the provider says it created it; zero if unsaid.
	Created time.Time
}

// FindStored lists the stored chat completions that carry attemptID in
// their metadata (GET {base_url}/chat/completions?metadata[durallm_attempt_id]=…,
// oldest first), on a route whose ProviderRecord is stored_completions,
// with the route's own key. It is sent once, through rt, by the official
// client configured as for an attempt (no retries, no redirects, nothing
// from the environment); ctx should carry the lookup's own
// recovery.Attempt, which the caller finishes with Found.Signal and whose
// class says whether the lookup may be tried again. An error status
// returns an error wrapping ErrLookupFailed; a body past MaxResponseBytes
// or not a list returns Signal SignalEmptyResponse and an error. Errors
// never hold content or the key.
func FindStored(ctx context.Context, rt http.RoundTripper, route routes.Route, attemptID string) (Found, error) {
	wrap := func(err error) error { return fmt.Errorf("exchange: route %q: record lookup: %w", route.Name, err) }
	fail := func(err error) (Found, error) { return Found{}, wrap(err) }
	if route.ProviderRecord != routes.ProviderRecordStoredCompletions || (route.Kind != routes.KindOpenAI && route.Kind != "") {
		return fail(fmt.Errorf("%w: the route keeps no stored completions", ErrUnsupported))
	}
	if _, err := route.Endpoint("chat", "completions"); err != nil {
		return fail(err)
	}
	key, err := route.APIKey()
	if err != nil {
		return fail(err)
	}
	ctx = recovery.WithHTTPVersion(ctx, recovery.HTTPVersion(route.HTTPVersion))
	resp, err := viaClient(ctx, rt, route, key, func(opts ...option.RequestOption) error {
		opts = append(opts, option.WithHeader("Accept", "application/json"))
		svc := openai.NewChatCompletionService(opts...)
		_, err := svc.List(ctx, openai.ChatCompletionListParams{
			Metadata: shared.Metadata{MetadataAttemptID: attemptID},
			Limit:    openai.Int(FindLimit), Order: openai.ChatCompletionListParamsOrderAsc,
		})
		return err
	})
	if err != nil {
		return fail(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes+1))
	switch {
	case err != nil:
		return fail(fmt.Errorf("read body: %w", err))
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return fail(fmt.Errorf("%w: status %d", ErrLookupFailed, resp.StatusCode))
	case len(data) > MaxResponseBytes:
		return Found{Signal: evidence.SignalEmptyResponse}, wrap(fmt.Errorf("%w (limit %d bytes)", ErrResponseTooLarge, MaxResponseBytes))
	}
	f, err := parseStoredList(data, attemptID)
	if err != nil {
		return Found{Signal: evidence.SignalEmptyResponse}, wrap(err)
	}
	return f, nil
}

// parseStoredList reads a list of stored chat completions, keeping those
// whose metadata names attemptID, each read as an answer is.
func parseStoredList(data []byte, attemptID string) (Found, error) {
	var list struct {
		Data    []json.RawMessage `json:"data"`
		HasMore json.RawMessage   `json:"has_more"`
	}
	if err := json.Unmarshal(data, &list); err != nil || list.Data == nil {
		return Found{}, fmt.Errorf("%w: not a list of stored completions", ErrMalformedResponse)
	}
	var f Found
	f.More = string(list.HasMore) == "true"
	for _, raw := range list.Data {
		var item struct {
			Metadata map[string]json.RawMessage `json:"metadata"`
			Created  json.RawMessage            `json:"created"`
		}
		var id string
		if json.Unmarshal(raw, &item) != nil || json.Unmarshal(item.Metadata[MetadataAttemptID], &id) != nil || id != attemptID {
			f.Foreign++
			continue
		}
		r, sig, err := parseCompletion(raw)
		c := StoredCompletion{Response: r, Usable: err == nil && sig == evidence.SignalNone}
		if secs, err := strconv.ParseInt(string(item.Created), 10, 64); err == nil && secs > 0 {
			c.Created = time.Unix(secs, 0).UTC()
		}
		f.Completions = append(f.Completions, c)
	}
	return f, nil
}
