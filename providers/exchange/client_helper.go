package exchange

import (
	"context"
	"errors"
	"net/http"
	"net/url"
)

// What the adapters that send through an official client (openai-go,
// anthropic-sdk-go) share: the http.Client they give it and the
// middleware through which the provider's response comes back unread.

// clientHTTP is the http.Client an official client sends with: rt (the
// recovery engine) as its transport, and redirects not followed.
func clientHTTP(rt http.RoundTripper) *http.Client {
	return &http.Client{Transport: rt, CheckRedirect: noRedirects}
}

// noRedirects keeps a 3xx as the answer: following it would send the
// request a second time, to a URL the route does not name.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// answerTaker is the middleware an official client sends through. It
// passes the request on once, keeps the provider's response, and hands
// the client a copy with an empty body, so that every byte of the real
// one goes through the exchange (the timers, the commit boundary and the
// bounded, lenient parsers need each of them). Its take method has the
// signature of both clients' option.Middleware.
type answerTaker struct {
	// ctx, when set, is the context the request is sent with, in place of
	// the one the client derived from it: a timer of the client's own
	// must never end a body the exchange is still reading.
	ctx context.Context
	// url, when set, replaces the URL the client built.
	url *url.URL

	answered *http.Response
	sendErr  error
}

func (t *answerTaker) take(req *http.Request, next func(*http.Request) (*http.Response, error)) (*http.Response, error) {
	if t.ctx != nil || t.url != nil {
		ctx := req.Context()
		if t.ctx != nil {
			ctx = t.ctx
		}
		// A shallow copy: the client's own request is left as it was.
		req = req.WithContext(ctx)
		if t.url != nil {
			u := *t.url
			req.URL, req.Host = &u, ""
		}
	}
	resp, err := next(req)
	if resp == nil {
		// Kept because a client reports only ctx.Err() when the context
		// is done, and the transport's error (the engine's AttemptError)
		// says more.
		t.sendErr = err
		return resp, err
	}
	t.answered = resp
	empty := *resp
	empty.Body = http.NoBody
	return &empty, err
}

// outcome is the provider's response with its body unread when it
// answered, whatever the client made of the empty body it was given (an
// error status becomes the client's error value; the exchange reads the
// real body instead), or the transport's error. clientErr is what the
// client's call returned.
func (t *answerTaker) outcome(clientErr error) (*http.Response, error) {
	if t.answered != nil {
		return t.answered, nil
	}
	if t.sendErr != nil {
		return nil, t.sendErr
	}
	if clientErr == nil {
		// Unreachable: with no response a client reports an error.
		clientErr = errors.New("official client: no response and no error")
	}
	return nil, clientErr
}
