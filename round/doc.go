// Package round is the round protocol's server side as a pure state
// machine and rules: no NATS, storage, protobuf, network or files, and time
// only as values it is given. The aggregator service (server/internal/coord)
// does the I/O (reads messages, writes the store, publishes answers) and
// asks the engine:
//
//   - selection: who gets a seat, who waits and how long (Cohort.Offer,
//     Eligibility, CheckCheckInSize, CheckCheckInDevice, NoShow), and when
//     selection ends (Cohort.CloseSelection);
//   - membership: seats, reports, failures (Cohort; CheckFailure);
//   - reports: is this one the round takes (CheckSender, CheckHeader,
//     CheckForm, CheckQuantized, CheckDigest, CheckLayout, CheckSignature,
//     CheckExamples, CheckMetrics, CheckNorm, CheckMasked), how much it
//     weighs (Influence), and what a device may store meanwhile (Storage);
//   - closing: does a plaintext round close, and how (Plain.Decide), and
//     does a secure round's stage close or wait, and until when
//     (Stages, by StageTiming and StageCap).
//
// A task trained asynchronously (FedBuff) has Async instead of rounds:
// seats up to a concurrency, reports weighted by staleness into a buffer,
// a server step every buffer, stale reports refused.
//
// The device's side is here too (Devices): what an agent does with a plan
// it is handed and after each attempt at it (work, retry after a back-off,
// give up once and say why, wait for the next round), which the agent's
// protocol code (internal/devproto) and the simulated fleet both follow.
//
// A Cohort's state serializes and restores exactly (MarshalBinary), so
// that another server can carry an open round on. Every refusal of a report
// is a *Refusal with a Class, the label the service counts it under, and a
// message for the device. The rules live here so that they are tested fast
// and exhaustively as tables and fuzz targets, while the end-to-end tests
// check that the service asks them (docs/ROUND.md maps one onto the other).
package round
