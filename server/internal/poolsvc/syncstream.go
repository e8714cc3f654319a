package poolsvc

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"os"
	"path/filepath"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/aggregator"
	"github.com/fleetlearn/fleetlearn/aggregator/quant"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// Streamed synchronisation (docs/POOL.md, Averaging). A rank's Average and
// an island's OuterSync arrive as a stream: a start naming the contribution
// and its length, then chunks in order. The server never holds a whole
// contribution in memory. It reads each one twice, as the federated intake
// reads a report (aggregator.Check, then aggregator.Part): the first pass,
// as the chunks arrive, decodes and checks the values (finite, exactly the
// model's count, their norm), hashes the bytes and appends them to a spool
// file; only a contribution that passed all of it joins its step. When the
// step closes, the second pass reads the spools back in rank (island)
// order into one float64 sum, so the result is aggregator.WeightedMean's
// over the whole vectors to the bit, whatever order the ranks arrived in,
// and a contribution refused at its last byte has touched nothing.
//
// Memory per open step: one chunk and one decoded batch per stream being
// read, then the float64 sum (8 bytes a parameter) while the step closes,
// and its float32 result (4 bytes a parameter) until the next step. Disk:
// the step's spools, the contributions' bytes, deleted once it closes.

// Bounds of a streamed vector.
const (
	// MaxSyncChunkBytes bounds one chunk's data.
	MaxSyncChunkBytes = wire.MaxSyncChunkBytes
	// MaxSyncParams is the absolute ceiling on the values of one streamed
	// vector, 2^30: 4 GiB of float32. A job's own bound is lower: its
	// model's parameter count, or for a command job its ranks' share of
	// the checkpoint cap.
	MaxSyncParams = wire.MaxSyncParams
	// spoolDirName, under the checkpoint directory, holds contributions
	// between their intake and their step's close. Job ids are
	// [a-z0-9-], so no job's directory can take the name.
	spoolDirName = ".sync-spool"
)

func (s *Service) spoolDir() string { return filepath.Join(s.d.CheckpointDir, spoolDirName) }

// clearSpools removes what a previous run left mid-step: its open steps
// died with it.
func (s *Service) clearSpools() error {
	if err := os.RemoveAll(s.spoolDir()); err != nil {
		return fmt.Errorf("poolsvc: start: clearing the sync spool: %w", err)
	}
	return nil
}

// maxCallsPerRank bounds a rank's open Average or OuterSync calls: the one
// streaming its bytes in, and those waiting for their step (a retry whose
// first call the worker gave up on may still be waiting).
const maxCallsPerRank = 4

// rankStreams are one rank's open calls.
type rankStreams struct {
	open   int
	intake bool // one of them is streaming its bytes in
}

// openStream takes a rank's intake slot, on the loop. A second
// concurrent intake is refused with UNAVAILABLE, which the worker retries
// with back-off: the refused one may be a retry racing the server's
// notice that the first call's connection dropped.
func (s *Service) openStream(op string, key rankAttempt) error {
	rs := s.streams[key]
	if rs == nil {
		rs = &rankStreams{}
		s.streams[key] = rs
	}
	switch {
	case rs.intake:
		return errorf(codes.Unavailable, "%s: rank %d of job %s attempt %d is already streaming a contribution; one at a time: retry once it has ended",
			op, key.rank, key.job, key.attempt)
	case rs.open >= maxCallsPerRank:
		return errorf(codes.Unavailable, "%s: rank %d of job %s attempt %d has %d calls open, the most it may; retry once one has ended",
			op, key.rank, key.job, key.attempt, rs.open)
	}
	rs.open++
	rs.intake = true
	return nil
}

// intakeDone frees a rank's intake slot, on the loop; its call may still
// wait for its step.
func (s *Service) intakeDone(key rankAttempt) {
	if rs := s.streams[key]; rs != nil {
		rs.intake = false
	}
}

// closeStream ends a rank's call: its intake slot if it still held it,
// and its place among the rank's open calls. It fails only once the loop
// has stopped, and the slots with it.
func (s *Service) closeStream(key rankAttempt) {
	_ = s.do(context.Background(), func() error {
		if rs := s.streams[key]; rs != nil {
			rs.intake = false
			if rs.open--; rs.open <= 0 {
				delete(s.streams, key)
			}
		}
		return nil
	})
}

