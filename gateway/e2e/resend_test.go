package e2e_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.temporal.io/sdk/client"
	"golang.org/x/net/http2"

	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// slowTemporal is a Temporal client through a tcpProxy, its connection
// already made.
func (s *gwStack) slowTemporal() (client.Client, *tcpProxy) {
	s.t.Helper()
	p := newTCPProxy(s.t, s.ts.GetFrontendHostPort())
	tc, err := client.Dial(client.Options{HostPort: p.ln.Addr().String(), Namespace: s.ts.GetDefaultNamespace(), Logger: quietSDK{}})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(tc.Close)
	return tc, p
}

// quietSDK keeps the Temporal SDK's complaints about the held connection
// out of the test's output.
type quietSDK struct{}

func (quietSDK) Debug(string, ...any) {}
func (quietSDK) Info(string, ...any)  {}
func (quietSDK) Warn(string, ...any)  {}
func (quietSDK) Error(string, ...any) {}

// An ambiguous keyless request, sent by openai-go with its default
// retries, reaches the gateway once and the provider once: the answer
// (awaiting a verdict) is one no client resends by default.
func TestAnAmbiguousKeylessRequestRetriedByTheSDKRunsTheProviderOnce(t *testing.T) {
	s := newGateway(t)
	s.p.Push(providertest.GoAwayAfterProcessing(http2.ErrCodeNo))
	_, err := s.client(tokenA).Chat.Completions.New(testCtx(t), chatParams("demo", "x"))
	var ae *openai.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusForbidden || ae.Type != "durallm_awaiting_reconciliation" {
		t.Fatalf("error %v", err)
	}
	if n := s.requests.Load(); n != 1 {
		t.Fatalf("%d requests reached the gateway, want 1", n)
	}
	if n := s.executed(); n != 1 {
		t.Fatalf("the provider ran %d times", n)
	}
}

// A keyless start that Temporal accepted but did not confirm in time is
// answered as maybe started, which openai-go does not resend by default
// (one request reaches the gateway), and the action the gateway may have
// started is canceled once Temporal answers: nothing runs unseen.
func TestAKeylessStartThatMayHaveReachedTemporalIsNotResentAndIsCanceled(t *testing.T) {
	s := newGateway(t)
	s.p.SetDefault(providertest.Hold())
	tc, proxy := s.slowTemporal()
	var requests atomic.Int64
	base := s.beside(besideOptions{tc: tc, startTimeout: time.Second, requests: &requests})
	proxy.hold()
	var raw *http.Response
	_, err := s.clientAt(base+"/v1", tokenA).Chat.Completions.New(testCtx(t), chatParams("demo", "x"), option.WithResponseInto(&raw))
	var ae *openai.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusForbidden || ae.Type != "durallm_maybe_started" || ae.Response.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("error %v", err)
	}
	if n := requests.Load(); n != 1 {
		t.Fatalf("%d requests reached the gateway, want 1", n)
	}
	id := ae.Response.Header.Get("X-Durallm-Action-Id")
	proxy.release()
	res := s.result(id)
	if res.State != workflows.StateCanceled || res.Origin != workflows.OriginClientDisconnect {
		t.Fatalf("the action nobody was told of ended %s (%s)", res.State, res.Origin)
	}
	if n := s.executed(); n > 1 {
		t.Fatalf("the provider ran %d times", n)
	}
}

// A keyless caller that leaves while its action is starting has the
// action canceled once the start is known.
func TestAKeylessCallerThatLeavesDuringItsStartHasItsActionCanceled(t *testing.T) {
	s := newGateway(t)
	s.p.SetDefault(providertest.Hold())
	tc, proxy := s.slowTemporal()
	left := make(chan struct{})
	base := s.beside(besideOptions{tc: tc, startTimeout: 30 * time.Second, left: left})
	proxy.hold()
	ctx, leave := context.WithCancel(testCtx(t))
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Authorization", "Bearer "+tokenA)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	// The start reached Temporal (the worker runs it) while the gateway
	// still waits to hear so.
	if !eventually(func() bool { return len(s.p.Received()) == 1 }) {
		t.Fatal("the action never reached the provider")
	}
	id := s.p.Received()[0].IdempotencyKey
	leave()
	<-done
	<-left // the gateway saw its caller leave before Temporal answered
	proxy.release()
	res := s.result(id)
	if res.State != workflows.StateCanceled || res.Origin != workflows.OriginClientDisconnect {
		t.Fatalf("the departed caller's action ended %s (%s)", res.State, res.Origin)
	}
}
