// Package e2e holds the end-to-end tests and benchmarks: the real
// LLMAction workflow and CallModel activity on an embedded Temporal server
// (temporaltest) against the providertest HTTP/2 provider over loopback
// TLS. They live here, not beside the app-facing client in the root
// package, so that testing the client does not compile the server.
//
//	go test ./internal/e2e                              # the tests
//	go test -run TestE2E -update-histories ./internal/e2e  # re-record workflows/testdata
//	go test -run '^$' -bench . ./internal/e2e           # the benchmarks
package e2e
