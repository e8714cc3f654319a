package coord

import (
	"testing"

	"github.com/nats-io/nats.go"
)

// TestParseNotice: the server's own headers, appended after the
// publisher's, are the ones read.
func TestParseNotice(t *testing.T) {
	h := nats.Header{}
	// What a device set on its message.
	h.Add("Nats-Sequence", "1")
	h.Add("Nats-Msg-Size", "1")
	h.Add("Nats-Msg-Id", "r/abc/3")
	// What nats-server appended.
	h.Add("Nats-Sequence", "77")
	h.Add("Nats-Msg-Size", "1048576")
	n, err := parseNotice("fl.chunk.t.1.d", h)
	if err != nil {
		t.Fatal(err)
	}
	if n.seq != 77 || n.Size < 1048576 || !n.Chunk || n.Set != "abc" {
		t.Errorf("notice %+v, want sequence 77, at least 1 MiB, a chunk of set abc", n)
	}
	if _, err := parseNotice("fl.report.t.1.d", nats.Header{"Nats-Msg-Size": {"12"}}); err == nil {
		t.Error("a notice without a sequence was read")
	}
	if _, err := parseNotice("fl.report.t.1.d", nats.Header{"Nats-Sequence": {"3"}, "Nats-Msg-Size": {"-1"}}); err == nil {
		t.Error("a notice with a negative size was read")
	}
}

// TestPurgeWaitsForTheRead: while a device's report is read (twice), purges
// of its messages wait, so that a device cannot flood its quota, or start
// another attempt, between the passes and leave the sum with part of its
// update; other devices' purges do not wait.
func TestPurgeWaitsForTheRead(t *testing.T) {
	tr := &taskRun{}
	var ran []string
	tr.startReading("mallory")
	tr.afterRead("mallory", func() { ran = append(ran, "mallory") })
	tr.afterRead("other", func() { ran = append(ran, "other") })
	if len(ran) != 1 || ran[0] != "other" {
		t.Fatalf("during the read: ran %v, want only other's purge", ran)
	}
	tr.stopReading("mallory")
	if len(ran) != 2 || ran[1] != "mallory" {
		t.Fatalf("after the read: ran %v, want mallory's purge too", ran)
	}
	tr.afterRead("mallory", func() { ran = append(ran, "mallory again") })
	if len(ran) != 3 {
		t.Fatalf("no read in progress: ran %v, want the purge at once", ran)
	}
}
