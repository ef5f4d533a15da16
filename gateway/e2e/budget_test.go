package e2e_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/durallm/durallm/gateway/callerbudget"
	"github.com/durallm/durallm/internal/pgserver"
	"github.com/durallm/durallm/testsuite/providertest"
	"github.com/durallm/durallm/workflows"
)

// The callers' budgets, shared by gateways through the journal's
// PostgreSQL (a real server, internal/pgserver): each gateway here has a
// ledger of its own, with its own connections, as a gateway process has.

// budgetDSN starts a PostgreSQL server for the test and returns a
// database on it.
func budgetDSN(t *testing.T) string {
	t.Helper()
	srv, err := pgserver.Start(context.Background(), pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	return srv.FreshDSN()
}

func openLedger(t *testing.T, dsn string) callerbudget.Store {
	t.Helper()
	l, err := callerbudget.OpenPostgres(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// cappedAccount is the capped caller's account today.
func cappedAccount(t *testing.T, l callerbudget.Store) callerbudget.Account {
	t.Helper()
	key, _ := callerbudget.Day.Of(time.Now())
	a, err := l.Account(context.Background(), "capped", key)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// settledAt waits until the capped caller's account holds nothing and
// has settled want tokens.
func settledAt(t *testing.T, l callerbudget.Store, want int64) {
	t.Helper()
	var a callerbudget.Account
	if !eventually(func() bool { a = cappedAccount(t, l); return a.Held == (workflows.Spend{}) && a.Settled.Tokens == want }) {
		t.Fatalf("the capped caller's account is %+v, want nothing held and %d tokens settled", a, want)
	}
}

// A request of 2000 output tokens has a worst case of a little more (its
// prompt's bound): under a budget of 3000 tokens a day one fits; once
// it spent 1980, none does.
const (
	cappedBudget = 3000
	bigRequest   = 2000
)

var spent1980 = providertest.Usage{PromptTokens: 80, CompletionTokens: 1900}

func bigChat() openai.ChatCompletionNewParams {
	p := chatParams("demo", "x")
	p.MaxCompletionTokens = openai.Int(bigRequest)
	return p
}

// overBudget checks openai-go's typed error: 429 insufficient_quota (type
// and code), which the SDK did not send again (x-should-retry: false).
func overBudget(t *testing.T, err error) {
	t.Helper()
	var ae *openai.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusTooManyRequests || ae.Type != "insufficient_quota" || ae.Code != "insufficient_quota" ||
		ae.Response.Header.Get("X-Should-Retry") != "false" || !strings.Contains(ae.Message, "your budget of 3000 tokens per day is spent") {
		t.Fatalf("error %v, want 429 insufficient_quota naming the caller's budget", err)
	}
}

// A caller over its budget gets 429 insufficient_quota from the official
// SDK on its defaults, and nothing reaches the provider; the limit holds
// on a second gateway sharing the database and on a gateway restarted.
// The Messages surface answers Anthropic's 402 billing_error.
func TestACallerOverItsBudgetIsRefusedBeforeAnythingStarts(t *testing.T) {
	dsn := budgetDSN(t)
	ledgerA := openLedger(t, dsn)
	s := newGateway(t, func(o *stackOptions) { o.spend = ledgerA; o.cappedTokens = cappedBudget })
	s.p.SetDefault(providertest.Answer("spent").WithUsage(spent1980))
	ctx := testCtx(t)

	if _, err := s.client(tokenCapped).Chat.Completions.New(ctx, bigChat()); err != nil {
		t.Fatalf("the first request, within the budget: %v", err)
	}
	settledAt(t, ledgerA, 1980)
	received := len(s.p.Received())

	before := s.requests.Load()
	_, err := s.client(tokenCapped).Chat.Completions.New(ctx, bigChat())
	overBudget(t, err)
	if n := s.requests.Load() - before; n != 1 {
		t.Fatalf("the SDK sent the refused request %d times, want once", n)
	}

	// A second gateway, with its own connections to the same database.
	b, stopB := s.besideStoppable(besideOptions{spend: openLedger(t, dsn)})
	_, err = s.clientAt(b+"/v1", tokenCapped).Chat.Completions.New(ctx, bigChat())
	overBudget(t, err)

	// The same gateway restarted: a new ledger on the same database.
	stopB()
	b2 := s.beside(besideOptions{spend: openLedger(t, dsn)})
	_, err = s.clientAt(b2+"/v1", tokenCapped).Chat.Completions.New(ctx, bigChat())
	overBudget(t, err)

	// Anthropic's Messages surface: 402 billing_error, which
	// anthropic-sdk-go does not send again.
	mp := messageParams("demo", "x")
	mp.MaxTokens = bigRequest
	_, err = claude(b2, tokenCapped).Messages.New(ctx, mp)
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusPaymentRequired || string(ae.Type()) != "billing_error" ||
		ae.Response.Header.Get("X-Should-Retry") != "false" || !strings.Contains(ae.Message, "your budget of 3000 tokens per day is spent") {
		t.Fatalf("Messages: error %v, want 402 billing_error naming the caller's budget", err)
	}

	if got := len(s.p.Received()); got != received {
		t.Fatalf("the provider received %d requests after the budget was spent, want none", got-received)
	}
	// Another caller is not limited by it.
	if _, err := s.client(tokenA).Chat.Completions.New(ctx, bigChat()); err != nil {
		t.Fatalf("a caller without a budget: %v", err)
	}
	if a := cappedAccount(t, ledgerA); a.Settled.Tokens != 1980 || a.Held != (workflows.Spend{}) {
		t.Fatalf("the refusals changed the account: %+v", a)
	}
}

// An action holds its worst case while it runs, so two requests at once
// cannot both spend the last of a budget: the second is refused while the
// first holds, on another gateway too.
func TestARunningRequestHoldsItsPartOfTheBudget(t *testing.T) {
	dsn := budgetDSN(t)
	s := newGateway(t, func(o *stackOptions) { o.spend = openLedger(t, dsn); o.cappedTokens = cappedBudget })
	gate := make(chan struct{})
	s.p.Push(providertest.Answer("slow").WithUsage(spent1980).WaitFor(gate))
	ctx := testCtx(t)
	first := make(chan error, 1)
	go func() {
		_, err := s.client(tokenCapped).Chat.Completions.New(ctx, bigChat())
		first <- err
	}()
	ledger := openLedger(t, dsn)
	if !eventually(func() bool { return cappedAccount(t, ledger).Held.Tokens > 0 }) {
		t.Fatal("the first request holds nothing")
	}
	b := s.beside(besideOptions{spend: ledger})
	_, err := s.clientAt(b+"/v1", tokenCapped).Chat.Completions.New(ctx, bigChat())
	overBudget(t, err)
	close(gate)
	if err := <-first; err != nil {
		t.Fatalf("the first request: %v", err)
	}
	settledAt(t, ledger, 1980)
}

// A gateway that stops while its caller's action runs leaves the hold in
// the ledger; once the action ended, another gateway's sweep settles it
// at what the action committed.
func TestAHoldLeftByAGatewayThatStoppedIsSettledByAnother(t *testing.T) {
	dsn := budgetDSN(t)
	s := newGateway(t, func(o *stackOptions) { o.cappedTokens = cappedBudget; o.spend = openLedger(t, dsn) })
	gate := make(chan struct{})
	s.p.Push(providertest.Answer("slow").WithUsage(spent1980).WaitFor(gate))
	ledger := openLedger(t, dsn)
	c, stopC := s.besideStoppable(besideOptions{spend: ledger})
	ctx, leave := context.WithCancel(testCtx(t))
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The caller leaves; its action goes on (on_disconnect continue).
		_, _ = s.clientAt(c+"/v1", tokenCapped).Chat.Completions.New(ctx, bigChat(), option.WithHeader("X-Durallm-On-Disconnect", "continue"))
	}()
	if !eventually(func() bool { return len(s.p.Received()) == 1 }) {
		t.Fatal("the request never reached the provider")
	}
	leave()
	<-done
	stopC()
	held := cappedAccount(t, ledger).Held.Tokens
	if held == 0 {
		t.Fatal("the stopped gateway's hold is gone before its action ended")
	}
	close(gate)
	// The gateway restarted, sweeping often.
	s.beside(besideOptions{spend: openLedger(t, dsn), spendSweep: 100 * time.Millisecond})
	settledAt(t, ledger, 1980)
}

// A keyed resend of an action that ended is its replay, which costs
// nothing more: it is served whatever the budget has left, not refused.
func TestAKeyedResendAfterTheBudgetIsSpentGetsItsReplay(t *testing.T) {
	dsn := budgetDSN(t)
	ledger := openLedger(t, dsn)
	s := newGateway(t, func(o *stackOptions) { o.spend = ledger; o.cappedTokens = cappedBudget })
	s.p.SetDefault(providertest.Answer("spent").WithUsage(spent1980))
	ctx := testCtx(t)
	key := option.WithHeader("Idempotency-Key", "spent-then-resent")
	first, err := s.client(tokenCapped).Chat.Completions.New(ctx, bigChat(), key)
	if err != nil {
		t.Fatalf("the first request, within the budget: %v", err)
	}
	settledAt(t, ledger, 1980)
	received := len(s.p.Received())
	again, err := s.client(tokenCapped).Chat.Completions.New(ctx, bigChat(), key)
	if err != nil {
		t.Fatalf("the keyed resend: %v", err)
	}
	if again.ID != first.ID || again.Choices[0].Message.Content != "spent" {
		t.Fatalf("the resend got %s %q, want the replay of %s", again.ID, again.Choices[0].Message.Content, first.ID)
	}
	if got := len(s.p.Received()); got != received {
		t.Fatalf("the provider received %d more requests", got-received)
	}
	// Another key is a new request, which the budget refuses.
	_, err = s.client(tokenCapped).Chat.Completions.New(ctx, bigChat(), option.WithHeader("Idempotency-Key", "another"))
	overBudget(t, err)
	if a := cappedAccount(t, ledger); a.Settled.Tokens != 1980 || a.Held != (workflows.Spend{}) {
		t.Fatalf("the replay changed the account: %+v", a)
	}
}
