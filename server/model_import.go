package server

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/lm"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// ImportDir is where model imports are staged, under DataDir: the upload,
// converted to the canonical encoding, waits there until it is in the blob
// store. Start empties it (what a crash left behind).
const ImportDir = "import"

// maxImportHeaderBytes bounds an imported file's JSON header, which is held
// in memory (the values never are). 16 MiB describes some 200,000 tensors;
// a large language model has a few thousand.
const maxImportHeaderBytes = 16 << 20

func importDir(dataDir string) string { return filepath.Join(dataDir, ImportDir) }

// clearImports removes the staging files an interrupted import left.
func (s *Server) clearImports() error {
	dir := importDir(s.cfg.DataDir)
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("server: clearing %s: %w", dir, err)
	}
	return nil
}

// ImportModel checks the safetensors file r holds as it arrives, converts it
// to the canonical encoding (F32, the server's lineage metadata) into a
// staging file while hashing it, and puts that file into the blob store:
// memory stays a few chunks whatever the model's size. The checks are
// model.SafetensorsReader's, the ones every model read makes. Nothing is
// kept unless the whole upload arrived and matched its header; the staging
// file is removed whatever happens.
func (v *service) ImportModel(ctx context.Context, h *pb.ImportModelHeader, r io.Reader) (*pb.Model, error) {
	if err := checkName("model", h.GetName()); err != nil {
		return nil, err
	}
	opts := []model.ReadOption{model.WithMaxHeaderBytes(maxImportHeaderBytes)}
	if n := h.GetSizeBytes(); n > 0 && n <= 1<<62 {
		opts = append(opts, model.WithInputSize(int64(n)))
	}
	d, err := model.NewSafetensorsReader(r, opts...)
	if err != nil {
		if n := h.GetSizeBytes(); n > 0 {
			return nil, invalid("%v (checked against the %d bytes the upload's header declared)", err, n)
		}
		return nil, invalid("%v", err)
	}
	tensors := d.Tensors()
	if len(tensors) == 0 {
		return nil, invalid("model has no tensors")
	}
	if p := h.GetParentVersion(); p != "" {
		if err := v.checkParent(ctx, p, tensors); err != nil {
			return nil, err
		}
	}

	dir := importDir(v.s.cfg.DataDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("import model: staging: %w", err)
	}
	f, err := os.CreateTemp(dir, "model-*.safetensors")
	if err != nil {
		return nil, fmt.Errorf("import model: staging: %w", err)
	}
	defer func() {
		f.Close()
		os.Remove(f.Name())
	}()
	sum := sha256.New()
	stage := &stagingWriter{w: f}
	bw := bufio.NewWriterSize(io.MultiWriter(stage, sum), 1<<20)
	// Re-encode canonically so a version names one exact byte string.
	size, err := d.WriteCanonical(bw, model.Lineage{Parent: h.GetParentVersion(), Source: "imported"})
	if err == nil {
		err = bw.Flush()
	}
	switch {
	case stage.err != nil:
		return nil, fmt.Errorf("import model: staging: %w", stage.err)
	case err != nil:
		// What the reader refused (the api layer reports an upload that
		// failed in transit as such, whatever this says).
		return nil, invalid("%v", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("import model: staging: %w", err)
	}
	version := hex.EncodeToString(sum.Sum(nil))
	if err := v.blobs.PutReader(ctx, version, bufio.NewReaderSize(f, 1<<20)); err != nil {
		return nil, err
	}
	params := 0
	for _, t := range tensors {
		params += t.Size()
	}
	row := &store.ModelRow{Version: version, Name: h.GetName(), Description: h.GetDescription(), Parent: h.GetParentVersion(),
		Source: pb.ModelSource_MODEL_SOURCE_IMPORTED, Tensors: len(tensors), Params: params,
		Size: size, Created: v.s.o.now()}
	if err := v.s.store.InsertModel(ctx, row); err != nil {
		return nil, err
	}
	if err := v.recorded(ctx, audit.ModelImported{Model: version, SHA256: version, Name: h.GetName(),
		Size: uint64(size), Parameters: uint64(row.Params)}); err != nil {
		return nil, err
	}
	return row.Proto(), nil
}

// stagingWriter remembers a write error, which is the server's (a full
// disk), not the upload's.
type stagingWriter struct {
	w   io.Writer
	err error
}

func (s *stagingWriter) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	if err != nil && s.err == nil {
		s.err = err
	}
	return n, err
}

// checkParent refuses an import whose parent the registry does not hold,
// and a model that cannot have been derived from that parent: every tensor
// of the parent other than a LoRA adapter must be in the model with the
// same shape. Values may differ (the model was trained further), and the
// model may add tensors (LoRA adapters) or drop the parent's adapters (a
// merge); what lineage must not do is link models of different
// architectures, which would send a lineage query from a pool job to a
// model trained from something else. Only the parent's header is read.
func (v *service) checkParent(ctx context.Context, parent string, tensors []model.TensorInfo) error {
	if _, err := v.s.store.Model(ctx, parent); errors.Is(err, backend.ErrNotFound) {
		return fmt.Errorf("parent model %s is not in the registry; fleetlearn model list shows the models: %w", parent, backend.ErrPrecondition)
	} else if err != nil {
		return err
	}
	rc, err := v.blobs.Open(ctx, parent)
	if err != nil {
		return fmt.Errorf("parent model %s: %w", parent, err)
	}
	defer rc.Close()
	pd, err := model.NewSafetensorsReader(rc)
	if err != nil {
		return fmt.Errorf("parent model %s: %w", parent, err)
	}
	shapes := make(map[string][]int, len(tensors))
	for _, t := range tensors {
		shapes[t.Name] = t.Shape
	}
	for _, t := range pd.Tensors() {
		if lm.IsLoRA(t.Name) {
			continue
		}
		s, ok := shapes[t.Name]
		switch {
		case !ok:
			return invalid("the model has no tensor %s, which its parent %s has: a model derived from it keeps its parent's tensors (LoRA adapters aside); "+
				"import it without --parent if it is another architecture", t.Name, parent)
		case !slices.Equal(s, t.Shape):
			return invalid("tensor %s is %v in the model and %v in its parent %s: a model derived from it keeps its parent's shapes; "+
				"import it without --parent if it is another architecture", t.Name, s, t.Shape, parent)
		}
	}
	return nil
}
