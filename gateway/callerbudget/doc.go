// Package callerbudget keeps the gateway's caller budgets: what each
// caller of the tokens file spent in the current period of its spend
// limit, reserved before an action starts and settled when it ends
// (docs/contract.md section 6.5, docs/gateway.md "Caller budgets").
//
// A Store holds, per caller and period, what ended actions were charged
// (settled) and what running ones hold, and one hold per action. Reserve
// takes a request's part from what the limit leaves, or refuses it, in
// one step that no other gateway sharing the store can interleave with;
// Settle releases an action's hold and charges what it committed instead.
// Two stores keep the same rules (the same arithmetic, decide): Postgres,
// shared by every gateway that connects to the journal's database, and
// File, a local file for one gateway.
package callerbudget
