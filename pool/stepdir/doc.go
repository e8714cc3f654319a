// Package stepdir is the checkpoint contract of command pool jobs on disk: a
// rank's script writes each checkpoint into step-<N>.tmp and renames it to
// step-<N> (model.safetensors, optionally optimizer.safetensors and
// state.json), and Latest finds the newest committed one that verifies.
// The worker's runner resumes ranks from it, and the job service reads a
// Kubernetes job's checkpoints from the volume its pods write, with the
// same rules.
package stepdir