// maxFLQ8Bytes is the longest FLQ8 encoding of n values the streaming
// decoder takes: the smallest blocks, MinStreamBlock values each.
func maxFLQ8Bytes(n int64) int64 {
	return 13 + 4*((n+quant.MinStreamBlock-1)/quant.MinStreamBlock) + n
}

// valueDecoder decodes a streamed vector's bytes into values.
type valueDecoder interface {
	Write([]byte) error
	Close() error
}

func newValueDecoder(int8 bool, dim int, size int64, emit func([]float32) error) (valueDecoder, error) {
	if !int8 {
		if size != 4*int64(dim) {
			return nil, fmt.Errorf("%d bytes for %d float32 values", size, dim)
		}
		return wire.NewDenseDecoder(dim, emit), nil
	}
	return quant.NewDecoder(8, dim, uint64(size), emit)
}

// intakeSpec is what a contribution stream must carry.
type intakeSpec struct {
	op     string // the call and field, for messages: "average: params"
	size   int64  // the bytes announced at start
	dim    int    // the values they must hold
	int8   bool   // FLQ8, not float32
	weight float64
	// spool is the directory to keep the bytes in; "" only hashes them,
	// for a stream that can only be a retry of a contribution already
	// taken (or a late one): its bytes are compared, never used.
	spool string
}

// intake is the first pass over one contribution stream.
type intake struct {
	sp    intakeSpec
	got   int64
	h     hash.Hash
	dec   valueDecoder
	check *aggregator.Check
	f     *os.File
	path  string
	kept  bool
}

// contributionSum is what identifies a contribution for retries: the
// SHA-256 of its weight's bits and its bytes. An intake computes it as
// the bytes stream past.
func newContributionHash(weight float64) hash.Hash {
	h := sha256.New()
	h.Write(binary.LittleEndian.AppendUint64(nil, math.Float64bits(weight)))
	return h
}

func newIntake(sp intakeSpec) (*intake, error) {
	in := &intake{sp: sp, h: newContributionHash(sp.weight)}
	if sp.spool == "" {
		return in, nil
	}
	check, err := aggregator.NewCheck(sp.dim, 0)
	if err != nil {
		return nil, invalidf("%s: %v", sp.op, err)
	}
	dec, err := newValueDecoder(sp.int8, sp.dim, sp.size, check.Write)
	if err != nil {
		return nil, in.refuse(err)
	}
	if err := os.MkdirAll(sp.spool, 0o700); err != nil {
		return nil, errorf(codes.Internal, "%s: the server cannot spool the contribution: %v", sp.op, err)
	}
	f, err := os.CreateTemp(sp.spool, "contribution-*")
	if err != nil {
		return nil, errorf(codes.Internal, "%s: the server cannot spool the contribution: %v", sp.op, err)
	}
	in.check, in.dec, in.f, in.path = check, dec, f, f.Name()
	return in, nil
}

// refuse turns a decoding or checking error into the caller's refusal.
func (in *intake) refuse(err error) error {
	if in.sp.int8 {
		return invalidf("%s: the job sends int8 (FLQ8) pseudo-gradients of %d values: %v; nothing of this contribution counts", in.sp.op, in.sp.dim, err)
	}
	return invalidf("%s: %v; send exactly %d finite float32 values; nothing of this contribution counts", in.sp.op, err, in.sp.dim)
}

// write takes the next chunk: it must start where the last one ended and
// stay within the announced size.
func (in *intake) write(c *pb.SyncChunk) error {
	d := c.GetData()
	switch {
	case c.GetOffset() != in.got:
		return invalidf("%s: chunk at byte %d, but %d bytes came before it: send each chunk once, in order", in.sp.op, c.GetOffset(), in.got)
	case len(d) == 0:
		return invalidf("%s: empty chunk at byte %d: every chunk carries bytes", in.sp.op, in.got)
	case len(d) > MaxSyncChunkBytes:
		return invalidf("%s: chunk of %d bytes, at most %d", in.sp.op, len(d), MaxSyncChunkBytes)
	case int64(len(d)) > in.sp.size-in.got:
		return invalidf("%s: %d bytes past the %d announced at start (too many values); nothing of this contribution counts",
			in.sp.op, in.got+int64(len(d))-in.sp.size, in.sp.size)
	}
	in.h.Write(d)
	in.got += int64(len(d))
	if in.dec == nil {
		return nil
	}
	if err := in.dec.Write(d); err != nil {
		return in.refuse(err)
	}
	if _, err := in.f.Write(d); err != nil {
		return errorf(codes.Internal, "%s: the server could not spool the contribution: %v", in.sp.op, err)
	}
	return nil
}

