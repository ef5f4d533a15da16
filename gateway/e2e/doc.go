// Package e2e tests durallm's gateway end to end with the official
// openai-go client: the gateway on the embedded Temporal server
// (temporaltest), a worker in its process, and the providertest
// fault-injecting provider. They live apart from package gateway so that
// its table tests do not compile the server and run under -race.
//
//	go test ./gateway/e2e
package e2e
