package coord

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
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

// assembleReport decodes a chunked report's manifest, reads the chunks it
// names with read and checks them and the whole report's sha256. The chunks
// must all be on device's chunk subject for task's round, and the report at
// most limit bytes. It holds every check of a chunked report but the
// message's header, and no I/O but read, so that it can be fuzzed.
//
// The report is returned in buf's storage, grown as needed, so that the
// server reuses one buffer round after round; a refusal returns buf's
// storage with no bytes.
func assembleReport(manifest []byte, limit uint64, task string, round uint64, device string, read chunkReader, buf []byte) ([]byte, error) {
	var man pb.ReportManifest
	if err := proto.Unmarshal(manifest, &man); err != nil {
		return buf[:0], refuse("chunked report: decode manifest: %v", err)
	}
	total, size, count := man.TotalSize, man.ChunkSize, uint64(man.Count)
	switch {
	case total == 0 || total > limit:
		return buf[:0], refuse("chunked report: %d bytes, this round admits 1-%d", total, limit)
	case count == 0 || count > wire.MaxReportChunks:
		return buf[:0], refuse("chunked report: %d chunks, at most %d", count, wire.MaxReportChunks)
	case uint64(len(man.Sequences)) != count:
		return buf[:0], refuse("chunked report: %d sequences for %d chunks", len(man.Sequences), count)
	case size == 0 || size > wire.MaxMessageBytes || count > 1 && size < wire.MinChunkBytes:
		return buf[:0], refuse("chunked report: chunk size %d not in [%d, %d]", size, wire.MinChunkBytes, wire.MaxMessageBytes)
	case (total+size-1)/size != count:
		return buf[:0], refuse("chunked report: %d bytes in chunks of %d are not %d chunks", total, size, count)
	}
	if err := wire.CheckSHA256("chunked report", man.PayloadSha256); err != nil {
		return buf[:0], refuse("%v", err)
	}
	subj := wire.ChunkSubject(task, round, device)
	buf = slices.Grow(buf[:0], int(total))[:total]
	h := sha256.New()
	for i, seq := range man.Sequences {
		rawSubj, raw, err := read(seq)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return buf[:0], refuse("chunked report: chunk %d (stream sequence %d) is missing", i, seq)
		case err != nil:
			return buf[:0], refuse("chunked report: chunk %d (stream sequence %d): %v", i, seq, err)
		case rawSubj != subj:
			// The subject, which only the device may publish on, binds a
			// chunk to its device and round; a sequence naming another's
			// message gets nothing of it.
			return buf[:0], refuse("chunked report: stream sequence %d is not a chunk of device %q for round %d", seq, device, round)
		}
		var c pb.ReportChunk
		if err := proto.Unmarshal(raw, &c); err != nil {
			return buf[:0], refuse("chunked report: decode chunk %d: %v", i, err)
		}
		off := uint64(i) * size
		want := min(size, total-off)
		switch {
		case c.Index != uint32(i) || c.Count != man.Count || c.TotalSize != total || c.PayloadSha256 != man.PayloadSha256:
			return buf[:0], refuse("chunked report: sequence %d holds chunk %d/%d of a %d-byte report %q, manifest wants chunk %d/%d of %d bytes %q",
				seq, c.Index, c.Count, c.TotalSize, c.PayloadSha256, i, count, total, man.PayloadSha256)
		case uint64(len(c.Data)) != want:
			return buf[:0], refuse("chunked report: chunk %d has %d bytes, want %d", i, len(c.Data), want)
		}
		copy(buf[off:], c.Data)
		h.Write(c.Data)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != man.PayloadSha256 {
		return buf[:0], refuse("chunked report: reassembled sha256 %s does not match the manifest's %s", got, man.PayloadSha256)
	}
	return buf, nil
}