// finish checks the whole contribution once its sender closed the stream:
// every announced byte, every value. It returns the contribution's digest
// and, for a spooled one, its L2 norm.
func (in *intake) finish() (sum [32]byte, norm float64, err error) {
	if in.got != in.sp.size {
		return sum, 0, invalidf("%s: the stream ended after %d of the %d bytes announced (too few values); nothing of this contribution counts",
			in.sp.op, in.got, in.sp.size)
	}
	copy(sum[:], in.h.Sum(nil))
	if in.dec == nil {
		return sum, 0, nil
	}
	if err := in.dec.Close(); err != nil {
		return sum, 0, in.refuse(err)
	}
	if err := in.check.Close(); err != nil {
		return sum, 0, in.refuse(err)
	}
	f := in.f
	in.f = nil
	if err := f.Close(); err != nil {
		return sum, 0, errorf(codes.Internal, "%s: the server could not spool the contribution: %v", in.sp.op, err)
	}
	return sum, in.check.Norm(), nil
}

// keep hands the spool file over to the step that took the contribution.
func (in *intake) keep() { in.kept = true }

// discard deletes the spool of a contribution that did not join a step.
func (in *intake) discard() {
	if in.f != nil {
		in.f.Close()
		in.f = nil
	}
	if in.path != "" && !in.kept {
		os.Remove(in.path)
	}
}

// receive runs the first pass over a stream's chunks until its sender
// closes its side, adding each message's wire size to *n.
func receive(in *intake, next func() (*pb.SyncChunk, int, error), n *int64) error {
	for i := 1; ; i++ {
		c, size, err := next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return streamErr(in.sp.op, err)
		}
		*n += int64(size)
		if c == nil {
			return invalidf("%s: message %d of the stream is not a chunk: start comes once, first", in.sp.op, i)
		}
		if err := in.write(c); err != nil {
			return err
		}
	}
}

// streamErr is a receive's error as the call's status.
func streamErr(op string, err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	return errorf(codes.Canceled, "%s: %v", op, err)
}

// spooled is a checked contribution on disk.
type spooled struct {
	path string
	size int64
	// sum is the digest of the claimed weight and the bytes, checked
	// again when the spool is read back.
	sum    [32]byte
	weight float64
}

func removeSpools(ps []spooled) {
	for _, p := range ps {
		if p.path != "" {
			os.Remove(p.path)
		}
	}
}

// errStopped ends a fold at shutdown.
var errStopped = errors.New("the server is shutting down")

// foldSpools is the second pass: it reads the contributions back in the
// order given and returns their weighted mean under weights. An
// aggregator.Accumulator fed in parts, as aggregator.WeightedMean feeds one
// whole vectors: the same float64 sums, the same result to the bit. A
// spool whose bytes no longer hash to what the first pass took fails the
// fold rather than add something unchecked.
func foldSpools(dim int, int8 bool, ps []spooled, weights []float64, stop <-chan struct{}) ([]float32, error) {
	acc, err := aggregator.NewAccumulator(dim, 0)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, wire.SyncChunkBytes)
	for i, sp := range ps {
		if err := foldOne(acc, dim, int8, sp, weights[i], buf, stop); err != nil {
			return nil, fmt.Errorf("contribution %d: %w", i, err)
		}
	}
	return acc.Mean()
}

func foldOne(acc *aggregator.Accumulator, dim int, int8 bool, sp spooled, weight float64, buf []byte, stop <-chan struct{}) error {
	part, err := acc.Begin(weight)
	if err != nil {
		return err
	}
	dec, err := newValueDecoder(int8, dim, sp.size, part.Write)
	if err != nil {
		return err
	}
	f, err := os.Open(sp.path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := newContributionHash(sp.weight)
	for {
		select {
		case <-stop:
			return errStopped
		default:
		}
		n, err := f.Read(buf)
		if n > 0 {
			h.Write(buf[:n])
			if err := dec.Write(buf[:n]); err != nil {
				return err
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	if [32]byte(h.Sum(nil)) != sp.sum {
		return errors.New("its spool changed on disk since it was checked")
	}
	if err := dec.Close(); err != nil {
		return err
	}
	return part.Close()
}
