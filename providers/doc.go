// Package providers is the provider-neutral envelope every attempt speaks,
// whatever the route: the OpenAI-shaped Request and Message, the Response
// with its usage and error object, the reasons a partial stream ended,
// and Capabilities, what a route offers and what an action needs (the
// request's own needs included, Request.Needs). It depends on nothing but
// the standard library, so an app that only starts actions links no
// provider SDK and no configuration parser.
//
// The other two ideas of the provider layer have packages of their own:
// routes, the worker-side route configuration (YAML and environment), and
// exchange, the dialect adapters that make one attempt over the recovery
// engine. docs/providers.md is the operator's view of all three.
package providers
