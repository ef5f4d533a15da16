// Package e2e holds the end-to-end tests and every whole-stack benchmark:
// the real LLMAction workflow and CallModel activity on a real Temporal
// server (temporaltest in memory, or the embedded devserver on SQLite, as
// `durallm dev` runs it) against the providertest provider over loopback.
// They live here, not beside the app-facing client in the root package, so
// that testing the client does not compile the server. The engine's own
// benchmarks are in recovery/, the journal's in activities/.
//
//	go test ./internal/e2e                                  # the tests
//	go test ./internal/e2e -run TestE2E -update-histories   # re-record the histories under testdata/ (workflows, internal/e2e, examples/agent)
//	go test ./internal/e2e -run TestE2ERealActionShapesOnAServer -update-shapes   # re-record testsuite/actiontest/testdata
//	go test -run '^$' -bench . ./internal/e2e               # the benchmarks (docs/performance.md)
package e2e
