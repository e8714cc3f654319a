// Package cmdckpt carries the checkpoints of a pool job that runs its own
// training command between the runner's step-<N> directories and a
// checkpoint.Store, so that the server keeps them and a job resumes on any
// worker.
//
// A step directory (see the runner's checkpoint contract) holds
// model.safetensors, and optionally optimizer.safetensors and state.json.
// Upload stores those files byte for byte as the opaque files of a
// checkpoint with no tensors: BF16 parameters, optimizer state of any dtype
// and the script's JSON state come back exactly as the script wrote them.
// Materialize writes such a checkpoint back as a committed step directory,
// by the same rename protocol the script uses, so that the runner's
// LatestCheckpoint finds it and the script resumes from it.
//
// Neither side interprets the files beyond the contract's bounds: the
// runner verifies a step directory before resuming from it, and the store
// verifies every byte by digest.
package cmdckpt
