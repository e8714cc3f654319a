// Package witness is a transparency-log witness for the audit log, after
// c2sp.org/tlog-witness: it follows the log's checkpoints, checks that each
// is consistent with the last one it cosigned, and cosigns it in the
// c2sp.org/tlog-cosignature format (cosignature/v1).
//
// A Witness keeps its state, the last checkpoint it cosigned, in a folder
// of its own, written and synced before it cosigns anything newer. It
// refuses, with an error wrapping audit.ErrInconsistent, a checkpoint that
// is smaller than that one (a rollback), has another root at the same size
// (a split view), or comes without a valid RFC 9162 consistency proof from
// it; it then writes both notes to an evidence file in the folder and
// keeps its state, so it never cosigns anything inconsistent with what it
// cosigned before. An unchanged checkpoint is cosigned again with a fresh
// time. The note it cosigned last stays in the folder (CosignedFile,
// ReadCosigned): an auditor holds the log to it (audit.WithWitnessCheckpoint),
// which a log rolled back since cannot pass, though the copy restored
// holds the witness's genuine cosignatures of its own time.
//
// The package does no networking: the caller fetches checkpoints and
// proofs and delivers cosignatures (fleetlearn audit witness does it over
// the API).
//
//	w, err := witness.New(key, logVKey, stateDir)
//	cosigned, err := w.Update(ctx, note, func(ctx context.Context, size1, size2 uint64) ([][]byte, error) {
//		return fetchConsistencyProof(ctx, size1, size2)
//	})
package witness
