// Package evidence is the vocabulary every layer of durallm speaks
// (docs/contract.md sections 1 to 3): what one attempt's evidence is
// (Evidence, and the Facts only the layers above the engine know), the
// contract's classes (Class, Classification), Classify, the one place an
// attempt's class is decided, and the attempt's one "llm.attempt" event
// (LogAttempt).
//
// Facts travel down and one class travels up: the recovery engine records
// the wire's evidence, the activity adds why its context ended and what
// the body said, the workflow adds how an activity ended when it returned
// no outcome, and Classify, a pure function of the evidence, decides. No
// layer rewrites the class.
//
// It links the standard library only, so the deterministic workflow can
// speak it without linking the engine, and the engine without linking
// Temporal (TestTheLayers in the module's root).
package evidence
