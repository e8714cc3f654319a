// Package remote keeps a pool rank's checkpoints on the server and averages
// its parameters through it: Store is a checkpoint.Store over the
// PoolWorkerService calls of one rank of one leased attempt (its commits
// carry the stall a checkpoint.Saver measured, checkpoint.StallRecorder),
// Syncer a trainer.Syncer over its Average stream, and OuterSyncer a DiLoCo
// island's trainer.OuterSyncer over OuterSync (float32 or int8
// pseudo-gradients, each built once so that a retry sends the same bytes).
// Vectors go up and come back in 1 MiB chunks, so no message holds a whole
// model.
//
// Everything the server sends back is untrusted input: blobs are bounded
// and their digests checked, manifests are decoded by pool/checkpoint's
// strict decoder and must hash to the id they were sent under, averages
// must come in order, finite, and have exactly the length sent. Calls the server could not take
// (UNAVAILABLE) are retried with back-off; every other refusal, such as a
// call for an attempt the worker no longer holds, is returned at once, as
// retrying it cannot help.
package remote
