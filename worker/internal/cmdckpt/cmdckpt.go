package cmdckpt

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
	"github.com/fleetlearn/fleetlearn/pool/stepdir"
)

// contractFiles are the only files of a step directory, in the order they
// are read; the first is required.
var contractFiles = []string{stepdir.ModelFile, stepdir.OptimizerFile, stepdir.StateFile}

// maxBytes bounds one contract file: state.json by the runner's own bound,
// the safetensors files by what a checkpoint may hold in all.
func maxBytes(name string) int64 {
	if name == stepdir.StateFile {
		return stepdir.MaxStateBytes
	}
	return checkpoint.MaxFilesBytes
}

// Upload stores the committed step directory dir as checkpoint step of job
// and returns its id. Only the contract's files are read (other entries are
// not part of a checkpoint and are ignored); each must be a regular file,
// not a symlink, within its bound, and model.safetensors must be there. The
// checkpoint holds the job, the step and the files, nothing else.
//
// The files are held in memory while they are written, so Upload needs as
// much memory as the checkpoint is large.
func Upload(s checkpoint.Store, job string, step int64, dir string, opts checkpoint.Options) (checkpoint.Digest, error) {
	if step < 0 {
		return checkpoint.Digest{}, fmt.Errorf("cmdckpt: upload %s: negative step %d: %w", dir, step, ErrInvalidStepDir)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return checkpoint.Digest{}, fmt.Errorf("cmdckpt: upload %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return checkpoint.Digest{}, fmt.Errorf("cmdckpt: upload %s: not a directory (a symlink is not followed): %w", dir, ErrInvalidStepDir)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return checkpoint.Digest{}, fmt.Errorf("cmdckpt: upload %s: %w", dir, err)
	}
	defer root.Close()
	var files []checkpoint.File
	var total int64
	for _, name := range contractFiles {
		data, err := readRegular(root, name, min(maxBytes(name), checkpoint.MaxFilesBytes-total))
		if errors.Is(err, fs.ErrNotExist) && name != stepdir.ModelFile {
			continue
		}
		if errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("%s missing: the contract requires it: %w", name, ErrInvalidStepDir)
		}
		if err != nil {
			return checkpoint.Digest{}, fmt.Errorf("cmdckpt: upload %s: %w", dir, err)
		}
		total += int64(len(data))
		files = append(files, checkpoint.File{Name: name, Data: data})
	}
	id, err := checkpoint.Write(s, &checkpoint.Checkpoint{Job: job, Step: step, Files: files}, opts)
	if err != nil {
		return checkpoint.Digest{}, fmt.Errorf("cmdckpt: upload %s: %w", dir, err)
	}
	return id, nil
}

// readRegular reads name from root if it is a regular file of at most limit
// bytes. The entry is checked without following a symlink, and the file
// opened is checked to be the one checked, so a symlink swapped in between
// is refused too. O_NONBLOCK keeps a FIFO swapped in from blocking the open.
func readRegular(root *os.Root, name string, limit int64) ([]byte, error) {
	li, err := root.Lstat(name)
	if err != nil {
		return nil, err
	}
	if !li.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is a %s, not a regular file: %w", name, kind(li.Mode()), ErrInvalidStepDir)
	}
	if li.Size() > limit {
		return nil, fmt.Errorf("%s: %d bytes, limit %d: %w", name, li.Size(), limit, ErrTooLarge)
	}
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if !os.SameFile(li, fi) {
		return nil, fmt.Errorf("%s was replaced while it was read: %w", name, ErrInvalidStepDir)
	}
	data := make([]byte, fi.Size())
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, fmt.Errorf("%s: %w (did the script change a committed checkpoint?)", name, err)
	}
	var one [1]byte
	if n, _ := f.Read(one[:]); n > 0 {
		return nil, fmt.Errorf("%s grew while it was read; a committed checkpoint must not change: %w", name, ErrInvalidStepDir)
	}
	return data, nil
}

func kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m.IsDir():
		return "directory"
	}
	return "special file"
}

// Materialize loads checkpoint id and writes it as dir/step-<N>, committed
// as the contract asks of a script: step-<N>.tmp is written and synced,
// a step-<N> already there is removed, step-<N>.tmp is renamed into place
// and dir synced. A crash leaves no step-<N> or a whole one. It returns the
// step directory's path, the one runner.LatestCheckpoint then finds (unless
// dir holds a later step). dir must exist. A checkpoint with tensors, with a
// file the contract does not name or without model.safetensors is refused
// with ErrNotCommandCheckpoint before anything is written.
func Materialize(s checkpoint.Store, id checkpoint.Digest, dir string) (path string, err error) {
	ck, err := checkpoint.Load(s, id)
	if err != nil {
		return "", fmt.Errorf("cmdckpt: materialize %s: %w", id, err)
	}
	if err := checkContract(ck); err != nil {
		return "", fmt.Errorf("cmdckpt: materialize %s: %w", id, err)
	}
	final := filepath.Join(dir, "step-"+strconv.FormatInt(ck.Step, 10))
	if err := commit(final, ck.Files); err != nil {
		return "", fmt.Errorf("cmdckpt: materialize %s into %s: %w", id, dir, err)
	}
	return final, nil
}

func checkContract(ck *checkpoint.Checkpoint) error {
	if ck.Params != nil && len(ck.Params.Tensors) > 0 || ck.Optimizer != nil {
		return fmt.Errorf("it holds tensors: %w", ErrNotCommandCheckpoint)
	}
	hasModel := false
	for _, f := range ck.Files {
		switch f.Name {
		case stepdir.ModelFile:
			hasModel = true
		case stepdir.OptimizerFile:
		case stepdir.StateFile:
			if len(f.Data) > stepdir.MaxStateBytes {
				return fmt.Errorf("%s: %d bytes, limit %d: %w", f.Name, len(f.Data), stepdir.MaxStateBytes, ErrTooLarge)
			}
		default:
			return fmt.Errorf("file %q is not one the contract names: %w", f.Name, ErrNotCommandCheckpoint)
		}
	}
	if !hasModel {
		return fmt.Errorf("no %s: %w", stepdir.ModelFile, ErrNotCommandCheckpoint)
	}
	return nil
}

// commit writes files into final's .tmp sibling, syncs them and it, and
// renames it into place.
func commit(final string, files []checkpoint.File) (err error) {
	tmp := final + ".tmp"
	// A killed earlier attempt may have left one.
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	for _, f := range files {
		if err := writeSynced(filepath.Join(tmp, f.Name), f.Data); err != nil {
			return err
		}
	}
	if err := atomicfile.SyncDir(tmp); err != nil {
		return fmt.Errorf("sync %s: %w", filepath.Base(tmp), err)
	}
	if err := os.RemoveAll(final); err != nil {
		return fmt.Errorf("replace %s: %w", filepath.Base(final), err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	if err := atomicfile.SyncDir(filepath.Dir(final)); err != nil {
		return fmt.Errorf("sync %s: %w", filepath.Dir(final), err)
	}
	return nil
}

func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return nil
}
