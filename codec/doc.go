// Package codec offers optional encryption of Temporal payloads, so that
// prompts, generated text and tool arguments stored in workflow history
// cannot be read by anyone holding only the history (Temporal operators,
// database backups, the Web UI), and a codec server that lets the Temporal
// Web UI and CLI show them to those who hold the key.
//
// # Keys
//
// LoadKeyring reads "file:<path>" or "env:<NAME>". Each line is
// "keyid:base64key" with a 32-byte key; the first line is the active key,
// used for every new payload, and later lines are older keys kept only to
// read history written with them. A key can be made with
//
//	printf 'k2025a:%s\n' "$(openssl rand -base64 32)" >> keys && chmod 600 keys
//
// To rotate, put the new line first and keep the old ones until no history
// that still matters (open workflows, or closed ones inside the namespace's
// retention) refers to them. Every worker and every client of a namespace
// must load keys that cover what the others write.
//
// # Encryption
//
// NewCodec is AES-256-GCM over the whole marshalled payload, with the key
// id as additional data so a payload cannot be re-labelled to another key.
// Payloads that are not encrypted pass through Decode unchanged, so turning
// encryption on does not break history written before. Use DataConverter
// as client.Options.DataConverter on workers and on every client.
//
// Search attributes, workflow ids and activity names are not encrypted,
// because the server must read them, and neither are failure messages
// unless the client's FailureConverter sets EncodeCommonAttributes; keep
// prompts and secrets out of them (docs/contract.md section 7).
//
// # Codec server
//
// Handler serves the Temporal codec protocol: POST /encode and POST
// /decode with protobuf-JSON Payloads, plus GET /healthz. Run it where the
// keys live:
//
//	k, err := codec.LoadKeyring("file:/etc/durallm/keys", nil)
//	...
//	h := codec.Handler(k, codec.HandlerOptions{
//		AllowedOrigins: []string{"http://localhost:8233"}, // the Web UI
//		AuthToken:      os.Getenv("CODEC_TOKEN"),
//	})
//	log.Fatal(http.ListenAndServe("127.0.0.1:8081", h))
//
// Serve it over HTTPS anywhere but loopback: /decode returns plaintext.
// With HandlerOptions.References (claimcheck.NewCodec over the workers'
// result store), /decode also resolves payloads kept by reference.
//
// Temporal Web UI: the browser, not the UI server, calls the codec server,
// so its address must be reachable from the browser and the UI's origin
// must be in HandlerOptions.AllowedOrigins. Point the UI at it either per
// user, in the UI's settings ("Codec Server" endpoint, stored in the
// browser), or for everyone in the UI server's configuration: codec.endpoint
// in its config file, TEMPORAL_CODEC_ENDPOINT for the temporalio/ui image,
// --ui-codec-endpoint for "temporal server start-dev", or
// uiconfig.Config.Codec.Endpoint when the UI server is embedded. The UI
// sends X-Namespace on every request. It sends an Authorization header
// only with the "pass access token" setting (TEMPORAL_CODEC_PASS_ACCESS_TOKEN),
// and then it is the signed-in user's OIDC access token, not a static
// secret; so a static AuthToken suits the CLI, while a UI deployment with
// users is better fronted by a proxy that validates those tokens.
//
// Temporal CLI: pass --codec-endpoint http://127.0.0.1:8081 (and, with an
// AuthToken, --codec-auth "Bearer <token>") to commands such as
// "temporal workflow show", or set TEMPORAL_CODEC_ENDPOINT and
// TEMPORAL_CODEC_AUTH, or the codec section of a temporal.toml profile. The
// CLI also sends X-Namespace, and replaces "{namespace}" in the endpoint.
package codec
