// Package testsuite is what a user imports to test code built on durallm,
// in the manner of the Temporal SDK's own testsuite package. Its
// subpackages:
//
//   - actiontest: scripted LLM actions in the SDK's TestWorkflowEnvironment,
//     so a unit test of a workflow that calls step.Call says what each call
//     does (completes with a text or by reference, is filtered, awaits a
//     verdict and then gets one from a person or the worker's reconciler,
//     is canceled before or after its commit), in virtual time, without a
//     worker or a model, and asserts what each call sent. What runs is the
//     real LLMAction with scripted attempts, so the results have exactly
//     the real shapes.
//   - runbook: the five recovery runbook cases (GOAWAY above and at the
//     boundary, 421, a bare close, REFUSED_STREAM) run through a path of
//     your own (a proxy between the worker and the provider), saying what
//     the path preserved and what it hid; durallm check-path runs it.
//   - providertest: a fault-injecting HTTP/2 and HTTP/1.1 provider over
//     real frames on loopback (GOAWAY with an exact last-stream id,
//     REFUSED_STREAM, 421, cut streams, ...), which records what it
//     executed.
package testsuite
