// Package journalsweep holds the integration tests of the attempt
// journal's retention (journal.Sweeper with worker.TemporalActions)
// against a real embedded Temporal server and a real PostgreSQL server.
// It has no code of its own.
package journalsweep
