// Package claimcheck keeps large Temporal payloads out of history: a data
// converter that stores every payload above a size (Options.Threshold,
// default 2 KiB) in a result store (resultstore.Dir, pgstore.Store) and
// leaves in history a reference naming the stored bytes' SHA-256. The
// pattern is Temporal's claim check. Reading a reference fetches the
// bytes and checks them against the digest.
//
// Every process that writes or reads the workflows' payloads dials its
// Temporal client with the converter, over the same store:
//
//	store := resultstore.Dir{Path: "/shared/durallm-results"}
//	tc, err := client.Dial(client.Options{DataConverter: claimcheck.DataConverter(store, claimcheck.Options{})})
//
// (durallm.DataConverter(store) is that line.) With it, a request, a
// conversation, a tool's result or an answer of any size up to the
// store's limit (resultstore.LimitOf, 32 MiB by default) travels as a
// reference of about 200 bytes: in the action's history, in every
// attempt's input, in the history of the workflow that called it with
// package step, and across Continue-As-New. A payload over the store's
// limit is refused with an error wrapping resultstore.ErrTooLarge, and
// nothing is started.
//
// # Expiry
//
// Each stored payload is claimed for the workflows whose history holds
// its reference (resultstore.Expirable), and a durallm worker's sweeper
// deletes it a retention after the last of them closed: the workflow that
// wrote it; for a child's input, the child too; for a workflow's own
// input, result or Continue-As-New arguments, its parent too, which reads
// that result. Claims are by workflow id, so a workflow's payloads live
// across its Continue-As-New runs.
//
// # Encryption
//
// With Options.Keys, every payload is encrypted (codec.NewCodec) after
// the large ones are stored, so history holds encrypted references; give
// the store the same keyring (Dir.Keys, pgstore.Store.Keys) and what it
// keeps is sealed too. The codec server (codec.Handler with
// HandlerOptions.References set to NewCodec) resolves references for the
// Temporal UI and CLI.
//
// # Large values
//
// A value the converter writes or reads may skip encoding/json's passes
// over what it holds verbatim: a SelfEncoding value writes its own JSON
// (workflows.ActionInput and attempt.Input copy a request's contents
// instead of compacting them), and a SelfChecking value decodes its
// payload's data itself, with no check of the whole before it. Either
// way the payload is the JSON it would be otherwise, up to white space
// and escapes.
//
// # Failures
//
// Inside workflow code, a store that cannot be read or written fails the
// workflow task, which Temporal retries, rather than the workflow; a
// payload small enough for Temporal (InlineLimit) whose store write
// failed travels inline instead, with a warning. Activities and clients
// get the error.
package claimcheck
