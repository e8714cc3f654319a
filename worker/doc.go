// Package worker is the pool agent: the program that a volunteer or a data
// centre runs on each machine it lends to a Fleetlearn pool. It finds out
// what the machine can offer (logical CPUs, memory and GPUs, within the
// limits of its own cgroup), announces that to the pool, runs the jobs it
// is given as child processes, and meters each job's CPU-seconds, peak
// memory and, where the hardware exposes it, energy, so that the pool can
// account for the work done. It shares no code with the server or the edge
// services: it speaks to them only through the protocol.
package worker
