// Package pool is the scheduling math of Fleetlearn's cloud GPU pools: job
// specs and their bounds, the job state machine, all-or-nothing gang
// placement, per-tenant quotas and weighted fair share, checkpoint-aware
// preemption, and CPU/GPU-second budgets.
//
// It is a pure scheduler over the server's reports, in the manner of
// Nomad's: nothing here starts, stops or talks to anything. The server
// feeds a Scheduler events (Submit, AddWorker, LoseWorker, Progress,
// Checkpointed, Meter, Cancel) and calls Schedule, which returns Decisions
// (place a gang on workers, checkpoint-and-stop, abort, fail) that the
// server carries out. Time comes from an injected clock, so a pass is a
// function of the events and the clock, and replays give the same
// decisions.
//
// Why these rules:
//
//   - A gang starts whole or not at all. Partial placements that hold
//     resources while waiting for the rest are how pod-by-pod schedulers
//     deadlock two large gangs against each other.
//   - The first gang that does not fit reserves specific workers, and
//     backfill may use only what lies outside the reservation, so a stream
//     of small jobs cannot starve a large one.
//   - Preemption happens only at checkpoint boundaries and prefers the
//     victim with least work since its checkpoint, so a preempted job loses
//     no committed work and the pool loses the least uncommitted work.
//   - Fair share is weighted dominant-resource fairness, so tenants with
//     different resource mixes are compared on the resource each uses most.
//
// A job's State maps one-to-one onto the audit log's pool job states
// (State.AuditState); finer phases are in Job.Reason and Decision.Reason.
package pool
