// Package journalsweep holds the integration tests of the retention of
// the attempt journal and the result store (journal.Sweeper and
// resultstore.Sweeper with worker.TemporalActions) against a real
// embedded Temporal server and a real PostgreSQL server. It has no code
// of its own.
package journalsweep
