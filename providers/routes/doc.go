// Package routes is the worker-side route configuration: a Route names an
// endpoint, a model, where its key lives, what it can do and how long to
// wait for it; a Config is the routes a worker serves, read from a routes
// YAML file by LoadConfig and overridden by DURALLM_ROUTE_<NAME>_*
// variables. Its one reference, every key with its default, the
// environment overrides and the capabilities fallback uses, is
// docs/providers.md ("A routes file" and "Every key"). Unknown keys are
// errors, so a misspelt timeout cannot pass silently; Config.Validate
// reports every problem at once, each naming the route and the field.
// Keys are read when a request is made (Route.APIKey), so a rotated key
// needs no restart, and no key ever enters a Config.
package routes
