// Package round is the round protocol's decisions as pure functions of what
// the server knows: no NATS, storage, protobuf, network or files, and time
// only as values it is given. The aggregator service (server/internal/coord)
// does the I/O and asks the engine: is this report one the round takes
// (CheckSender, CheckHeader, CheckExamples, CheckMetrics), does a
// plaintext round close, and how (Plain.Decide), and does a secure round's
// stage close or wait, and until when (StageTiming.Decide)? Every refusal is a *Refusal with a
// Class, the label the service counts it under, and a message for the
// device.
//
// The rules live here so that they are tested fast and exhaustively as
// tables and fuzz targets, while the end-to-end tests check that the
// service asks them.
package round
