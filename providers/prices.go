package providers

import (
	"errors"
	"fmt"
	"math"
)

// Prices are what a route's model costs, per million tokens, in the one
// currency an operator writes every route's prices in (the providers'
// list prices are in US dollars). A route without prices has no cost:
// its usage is counted in tokens only.
type Prices struct {
	// Input is the price of a prompt token that was neither read from
	// nor written to the provider's prompt cache.
	Input float64 `json:"input"`
	// CachedInput is the price of a prompt token read from the cache
	// (Usage.CachedTokens). Zero is free; the routes file sets it to
	// Input when it names none.
	CachedInput float64 `json:"cached_input"`
	// CacheWriteInput is the price of a prompt token written to the cache
	// (Usage.CacheWriteTokens, Anthropic's cache_creation_input_tokens).
	// Zero is free; the routes file sets it to Input when it names none.
	CacheWriteInput float64 `json:"cache_write_input"`
	// Output is the price of a completion token (reasoning tokens
	// included: providers count them as completion tokens).
	Output float64 `json:"output"`
}

// MaxPrice is the highest price per million tokens Validate accepts: a
// larger one is a typo (a price per token written as per million, say),
// not a model.
const MaxPrice = 100_000

// perMillion is the unit prices are written in.
const perMillion = 1e6

// ErrInvalidPrices is wrapped by every PriceError.
var ErrInvalidPrices = errors.New("providers: invalid prices")

// PriceError is one bad price: Field is its name (input, cached_input,
// cache_write_input, output), Problem what is wrong with it. It never
// quotes the value.
type PriceError struct {
	Field, Problem string
}

func (e *PriceError) Error() string {
	return ErrInvalidPrices.Error() + ": " + e.Field + ": " + e.Problem
}

// Unwrap returns ErrInvalidPrices.
func (e *PriceError) Unwrap() error { return ErrInvalidPrices }

// Validate reports every price that is negative, not a finite number or
// above MaxPrice, each as a *PriceError, joined with errors.Join.
func (p Prices) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    float64
	}{{"input", p.Input}, {"cached_input", p.CachedInput}, {"cache_write_input", p.CacheWriteInput}, {"output", p.Output}} {
		switch {
		case math.IsNaN(f.v) || math.IsInf(f.v, 0):
			errs = append(errs, &PriceError{f.name, "not a finite number"})
		case f.v < 0:
			errs = append(errs, &PriceError{f.name, "negative"})
		case f.v > MaxPrice:
			errs = append(errs, &PriceError{f.name, fmt.Sprintf("above %d per million tokens", MaxPrice)})
		}
	}
	return errors.Join(errs...)
}

// Cost is what u costs at p: uncached prompt tokens at Input, cached
// ones at CachedInput, cache writes at CacheWriteInput, completion tokens
// at Output. A total larger than prompt plus completion (a total sent
// without its parts) is priced at the larger of Input and Output, so an
// incomplete usage never costs less than it may have. It is pure, so
// workflow code may call it.
//
// Each product is rounded on its own (the float64 conversions), so that
// no architecture fuses a multiply and an add (Go may, on arm64): a
// workflow replayed on another machine computes the same cost to the bit.
func (p Prices) Cost(u Usage) float64 {
	cached, written := max(0, u.CachedTokens), max(0, u.CacheWriteTokens)
	uncached := max(0, u.PromptTokens-cached-written)
	c := float64(float64(uncached)*p.Input) + float64(float64(cached)*p.CachedInput) +
		float64(float64(written)*p.CacheWriteInput) + float64(float64(max(0, u.CompletionTokens))*p.Output)
	if extra := u.TotalTokens - u.PromptTokens - u.CompletionTokens; extra > 0 {
		c += float64(float64(extra) * max(p.Input, p.Output))
	}
	return c / perMillion
}

// MaxInput is the highest price a prompt token can have at p, whether
// the cache serves it, stores it or neither: what a worst case charges
// for a prompt before its usage says which.
func (p Prices) MaxInput() float64 { return max(p.Input, p.CachedInput, p.CacheWriteInput) }

// WorstCost is the most prompt prompt tokens and output completion
// tokens can cost at p (rounded as Cost is, product by product).
func (p Prices) WorstCost(prompt, output int64) float64 {
	return (float64(float64(prompt)*p.MaxInput()) + float64(float64(output)*p.Output)) / perMillion
}
