package coord

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

var writeCorpus = flag.Bool("write-corpus", false, "rewrite the seed corpus under testdata/fuzz/FuzzAssembleReport")

// The round every fuzzed report is for.
const (
	asmTask   = "t"
	asmRound  = 7
	asmDevice = "dev-1"
)

// Kinds of stored message in a fuzzed stream: the first byte of a record,
// modulo storedKinds.
const (
	storedOwn         = iota // the device's chunk subject of the round
	storedOtherDevice        // another device's chunk subject of the round
	storedOtherRound         // the device's chunk subject of another round
	storedReport             // the device's report subject of the round
	storedUnreadable         // a read that fails with something but not-found
	storedKinds
)

func storedSubject(kind byte) string {
	switch kind {
	case storedOtherDevice:
		return wire.ChunkSubject(asmTask, asmRound, "dev-2")
	case storedOtherRound:
		return wire.ChunkSubject(asmTask, asmRound+1, asmDevice)
	case storedReport:
		return wire.ReportSubject(asmTask, asmRound, asmDevice)
	}
	return wire.ChunkSubject(asmTask, asmRound, asmDevice)
}

type stored struct {
	kind byte
	data []byte
}

// encodeStream lays out a stream as the fuzzer sees it: for each message,
// its kind byte, its length as a uvarint and its data. Message i has stream
// sequence i+1.
func encodeStream(msgs []stored) []byte {
	var b []byte
	for _, m := range msgs {
		b = append(b, m.kind)
		b = binary.AppendUvarint(b, uint64(len(m.data)))
		b = append(b, m.data...)
	}
	return b
}

// decodeStream is encodeStream's inverse; a truncated last record keeps
// what is left.
func decodeStream(b []byte) []stored {
	var out []stored
	for len(b) > 0 {
		kind := b[0] % storedKinds
		n, k := binary.Uvarint(b[1:])
		if k <= 0 {
			break
		}
		b = b[1+k:]
		n = min(n, uint64(len(b)))
		out = append(out, stored{kind: kind, data: b[:n]})
		b = b[n:]
	}
	return out
}

// errUnreadable is the fuzzed stream's failed read.
var errUnreadable = errors.New("stream unavailable")

// streamReader reads msgs by sequence and records the subject of every
// message it returns.
func streamReader(msgs []stored, subjects *[]string) chunkReader {
	return func(seq uint64) (string, []byte, error) {
		if seq == 0 || seq > uint64(len(msgs)) {
			return "", nil, fmt.Errorf("get message %d: %w", seq, jetstream.ErrMsgNotFound)
		}
		m := msgs[seq-1]
		if m.kind == storedUnreadable {
			return "", nil, errUnreadable
		}
		s := storedSubject(m.kind)
		*subjects = append(*subjects, s)
		return s, m.data, nil
	}
}

// asmSeed is one named input of FuzzAssembleReport with the outcome its
// name promises: "" for an accepted report, else part of the refusal.
type asmSeed struct {
	name     string
	manifest []byte
	stream   []byte
	limit    uint32
	want     string
}

// honestReport is a report of n bytes cut into chunks of size bytes: its
// manifest and chunks, the chunks stored in order from sequence 1.
func honestReport(n, size int) (*pb.ReportManifest, []*pb.ReportChunk) {
	payload := bytes.Repeat([]byte("fleetlearn report "), n/18+1)[:n]
	sum := wire.SHA256(payload)
	count := (n + size - 1) / size
	man := &pb.ReportManifest{Count: uint32(count), TotalSize: uint64(n), ChunkSize: uint64(size), PayloadSha256: sum}
	var cs []*pb.ReportChunk
	for i := range count {
		cs = append(cs, &pb.ReportChunk{Index: uint32(i), Count: uint32(count), TotalSize: uint64(n), PayloadSha256: sum,
			Data: payload[i*size : min(n, (i+1)*size)]})
		man.Sequences = append(man.Sequences, uint64(i+1))
	}
	return man, cs
}

