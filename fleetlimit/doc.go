// Package fleetlimit keeps a route's provider limits (requests and tokens
// per minute, requests in flight at once) for every worker of a task
// queue together, so that an attempt waits for room before it is sent
// instead of collecting a 429 (docs/contract.md section 4.9).
//
// A Limiter is one process's side: it asks a Store for room, keeps a
// little of it on hand so an attempt with room waits for nothing but a
// mutex, and gives back what it did not use. The Store is what the
// fleet shares: Postgres (the database the attempt journal uses, one row
// per route changed by one statement per take) or Memory (one process
// only: a worker without a database enforces the limits for itself
// alone).
//
// Each limit is a bucket of a minute's worth, refilled continuously, as
// OpenAI's and Anthropic's own limiters work. A take that does not fit
// is still granted, with the wait until it fits, and the bucket goes into
// debt, so waiters are served in the order they asked and each knows its
// wait at once; a take whose wait is longer than the caller can wait is
// refused and takes nothing. A provider's 429 tightens the shared bucket
// for everyone: its Retry-After holds every take until it has passed,
// and its x-ratelimit-remaining-* (or anthropic-ratelimit-*-remaining)
// lowers the bucket to what the provider says is left.
package fleetlimit
