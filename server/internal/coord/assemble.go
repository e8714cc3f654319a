package coord

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
	"io"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// chunkReader reads one stored message of the reports stream by sequence:
// its subject and data, or jetstream.ErrMsgNotFound. A device chooses the
// sequences, so it may name any message of the stream.
type chunkReader func(seq uint64) (subject string, data []byte, err error)

// chunkStream reads a chunked report's chunks in order, checking each as
// it comes and, after the last, the whole report's sha256: a consumer sees
// the report's bytes without the server ever holding them all.
type chunkStream struct {
	man         pb.ReportManifest
	subj        string
	device      string
	round       uint64
	read        chunkReader
	total, size uint64
	i           int
	h           hash.Hash // nil: the report was checked in an earlier read
}

// openChunks decodes and checks a chunked report's manifest: the chunks
// must all be on device's chunk subject for task's round, and the report at
// most limit bytes.
func openChunks(manifest []byte, limit uint64, task string, round uint64, device string, read chunkReader) (*chunkStream, error) {
	c := &chunkStream{subj: wire.ChunkSubject(task, round, device), device: device, round: round, read: read, h: sha256.New()}
	man := &c.man
	if err := proto.Unmarshal(manifest, man); err != nil {
		return nil, refuse("chunked report: decode manifest: %v", err)
	}
	total, size, count := man.TotalSize, man.ChunkSize, uint64(man.Count)
	switch {
	case total == 0 || total > limit:
		return nil, refuse("chunked report: %d bytes, this round admits 1-%d", total, limit)
	case count == 0 || count > wire.MaxReportChunks:
		return nil, refuse("chunked report: %d chunks, at most %d", count, wire.MaxReportChunks)
	case uint64(len(man.Sequences)) != count:
		return nil, refuse("chunked report: %d sequences for %d chunks", len(man.Sequences), count)
	case size == 0 || size > wire.MaxMessageBytes || count > 1 && size < wire.MinChunkBytes:
		return nil, refuse("chunked report: chunk size %d not in [%d, %d]", size, wire.MinChunkBytes, wire.MaxMessageBytes)
	case (total+size-1)/size != count:
		return nil, refuse("chunked report: %d bytes in chunks of %d are not %d chunks", total, size, count)
	}
	if err := wire.CheckSHA256("chunked report", man.PayloadSha256); err != nil {
		return nil, refuse("%v", err)
	}
	c.total, c.size = total, size
	return c, nil
}

// next returns the next chunk's bytes, checked, and io.EOF after the last
// once the report's sha256 matches the manifest's.
func (c *chunkStream) next() ([]byte, error) {
	man := &c.man
	if c.i == len(man.Sequences) {
		if c.h == nil {
			return nil, io.EOF
		}
		if got := hex.EncodeToString(c.h.Sum(nil)); got != man.PayloadSha256 {
			return nil, refuse("chunked report: reassembled sha256 %s does not match the manifest's %s", got, man.PayloadSha256)
		}
		return nil, io.EOF
	}
	i, seq := c.i, man.Sequences[c.i]
	rawSubj, raw, err := c.read(seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, refuse("chunked report: chunk %d (stream sequence %d) is missing", i, seq)
	case err != nil:
		return nil, refuse("chunked report: chunk %d (stream sequence %d): %v", i, seq, err)
	case rawSubj != c.subj:
		// The subject, which only the device may publish on, binds a
		// chunk to its device and round; a sequence naming another's
		// message gets nothing of it.
		return nil, refuse("chunked report: stream sequence %d is not a chunk of device %q for round %d", seq, c.device, c.round)
	}
	var ch pb.ReportChunk
	if err := proto.Unmarshal(raw, &ch); err != nil {
		return nil, refuse("chunked report: decode chunk %d: %v", i, err)
	}
	off := uint64(i) * c.size
	want := min(c.size, c.total-off)
	switch {
	case ch.Index != uint32(i) || ch.Count != man.Count || ch.TotalSize != c.total || ch.PayloadSha256 != man.PayloadSha256:
		return nil, refuse("chunked report: sequence %d holds chunk %d/%d of a %d-byte report %q, manifest wants chunk %d/%d of %d bytes %q",
			seq, ch.Index, ch.Count, ch.TotalSize, ch.PayloadSha256, i, man.Count, c.total, man.PayloadSha256)
	case uint64(len(ch.Data)) != want:
		return nil, refuse("chunked report: chunk %d has %d bytes, want %d", i, len(ch.Data), want)
	}
	if c.h != nil {
		c.h.Write(ch.Data)
	}
	c.i++
	return ch.Data, nil
}

// assembleReport reads a chunked report whole (openChunks and next hold
// every check), for the reports that stay small: evaluation reports and
// masked updates. It holds no I/O but read, so that it can be fuzzed.
//
// The report is returned in buf's storage, grown as needed, so that the
// server reuses one buffer round after round; a refusal returns buf's
// storage with no bytes.
func assembleReport(manifest []byte, limit uint64, task string, round uint64, device string, read chunkReader, buf []byte) ([]byte, error) {
	c, err := openChunks(manifest, limit, task, round, device, read)
	if err != nil {
		return buf[:0], err
	}
	buf = slices.Grow(buf[:0], int(c.total))
	for {
		b, err := c.next()
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf[:0], err
		}
		buf = append(buf, b...)
	}
}
