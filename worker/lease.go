package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// maxLeaseFileBytes bounds a lease file: a spec, a CA bundle and a token.
const maxLeaseFileBytes = 4 << 20

// leaseFile is what the agent hands a built-in trainer rank. It holds the
// worker's token, so it is written 0600 in the rank's own directory and
// removed by the rank once read: credentials never appear in argv or the
// environment, which other users of the machine can read.
type leaseFile struct {
	Server   string `json:"server"`
	CAPEM    []byte `json:"ca_pem,omitempty"`
	Token    string `json:"token,omitempty"`
	Insecure bool   `json:"insecure,omitempty"`
	WorkerID string `json:"worker_id"`
	DataRoot string `json:"data_root,omitempty"`
	// Lease is the RankLease in protobuf binary form.
	Lease []byte `json:"lease"`
}

func writeLeaseFile(path string, lf *leaseFile) error {
	b, err := json.Marshal(lf)
	if err != nil {
		return fmt.Errorf("worker: write lease file: %w", err)
	}
	if err := atomicfile.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("worker: write lease file: %w", err)
	}
	return nil
}

// readLeaseFile reads and removes path, refusing a file that others could
// read or that is not a lease.
func readLeaseFile(path string) (*leaseFile, *pb.RankLease, error) {
	if !filepath.IsAbs(path) {
		return nil, nil, fmt.Errorf("worker: lease file %q: %w: not an absolute path", path, ErrLease)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("worker: lease file: %w", err)
	}
	defer f.Close()
	// Removed before anything can fail: a token left on disk outlives the
	// rank that needed it.
	rmErr := os.Remove(path)
	st, err := f.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("worker: lease file: %w", err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o077 != 0 {
		return nil, nil, fmt.Errorf("worker: lease file %s: %w: mode %v, want a regular file only its owner can read", path, ErrLease, st.Mode())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxLeaseFileBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("worker: lease file: %w", err)
	}
	if len(b) > maxLeaseFileBytes {
		return nil, nil, fmt.Errorf("worker: lease file %s: %w: over %d bytes", path, ErrLease, maxLeaseFileBytes)
	}
	if rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("worker: lease file: remove: %w", rmErr)
	}
	var lf leaseFile
	if err := json.Unmarshal(b, &lf); err != nil {
		return nil, nil, fmt.Errorf("worker: lease file %s: %w: %w", path, ErrLease, err)
	}
	var l pb.RankLease
	if err := proto.Unmarshal(lf.Lease, &l); err != nil {
		return nil, nil, fmt.Errorf("worker: lease file %s: %w: %w", path, ErrLease, err)
	}
	if lf.Server == "" || lf.WorkerID == "" {
		return nil, nil, fmt.Errorf("worker: lease file %s: %w: no server or worker id", path, ErrLease)
	}
	return &lf, &l, nil
}
