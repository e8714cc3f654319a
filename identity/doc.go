// Package identity holds Fleetlearn's keys, tokens and signatures: who may
// join the fleet, who may call the API, what a device may do on NATS, and
// which modules and reports are genuine.
//
//   - Enrollment tokens (EnrollmentIssuer, EnrollmentVerifier): short-lived,
//     single-use EdDSA JWTs an operator hands to one device installation.
//   - NATS authorization (Authority): operator, FLEET account and system
//     account keys; account JWTs with revocations; user JWTs for the
//     aggregator and for each device, whose permissions confine it to its
//     own subjects. The server wires an Authority into its embedded
//     nats-server (server/internal/natsembed); this package does not
//     depend on nats-server.
//   - Device keys (UserKey): an nkey user seed in a 0600 file; the same
//     Ed25519 key signs NATS nonces, update reports (SignReport) and SecAgg
//     advertisements.
//   - Module signatures (Publisher, TrustedPublishers): JWS over a module's
//     sha256 by a publisher key from a JWK Set.
//   - API bearer tokens (APIIssuer, APIVerifier) and the role Policy for the
//     gRPC methods.
//   - TLS (LoadOrCreateTLS): a private CA, a server certificate, and client
//     certificates for mutual TLS.
//
// Every signature is Ed25519 and every verifier pins the algorithm. Clocks
// and randomness are injected (WithClock, WithRand). The package does no
// networking. docs/SECURITY.md describes the threat model and the flows.
package identity