func mustMarshal(tb testing.TB, m proto.Message) []byte {
	tb.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// assembleSeeds are honest reports of one and of several chunks, and one
// of each refusal, each a small edit of an honest report.
func assembleSeeds(tb testing.TB) []asmSeed {
	const limit = 1 << 20
	// edit builds a seed from an honest two-chunk report (one chunk of
	// MinChunkBytes and a short last one) after edit changes it.
	edit := func(name, want string, f func(man *pb.ReportManifest, cs []*pb.ReportChunk, st *[]stored)) asmSeed {
		man, cs := honestReport(wire.MinChunkBytes+100, wire.MinChunkBytes)
		var st []stored
		apply := func() {
			st = st[:0]
			for _, c := range cs {
				st = append(st, stored{kind: storedOwn, data: mustMarshal(tb, c)})
			}
		}
		apply()
		f(man, cs, &st)
		return asmSeed{name: name, manifest: mustMarshal(tb, man), stream: encodeStream(st), limit: limit, want: want}
	}
	// rechunk stores the edited chunks again.
	rechunk := func(cs []*pb.ReportChunk, st *[]stored) {
		for i, c := range cs {
			(*st)[i] = stored{kind: storedOwn, data: mustMarshal(tb, c)}
		}
	}
	one, oneChunks := honestReport(300, 300)
	three, threeChunks := honestReport(2*wire.MinChunkBytes+1, wire.MinChunkBytes)
	var threeStream []stored
	// Three chunks stored out of order, among another device's chunk and a
	// report, as a stream shared by many devices holds them.
	threeStream = append(threeStream,
		stored{kind: storedOtherDevice, data: mustMarshal(tb, threeChunks[0])},
		stored{kind: storedOwn, data: mustMarshal(tb, threeChunks[2])},
		stored{kind: storedReport, data: []byte("report")},
		stored{kind: storedOwn, data: mustMarshal(tb, threeChunks[0])},
		stored{kind: storedOwn, data: mustMarshal(tb, threeChunks[1])},
	)
	three.Sequences = []uint64{4, 5, 2}
	seeds := []asmSeed{
		{name: "one-chunk", manifest: mustMarshal(tb, one), limit: limit,
			stream: encodeStream([]stored{{kind: storedOwn, data: mustMarshal(tb, oneChunks[0])}})},
		{name: "three-chunks", manifest: mustMarshal(tb, three), stream: encodeStream(threeStream), limit: limit},
		edit("two-chunks", "", func(*pb.ReportManifest, []*pb.ReportChunk, *[]stored) {}),
		{name: "bad-manifest", manifest: []byte{0x0a, 0xff}, limit: limit, want: "decode manifest"},
		edit("empty", "0 bytes, this round admits", func(man *pb.ReportManifest, _ []*pb.ReportChunk, _ *[]stored) { man.TotalSize = 0 }),
		edit("over-limit", "this round admits 1-16000", func(*pb.ReportManifest, []*pb.ReportChunk, *[]stored) {}),
		edit("no-chunks", "0 chunks, at most", func(man *pb.ReportManifest, _ []*pb.ReportChunk, _ *[]stored) { man.Count = 0 }),
		edit("too-many-chunks", "4097 chunks, at most 4096", func(man *pb.ReportManifest, _ []*pb.ReportChunk, _ *[]stored) {
			man.Count = wire.MaxReportChunks + 1
		}),
		edit("sequences", "3 sequences for 2 chunks", func(man *pb.ReportManifest, _ []*pb.ReportChunk, _ *[]stored) {
			man.Sequences = append(man.Sequences, 2)
		}),
		edit("tiny-chunks", "chunk size 100 not in", func(man *pb.ReportManifest, _ []*pb.ReportChunk, _ *[]stored) {
			man.ChunkSize, man.Count, man.TotalSize = 100, 2, 150
		}),
		edit("huge-chunk", "chunk size 8388609 not in", func(man *pb.ReportManifest, _ []*pb.ReportChunk, _ *[]stored) {
			man.ChunkSize = wire.MaxMessageBytes + 1
		}),
		edit("count-mismatch", "are not 3 chunks", func(man *pb.ReportManifest, _ []*pb.ReportChunk, _ *[]stored) {
			man.Count, man.Sequences = 3, []uint64{1, 2, 2}
		}),
		edit("bad-sha256", "is not 64 lowercase hex digits", func(man *pb.ReportManifest, _ []*pb.ReportChunk, _ *[]stored) {
			man.PayloadSha256 = strings.ToUpper(man.PayloadSha256)
		}),
		edit("missing", "chunk 1 (stream sequence 9) is missing", func(man *pb.ReportManifest, _ []*pb.ReportChunk, _ *[]stored) {
			man.Sequences[1] = 9
		}),
		edit("unreadable", "chunk 0 (stream sequence 1): stream unavailable", func(_ *pb.ReportManifest, _ []*pb.ReportChunk, st *[]stored) {
			(*st)[0].kind = storedUnreadable
		}),
		edit("other-device", "stream sequence 2 is not a chunk of device", func(_ *pb.ReportManifest, _ []*pb.ReportChunk, st *[]stored) {
			(*st)[1].kind = storedOtherDevice
		}),
		edit("other-round", "stream sequence 1 is not a chunk of device", func(_ *pb.ReportManifest, _ []*pb.ReportChunk, st *[]stored) {
			(*st)[0].kind = storedOtherRound
		}),
		edit("report-subject", "stream sequence 1 is not a chunk of device", func(_ *pb.ReportManifest, _ []*pb.ReportChunk, st *[]stored) {
			(*st)[0].kind = storedReport
		}),
		edit("bad-chunk", "decode chunk 1", func(_ *pb.ReportManifest, _ []*pb.ReportChunk, st *[]stored) {
			(*st)[1].data = []byte{0x22, 0x05, 'a'}
		}),
		edit("swapped", "manifest wants chunk 0/2", func(man *pb.ReportManifest, _ []*pb.ReportChunk, _ *[]stored) {
			man.Sequences = []uint64{2, 1}
		}),
		edit("same-chunk-twice", "manifest wants chunk 1/2", func(man *pb.ReportManifest, _ []*pb.ReportChunk, _ *[]stored) {
			man.Sequences = []uint64{1, 1}
		}),
		edit("other-report", "manifest wants chunk 1/2", func(_ *pb.ReportManifest, cs []*pb.ReportChunk, st *[]stored) {
			cs[1].PayloadSha256 = wire.SHA256([]byte("another report"))
			rechunk(cs, st)
		}),
		edit("short-chunk", "chunk 1 has 99 bytes, want 100", func(_ *pb.ReportManifest, cs []*pb.ReportChunk, st *[]stored) {
			cs[1].Data = cs[1].Data[:99]
			rechunk(cs, st)
		}),
		edit("long-chunk", "chunk 0 has 16385 bytes, want 16384", func(_ *pb.ReportManifest, cs []*pb.ReportChunk, st *[]stored) {
			cs[0].Data = append(append([]byte(nil), cs[0].Data...), 'x')
			rechunk(cs, st)
		}),
		edit("wrong-hash", "does not match the manifest's", func(_ *pb.ReportManifest, cs []*pb.ReportChunk, st *[]stored) {
			cs[1].Data = bytes.ToUpper(cs[1].Data)
			rechunk(cs, st)
		}),
	}
	for i := range seeds {
		switch seeds[i].name {
		case "over-limit":
			seeds[i].limit = 16000
			fallthrough
		case "empty", "no-chunks", "too-many-chunks", "sequences", "tiny-chunks", "huge-chunk", "count-mismatch", "bad-sha256":
			// Refused on the manifest alone: the stream would only
			// weigh on the corpus.
			seeds[i].stream = nil
		}
	}
	return seeds
}

// TestAssembleReportSeeds: each seed of FuzzAssembleReport has the outcome
// it is named for, so the corpus holds an honest report of one and of
// several chunks and every refusal.
func TestAssembleReportSeeds(t *testing.T) {
	seeds := assembleSeeds(t)
	if *writeCorpus {
		dir := filepath.Join("testdata", "fuzz", "FuzzAssembleReport")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, s := range seeds {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n[]byte(%q)\nuint32(%d)\n", s.manifest, s.stream, s.limit)
			if err := os.WriteFile(filepath.Join(dir, s.name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, s := range seeds {
		var subjects []string
		out, err := assembleReport(s.manifest, uint64(s.limit), asmTask, asmRound, asmDevice,
			streamReader(decodeStream(s.stream), &subjects), nil)
		switch {
		case s.want == "" && err != nil:
			t.Errorf("%s: refused: %v", s.name, err)
		case s.want == "" && len(out) == 0:
			t.Errorf("%s: accepted with no bytes", s.name)
		case s.want != "" && (err == nil || !strings.Contains(err.Error(), s.want)):
			t.Errorf("%s: got %v, want a refusal with %q", s.name, err, s.want)
		}
	}
}

// FuzzAssembleReport feeds a manifest and a stream of stored messages, each
// on the device's chunk subject or on another, to the server's chunked
// report checks. A report it accepts is at most the limit, hashes to the
// manifest's sha256 and is made only of chunks the device stored for the
// round, in the manifest's order; a refusal says so and returns no bytes.
//
// This package's test binary holds an embedded NATS server and SQLite, whose
// coverage makes each run slow; -fuzzminimizetime 100x keeps the workers
// fuzzing rather than minimizing for a minute per new input.
func FuzzAssembleReport(f *testing.F) {
	for _, s := range assembleSeeds(f) {
		f.Add(s.manifest, s.stream, s.limit)
	}
	f.Fuzz(func(t *testing.T, manifest, stream []byte, limit32 uint32) {
		// Bounded so that a fuzzed manifest cannot have the test allocate
		// more than a round of a small model would.
		limit := uint64(limit32) % (4 << 20)
		msgs := decodeStream(stream)
		var subjects []string
		// A reused buffer holding stale bytes: none may leak into a report.
		buf := bytes.Repeat([]byte{0xee}, 1000)
		out, err := assembleReport(manifest, limit, asmTask, asmRound, asmDevice, streamReader(msgs, &subjects), buf)
		if err != nil {
			if !errors.Is(err, ErrReport) || !strings.Contains(err.Error(), "chunked report") {
				t.Fatalf("refusal %q is not a chunked report's", err)
			}
			if len(out) != 0 {
				t.Fatalf("refusal returned %d bytes", len(out))
			}
			if len(subjects) > wire.MaxReportChunks {
				t.Fatalf("refused after reading %d chunks, at most %d", len(subjects), wire.MaxReportChunks)
			}
			return
		}
		var man pb.ReportManifest
		if err := proto.Unmarshal(manifest, &man); err != nil {
			t.Fatalf("accepted a manifest that does not decode: %v", err)
		}
		switch {
		case uint64(len(out)) > limit:
			t.Fatalf("accepted %d bytes, limit %d", len(out), limit)
		case uint64(len(out)) != man.TotalSize:
			t.Fatalf("accepted %d bytes, manifest says %d", len(out), man.TotalSize)
		case wire.SHA256(out) != man.PayloadSha256:
			t.Fatalf("accepted bytes hash to %s, manifest says %s", wire.SHA256(out), man.PayloadSha256)
		case len(subjects) != len(man.Sequences) || len(subjects) != int(man.Count):
			t.Fatalf("accepted after %d reads for %d sequences of %d chunks", len(subjects), len(man.Sequences), man.Count)
		}
		own := wire.ChunkSubject(asmTask, asmRound, asmDevice)
		var whole []byte
		for i, s := range subjects {
			if s != own {
				t.Fatalf("chunk %d read from %q, not the device's %q", i, s, own)
			}
			var c pb.ReportChunk
			if err := proto.Unmarshal(msgs[man.Sequences[i]-1].data, &c); err != nil || c.Index != uint32(i) {
				t.Fatalf("sequence %d is not chunk %d: %v", man.Sequences[i], i, err)
			}
			whole = append(whole, c.Data...)
		}
		if !bytes.Equal(whole, out) {
			t.Fatal("accepted report is not its chunks in the manifest's order")
		}
	})
}
