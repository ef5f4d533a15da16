// Package testsuite is what a user imports to test code built on durallm,
// in the manner of the Temporal SDK's own testsuite package. Its
// subpackages:
//
//   - providertest: a fault-injecting HTTP/2 and HTTP/1.1 provider over
//     real frames on loopback (GOAWAY with an exact last-stream id,
//     REFUSED_STREAM, 421, cut streams, ...), which records what it
//     executed.
package testsuite
