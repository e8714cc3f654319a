package wire_test

import (
	"slices"
	"testing"

	"github.com/fleetlearn/fleetlearn/proto/wire"
)

func TestChunkSubject(t *testing.T) {
	subj := wire.ChunkSubject("t", 3, "dev-1")
	task, round, device, err := wire.ParseChunkSubject(subj)
	if err != nil || task != "t" || round != 3 || device != "dev-1" || !wire.IsChunkSubject(subj) {
		t.Fatalf("%s: %s %d %s %v", subj, task, round, device, err)
	}
	if wire.ChunkFilter("t", 3) != "fl.chunk.t.3.*" || !slices.Contains(wire.StreamSubjects, "fl.chunk.>") {
		t.Fatal("chunks are not in the round's filter or the stream")
	}
	// Chunks are not reports: the round's consumer never sees them.
	if _, _, _, err := wire.ParseReportSubject(subj); err == nil {
		t.Fatal("a chunk subject parsed as a report subject")
	}
	for _, bad := range []string{"fl.chunk.t.3", "fl.chunk.t.03.d", "fl.chunk.t.3.d.x", wire.ReportSubject("t", 3, "d")} {
		if _, _, _, err := wire.ParseChunkSubject(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if a, b := wire.ChunkMsgID("update/t/3/d", "ab", 0), wire.ChunkMsgID("update/t/3/d", "ab", 1); a == b {
		t.Fatal("chunks share a msg id")
	}
}
