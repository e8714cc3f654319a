// Package poolsvc is the aggregator's compute pool job service: the
// PoolService operators submit, watch and cancel pretraining jobs through,
// and the PoolWorkerService pool workers register, heartbeat, hold their
// checkpoints and average their parameters through.
//
// One goroutine owns the pool.Scheduler, which is not safe for concurrent
// use; RPC handlers hand it events as closures and wait for the result.
// After every event, and on a ticker, it runs a scheduling pass and carries
// out every decision: a placement becomes rank leases, a checkpoint stop
// and an abort become rank stops. Blocking waits (a heartbeat's long poll,
// an average waiting for the other ranks, a watch) happen in the handler's
// goroutine on channels the owner closes, so a caller that disconnects
// leaves nothing behind. So do the Average and OuterSync streams' intakes,
// which read, check and spool a contribution before handing it to the
// owner (syncstream.go), and the fold of a closing step's spools.
//
// Attempt numbers fence every rank call: a rank of an aborted attempt, or
// one on a worker that does not hold its lease, is refused, so a zombie
// cannot commit a checkpoint, join an average or crash the job's next
// attempt.
package poolsvc
