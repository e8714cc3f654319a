// Package checkpoint stores the training state of a Fleetlearn pool job so
// that a preempted or crashed job resumes where it stopped: parameters,
// optimizer state, data cursor, RNG state, step, lineage and job id.
//
// A checkpoint is a set of content-addressed blobs (the float32 tensors,
// little-endian, cut into fixed-size chunks so that unchanged chunks are
// shared between checkpoints) and a manifest: canonical JSON naming every
// blob by its SHA-256 digest and size. The manifest's own digest is the
// checkpoint id.
//
// A checkpoint may also hold opaque files, stored byte for byte and chunked
// and deduplicated like tensors: a job that runs its own training command
// keeps its safetensors files (of any dtype) and its JSON state that way,
// with no tensors at all. The manifest lists files sorted by name, and
// leaves the list out when there are none, so that manifests without files
// keep the encoding, and the ids, they had before files existed.
//
// Writes are ordered so that a crash at any point never leaves a committed
// manifest that points at missing or corrupt data: every blob is written and
// synced first, then the manifest, then the LATEST pointer, each through a
// synced temporary file, a rename and a synced directory. Readers verify
// every digest and refuse what does not match (ErrCorrupt).
//
// A restarted job calls LoadLatest: it follows LATEST, and when the pointer
// or its checkpoint is damaged it falls back to the highest-step manifest
// that verifies.
//
// Saver takes a checkpoint without stalling training for the write: it
// copies the tensors into one of a fixed number of buffers it reuses (the
// only part that blocks, unless every buffer still holds a snapshot waiting
// to be written) and writes in the background on a bounded number of
// goroutines, several saves in flight, committed one after another in the
// order they were taken.
//
// One store directory holds one job's checkpoints: Latest and GC order
// manifests by step and do not look at the job id.
package checkpoint
