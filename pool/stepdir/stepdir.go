package stepdir

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/fleetlearn/fleetlearn/model"
)

// Checkpoint file names inside a step-<N> directory.
const (
	ModelFile     = "model.safetensors"
	OptimizerFile = "optimizer.safetensors"
	StateFile     = "state.json"
)

// ErrNoCheckpoint reports a checkpoint directory with no committed,
// readable checkpoint.
var ErrNoCheckpoint = errors.New("stepdir: no committed checkpoint")

// MaxStateBytes bounds state.json: it holds cursors and RNG state, not data.
const MaxStateBytes = 16 << 20

// Latest returns the step and path of the newest committed, readable
// checkpoint under dir. A checkpoint is committed when a directory named
// exactly step-<N> (N a decimal integer without sign or leading zeros) exists:
// the contract has scripts rename step-<N>.tmp into place, so anything else
// (a .tmp left by a killed script, stray files) is not one. Newer checkpoints
// that fail to verify (model.safetensors missing or not parseable, an
// optimizer.safetensors that is not a regular file, a state.json that is not
// a JSON object) are skipped in favour of older ones, since resuming from a
// damaged checkpoint would fail on every retry. It wraps ErrNoCheckpoint when
// nothing qualifies, including when dir does not exist.
func Latest(dir string) (step int64, path string, err error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, "", fmt.Errorf("stepdir: latest: %s does not exist: %w", dir, ErrNoCheckpoint)
	}
	if err != nil {
		return 0, "", fmt.Errorf("stepdir: latest: %w", err)
	}
	type cand struct {
		step int64
		name string
	}
	var cands []cand
	for _, e := range entries {
		// Type is from Lstat: a symlink is not a directory here, so a
		// checkpoint cannot point outside dir.
		if !e.IsDir() {
			continue
		}
		if n, ok := parseStepName(e.Name()); ok {
			cands = append(cands, cand{n, e.Name()})
		}
	}
	slices.SortFunc(cands, func(a, b cand) int { return cmp.Compare(b.step, a.step) })
	var skipped []error
	for _, c := range cands {
		p := filepath.Join(dir, c.name)
		if err := verifyCheckpoint(p); err != nil {
			skipped = append(skipped, err)
			continue
		}
		return c.step, p, nil
	}
	if len(skipped) > 0 {
		return 0, "", fmt.Errorf("stepdir: latest: none of %d candidates verified (newest: %v): %w", len(skipped), skipped[0], ErrNoCheckpoint)
	}
	return 0, "", fmt.Errorf("stepdir: latest: none in %s: %w", dir, ErrNoCheckpoint)
}

// parseStepName accepts "step-<N>" with N canonical, so that step-7 and
// step-007 cannot both claim step 7.
func parseStepName(name string) (int64, bool) {
	digits, ok := strings.CutPrefix(name, "step-")
	if !ok || digits == "" || len(digits) > 1 && digits[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return 0, false
	}
	return n, true
}

// verifyCheckpoint checks one step directory against the contract.
func verifyCheckpoint(p string) error {
	if err := verifyModel(filepath.Join(p, ModelFile)); err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(p), err)
	}
	// The optimizer file is not parsed: optimizers keep integer tensors (step
	// counts) that the model reader rightly refuses as parameters.
	if fi, err := os.Lstat(filepath.Join(p, OptimizerFile)); err == nil && !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: %s is not a regular file", filepath.Base(p), OptimizerFile)
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %w", filepath.Base(p), err)
	}
	if err := verifyState(filepath.Join(p, StateFile)); err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(p), err)
	}
	return nil
}

func verifyModel(path string) error {
	f, err := openRegular(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if _, err := model.ReadSafetensors(f, model.WithInputSize(fi.Size()), model.WithMaxTensorBytes(fi.Size())); err != nil {
		return fmt.Errorf("%s: %w", ModelFile, err)
	}
	return nil
}

func verifyState(path string) error {
	f, err := openRegular(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() > MaxStateBytes {
		return fmt.Errorf("%s: %d bytes, limit %d", StateFile, fi.Size(), MaxStateBytes)
	}
	var v map[string]json.RawMessage
	if err := json.NewDecoder(f).Decode(&v); err != nil || v == nil {
		return fmt.Errorf("%s: not a JSON object: %v", StateFile, err)
	}
	return nil
}

// openRegular opens path only if it is a regular file, not a symlink or a
// FIFO that would block the verifier.
func openRegular(path string) (*os.File, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", filepath.Base(path))
	}
	return os.Open(path)
}
