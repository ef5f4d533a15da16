package callerbudget

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/durallm/durallm/workflows"
)

// Limit is a caller's spend limit: Budget (tokens and/or cost, as an
// action's budget counts them) per Period.
type Limit struct {
	Budget workflows.Budget
	Period Period
}

// Problems lists what is wrong with l, each naming its field under field
// ("budget"): the budget's problems (workflows.Budget.Problems: negative,
// not finite, absurd, neither set) and a missing period.
func (l Limit) Problems(field string) []error {
	errs := l.Budget.Problems(field)
	if l.Period == (Period{}) {
		errs = append(errs, fmt.Errorf("%s.period: missing: want day, month or a duration such as 6h", field))
	}
	return errs
}

// Period is how a limit's spending is counted: in UTC calendar days, UTC
// calendar months, or fixed windows of a duration counted from the Unix
// epoch. The zero Period is none.
type Period struct {
	name  string // "day", "month", or "" for every
	every time.Duration
}

// The bounds a duration period must keep: a shorter one is a rate
// limit, which max_in_flight and the routes' limits are for; a longer
// one is a typo.
const (
	MinPeriod = time.Minute
	MaxPeriod = 366 * 24 * time.Hour
)

// Day and Month are the calendar periods, in UTC.
var (
	Day   = Period{name: "day"}
	Month = Period{name: "month"}
)

// Every is a period of fixed windows of d.
func Every(d time.Duration) Period { return Period{every: d} }

// ParsePeriod reads a period: "day", "month", or a Go duration between
// MinPeriod and MaxPeriod ("1h", "168h").
func ParsePeriod(s string) (Period, error) {
	switch s = strings.TrimSpace(s); s {
	case "day":
		return Day, nil
	case "month":
		return Month, nil
	case "":
		return Period{}, errors.New("empty: want day, month or a duration such as 6h")
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return Period{}, errors.New("want day, month or a duration such as 6h")
	case d < MinPeriod:
		return Period{}, fmt.Errorf("%s is below %s", d, MinPeriod)
	case d > MaxPeriod:
		return Period{}, fmt.Errorf("%s is above %s (366 days)", d, MaxPeriod)
	}
	return Every(d), nil
}

// String is the period as the tokens file writes it.
func (p Period) String() string {
	if p.name != "" {
		return p.name
	}
	return p.every.String()
}

// Of is the window of p that t falls in: its key in a store (the period
// and the window's start, so that a changed period counts afresh) and
// its end.
func (p Period) Of(t time.Time) (key string, end time.Time) {
	t = t.UTC()
	var start time.Time
	switch p.name {
	case "day":
		start = time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
		end = start.AddDate(0, 0, 1)
	case "month":
		start = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
		end = start.AddDate(0, 1, 0)
	default:
		start = t.Truncate(p.every)
		end = start.Add(p.every)
	}
	return p.String() + "@" + start.Format(time.RFC3339), end
}

// Account is one caller's spending in one period.
type Account struct {
	// Settled is what ended actions were charged: what they committed.
	Settled workflows.Spend `json:"settled"`
	// Held is what the holds of running actions hold.
	Held workflows.Spend `json:"held"`
}

// Committed is what is settled plus what is held.
func (a Account) Committed() workflows.Spend { return a.Settled.Add(a.Held) }

// Left is what b leaves after what is committed, per kind b bounds,
// never below zero; a kind b does not bound is left at zero.
func (a Account) Left(b workflows.Budget) workflows.Spend {
	l := workflows.Ledger{Limit: b, Settled: a.Committed()}
	return l.Left()
}

// Ask is a request's reservation, as the gateway asks for it.
type Ask struct {
	// ActionID is the action the hold is for: one hold per action.
	ActionID string
	// Caller and Period (a Period.Of key) name the account.
	Caller, Period string
	// Limit is the caller's budget for the period.
	Limit workflows.Budget
	// Least is one attempt's worst case (workflows.WorstCase): a kind
	// Limit bounds that has less left than it refuses the request.
	Least workflows.Spend
	// Want is the most to hold (several attempts' worst cases): what is
	// left is held when it is less.
	Want workflows.Spend
}

// Reservation is what Reserve did.
type Reservation struct {
	// OK: the request may start; Held is held for it.
	OK bool
	// Short names the limit a refused request did not fit:
	// workflows.WhyTokenBudget or workflows.WhyCostBudget.
	Short string
	// Held is what the hold holds, per kind Limit bounds (zero for a kind
	// it does not): the action's budget.
	Held workflows.Spend
	// Existing: the action held already (a request sent again with its
	// Idempotency-Key while its action runs); Held is that hold and
	// nothing more was taken.
	Existing bool
	// Account is the caller's account after the reservation.
	Account Account
}

// Hold is one action's reservation, not yet settled.
type Hold struct {
	ActionID string          `json:"action_id"`
	Caller   string          `json:"caller"`
	Period   string          `json:"period"`
	Spend    workflows.Spend `json:"spend"`
	Made     time.Time       `json:"made"`
}

// decide is the reservation both stores make, on the account a as it
// stands: per kind ask.Limit bounds, refused when less than ask.Least is
// left (or nothing is); else what is left, up to ask.Want, is held.
func decide(a Account, ask Ask) Reservation {
	left := a.Left(ask.Limit)
	var held workflows.Spend
	if ask.Limit.Tokens > 0 {
		if left.Tokens <= 0 || left.Tokens < ask.Least.Tokens {
			return Reservation{Short: workflows.WhyTokenBudget, Account: a}
		}
		held.Tokens = min(left.Tokens, max(ask.Want.Tokens, ask.Least.Tokens))
	}
	if ask.Limit.Cost > 0 {
		if left.Cost <= 0 || left.Cost < ask.Least.Cost {
			return Reservation{Short: workflows.WhyCostBudget, Account: a}
		}
		held.Cost = math.Min(left.Cost, math.Max(ask.Want.Cost, ask.Least.Cost))
	}
	a.Held = a.Held.Add(held)
	return Reservation{OK: true, Held: held, Account: a}
}

// settle is the account a once hold h is released and charged instead,
// never below zero (the float sums of cost may round).
func settle(a Account, h, charged workflows.Spend) Account {
	a.Held = a.Held.Sub(h)
	a.Held.Tokens, a.Held.Cost = max(0, a.Held.Tokens), math.Max(0, a.Held.Cost)
	a.Settled = a.Settled.Add(charged)
	return a
}

// Store keeps the callers' accounts and holds. Implementations are safe
// for concurrent use.
type Store interface {
	// Reserve holds ask's part for its action, or refuses it, as decide
	// says, atomically against every other user of the store. When the
	// action holds already, it returns that hold (Existing) and takes
	// nothing more.
	Reserve(ctx context.Context, ask Ask) (Reservation, error)
	// Settle releases the action's hold and charges charged instead to
	// the hold's account. It reports the hold it settled; ok is false
	// when the action holds nothing (settled already, or never held), and
	// then it changes nothing: settling twice charges once.
	Settle(ctx context.Context, actionID string, charged workflows.Spend) (h Hold, ok bool, err error)
	// Account is a caller's account in a period (zero when it has none).
	Account(ctx context.Context, caller, period string) (Account, error)
	// Holds lists up to limit holds made before madeBefore, oldest first:
	// the ones a gateway looks at to settle what a gateway that stopped
	// left held.
	Holds(ctx context.Context, madeBefore time.Time, limit int) ([]Hold, error)
	// Close releases the store.
	Close() error
}
