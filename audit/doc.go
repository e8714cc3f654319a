// Package audit is Fleetlearn's tamper-evident audit log: an append-only
// RFC 6962 Merkle tree of signed events in one SQLite file (or, for
// replicated aggregators, a PostgreSQL database: WithDatabase), with signed
// checkpoints, inclusion and consistency proofs, queries, and an export that
// an auditor verifies offline without trusting the operator.
//
// Each entry is a JWS (compact serialization, EdDSA over Ed25519) whose
// payload is the canonical JSON of an Event; the entry bytes are stored and
// hashed verbatim. Checkpoints are c2sp.org/tlog-checkpoint bodies in
// c2sp.org/signed-note envelopes, signed with a second Ed25519 key, and the
// log never signs one that does not extend the previous one.
//
// The server's side:
//
//	lg, err := audit.Open(ctx, dataDir, audit.WithOrigin("fleetlearn.example.com/audit"), audit.WithClock(now))
//	_, err = lg.Record(ctx, audit.Operator("alice"), audit.TaskStopped{Task: "t-1", State: audit.TaskStoppedBy})
//	cp, err := lg.Checkpoint(ctx) // from a ticker, every second
//	page, err := lg.Query(ctx, filter, 100, token)
//	proof, err := lg.InclusionProof(ctx, index, cp.Size)
//	err = lg.Export(ctx, w)
//
// The auditor's side:
//
//	report, err := audit.VerifyExport(r, audit.WithEntryKey(pub), audit.WithVerifierKey(vkey))
//
// docs/AUDIT.md describes the formats, the event catalogue and the
// guarantees.
package audit
