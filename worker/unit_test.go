package worker

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model/lm"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

func TestLeaseFileReadOnceAndPrivate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "lease.json")
	raw, err := proto.Marshal(builtinLease("j", 1, 10, 5, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := writeLeaseFile(path, &leaseFile{Server: "h:7070", Token: "secret", WorkerID: "w", Lease: raw}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("lease file mode %v, %v", st.Mode(), err)
	}
	lf, l, err := readLeaseFile(path)
	if err != nil || lf.Token != "secret" || l.GetJobId() != "j" {
		t.Fatalf("read %+v %v: %v", lf, l, err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lease file left behind: %v", err)
	}
	if err := writeLeaseFile(path, &leaseFile{Server: "h:7070", Token: "secret", WorkerID: "w", Lease: raw}); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := readLeaseFile(path); !errors.Is(err, ErrLease) {
		t.Fatalf("world-readable lease file: %v", err)
	}
	if _, _, err := readLeaseFile("lease.json"); !errors.Is(err, ErrLease) {
		t.Fatalf("relative lease path: %v", err)
	}
}

func TestDatasetRefusals(t *testing.T) {
	for _, c := range []struct {
		ds   *pb.PoolDataset
		root string
	}{
		{&pb.PoolDataset{Source: "dir:../etc"}, "/data"},
		{&pb.PoolDataset{Source: "dir:a/b"}, "/data"},
		{&pb.PoolDataset{Source: "dir:set"}, ""},
		{&pb.PoolDataset{Source: "imagenet"}, ""},
	} {
		if _, err := loadDataset(c.ds, c.root); !errors.Is(err, ErrLease) {
			t.Errorf("%v under %q: %v, want ErrLease", c.ds, c.root, err)
		}
	}
	d := &data.Dataset{Dim: 1, NumClasses: 2, Features: make([]float32, 100), Labels: make([]uint8, 100)}
	for i := range d.Labels {
		d.Features[i], d.Labels[i] = float32(i), uint8(i%2)
	}
	for _, ds := range []*pb.PoolDataset{
		{First: 90, Count: 20},
		{First: -1},
		{First: 100},
		{Count: 10, Sha256: strings.Repeat("0", 64)},
	} {
		if _, err := sliceDataset(d, ds); !errors.Is(err, ErrData) {
			t.Errorf("slice %v: %v, want ErrData", ds, err)
		}
	}
	s, err := sliceDataset(d, &pb.PoolDataset{First: 5, Count: 10})
	if err != nil || s.Len() != 10 || s.Features[0] != 5 {
		t.Fatalf("slice: %v", err)
	}
	if _, err := sliceDataset(d, &pb.PoolDataset{First: 5, Count: 10, Sha256: s.Digest()}); err != nil {
		t.Fatalf("matching digest refused: %v", err)
	}
	if s, err := sliceDataset(d, &pb.PoolDataset{First: 95}); err != nil || s.Len() != 5 {
		t.Fatalf("count 0 takes the rest: %v", err)
	}
}

func TestConfigErrorsSayWhatToDo(t *testing.T) {
	_, err := New(Config{Server: "h:7070", WorkDir: t.TempDir()})
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "fleetlearn token mint") || !strings.Contains(err.Error(), "--role pool-worker") {
		t.Fatalf("no token: %v", err)
	}
	if _, err := New(Config{Server: "h:7070", Token: "t", Insecure: true, CAPEM: []byte("x"), WorkDir: t.TempDir()}); !errors.Is(err, ErrConfig) {
		t.Fatalf("CA and insecure: %v", err)
	}
	if _, err := New(Config{Token: "t", WorkDir: t.TempDir()}); !errors.Is(err, ErrConfig) {
		t.Fatalf("no server: %v", err)
	}
}

func TestRankExitCode(t *testing.T) {
	if RankExitCode(nil) != RankExitCompleted || RankExitCode(ErrRankStopped) != RankExitStopped || RankExitCode(ErrData) != RankExitFailed {
		t.Fatal("exit codes")
	}
}

// A job's batch size and learning rate reach AdamW as they reach SGD; the
// rest of AdamW's settings are package lm's defaults.
func TestLMHyperFromJob(t *testing.T) {
	h := lmHyper(&pb.PoolBuiltinTrainer{BatchSize: 24, LearningRate: 3e-4})
	want := lm.Defaults
	want.BatchSize, want.LearningRate = 24, 3e-4
	if h != want {
		t.Fatalf("lm hyper %+v, want %+v", h, want)
	}
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
}
