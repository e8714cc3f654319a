// Package worker is the pool agent: the program that a volunteer or a data
// centre runs on each machine it lends to a Fleetlearn pool. It finds out
// what the machine can offer (logical CPUs, memory and GPUs, within the
// limits of its own cgroup), announces that to the pool, runs the jobs it
// is given as child processes, and meters each job's CPU-seconds, peak
// memory and, where the hardware exposes it, energy, so that the pool can
// account for the work done. It shares no code with the server or the edge
// services: it speaks to them only through the protocol
// (fleetlearn.api.v1.PoolWorkerService).
//
// # Agent
//
// Agent.Run registers the worker and heartbeats. A heartbeat is a long
// poll: the server answers at once with ranks to start or stop, otherwise
// after the heartbeat interval, and the agent asks again at once, reporting
// each running rank's step, loss and usage. A server that answers NOT_FOUND
// has forgotten the worker: its ranks are stopped and it registers again.
// A stop at a checkpoint lets a rank run to its next checkpoint; any other
// stop sends SIGTERM, then SIGKILL after a grace period. Every rank's end is
// reported (RankExited) as completed, stopped or failed, with its exit
// code, usage and data digest; its output lines go to the job's log in
// bounded batches, with a count of any dropped.
//
// # Ranks
//
// Every rank is a child process in a process group of its own, metered
// from its start, and killed by the kernel if the agent dies (Pdeathsig),
// so that no rank outlives the lease it was started for.
//
// A built-in trainer rank runs Config.RankCommand followed by
// "--lease FILE"; by default this executable's hidden "rank" command, which
// must call RunRank and exit with RankExitCode. FILE, 0600 in the rank's
// directory, holds the lease, the server address, CA and token, so that no
// credential appears in argv or the environment; the rank reads and removes
// it. The rank keeps its checkpoints on the server (resuming from the one
// the server names), averages through it with more than one rank, stops
// after a checkpoint whose commit the server answered with stop, after its
// next checkpoint on StopAtCheckpointSignal (SIGUSR1), and at once on
// SIGTERM. It reports to the agent in lines on standard output that start
// with "fleetlearn-rank "; everything else it writes is log output.
//
// A command rank runs the job's program as torchrun would, with
// Fleetlearn's checkpoint contract (docs/POOL.md): each step-N directory it
// commits is uploaded to the server, and an attempt that resumes first gets
// the server's checkpoint back as a step directory.
package worker
