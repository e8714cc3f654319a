// Package runner runs one rank of a pool job as an external command, so that
// a torchrun-style training script runs unchanged on a pool worker and
// checkpoints through a contract the agent can resume from.
//
// # Process
//
// Each rank runs in its own working directory and leads its own process
// group. Stopping a rank (context cancelled, Stop) sends SIGTERM to the whole
// group and SIGKILL after Spec.Grace; Kill sends SIGKILL at once. When the
// leader exits, on its own or not, whatever it left in its group is killed
// too, so a rank never outlives itself. Standard input is /dev/null. Output
// from stdout and stderr is kept as a bounded tail (Spec.TailBytes of the
// two streams interleaved) and streamed line by line to Spec.OnLine, with
// lines cut at Spec.MaxLine bytes, so a script that floods its logs costs a
// fixed amount of memory. The package is Linux-only: it waits for the leader
// without reaping it (waitid with WNOWAIT), so that its group id cannot be
// reused while the group is being killed.
//
// # Environment
//
// A rank sees only PATH, HOME and LANG from the worker, then the job's
// declared variables (names [A-Za-z_][A-Za-z0-9_]*, bounded in number and
// size, none of the names below), then what torchrun would set:
//
//	RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (node rank),
//	GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME=default,
//	MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
//	TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID
//
// and the checkpoint contract's FLEETLEARN_* variables. Jobs may not set
// RANK-like names nor anything prefixed FLEETLEARN_, TORCHELASTIC_ or
// MASTER_. torch.distributed's env:// initialisation works unchanged.
//
// # Checkpoint contract
//
// The script is given:
//
//	FLEETLEARN_CHECKPOINT_DIR    directory to write checkpoints into (exists)
//	FLEETLEARN_RESUME_FROM       checkpoint directory to resume from; unset on
//	                             a fresh start
//	FLEETLEARN_STEPS             total optimiser steps of the job
//	FLEETLEARN_CHECKPOINT_EVERY  checkpoint after every this many steps
//
// A checkpoint after N completed steps is the directory
// $FLEETLEARN_CHECKPOINT_DIR/step-<N> (N in decimal, no leading zeros)
// holding:
//
//	model.safetensors      parameters, F32/F16/BF16/F64 tensors (required)
//	optimizer.safetensors  optimiser state (optional, any dtypes)
//	state.json             a JSON object: data cursor, RNG state, anything
//	                       needed to continue bit for bit (optional)
//
// It is committed by rename, the only atomic step a script needs:
//
//  1. remove step-<N>.tmp if a killed run left one, create it, write the
//     files into it and fsync them (and the directory);
//  2. if step-<N> already exists (a replaced checkpoint), remove it;
//  3. rename step-<N>.tmp to step-<N>, then fsync the checkpoint directory.
//
// In Python: os.rename(tmp, final) after writing. A crash at any point
// leaves either no step-<N> or a complete one; the older checkpoints are
// untouched. stepdir.Latest (package pool/stepdir) picks the highest committed N whose
// model.safetensors parses with the model package's reader (and whose
// optional files are sane), ignoring *.tmp, symlinks, stray files and
// damaged checkpoints, which it skips in favour of older ones. The agent
// restarts a killed rank with FLEETLEARN_RESUME_FROM set to that path and
// TORCHELASTIC_RESTART_COUNT incremented; the script continues from step N+1.
package runner
