package coord

import (
	"testing"

	"github.com/nats-io/nats.go"
)

// TestDeviceStoreCharge walks one device's stored messages through the
// quota: an honest chunked report and its retry with other bytes, orphan
// chunks after the manifest, and a flood.
func TestDeviceStoreCharge(t *testing.T) {
	const quota = 100
	chunk := func(set string, size uint64) notice { return notice{chunk: true, size: size, set: set} }
	steps := []struct {
		name string
		n    notice
		want quotaAction
	}{
		{"first chunk of attempt a", chunk("a", 30), keep},
		{"second chunk of a", chunk("a", 30), keep},
		{"attempt b replaces a", chunk("b", 30), purgeEarlier},
		{"b again", chunk("b", 30), keep},
		{"b third", chunk("b", 30), keep},
		{"manifest", notice{size: 5}, keep},
		{"orphan chunk after the manifest", chunk("c", 50), deleteMsg},
		{"a second report message goes over", notice{size: 10}, overQuota},
	}
	var d deviceStore
	for _, s := range steps {
		if got := d.charge(s.n, quota); got != s.want {
			t.Fatalf("%s: action %d, want %d (state %+v)", s.name, got, s.want, d)
		}
	}
	// Over the quota, what it stores is purged once per repurgeBytes.
	purges := 0
	for range 10 {
		if d.charge(chunk("x", repurgeBytes/4), quota) == repurge {
			purges++
		}
	}
	if purges != 2 {
		t.Errorf("%d purges for 2.5 × repurgeBytes stored over the quota, want 2", purges)
	}

	// A flood of one set goes over on the chunk that passes the quota.
	var f deviceStore
	for i := range 4 {
		want := keep
		if i == 3 {
			want = overQuota
		}
		if got := f.charge(chunk("s", 30), quota); got != want {
			t.Fatalf("flood chunk %d: action %d, want %d", i, got, want)
		}
	}
	// Many tiny messages are purged every repurgeMsgs.
	purges = 0
	for range 3 * repurgeMsgs {
		if f.charge(chunk("s", 1), quota) == repurge {
			purges++
		}
	}
	if purges != 3 {
		t.Errorf("%d purges for %d tiny messages over the quota, want 3", purges, 3*repurgeMsgs)
	}
}

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
	if n.seq != 77 || n.size < 1048576 || !n.chunk || n.set != "abc" {
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
	tr.stopReading()
	if len(ran) != 2 || ran[1] != "mallory" {
		t.Fatalf("after the read: ran %v, want mallory's purge too", ran)
	}
	tr.afterRead("mallory", func() { ran = append(ran, "mallory again") })
	if len(ran) != 3 {
		t.Fatalf("no read in progress: ran %v, want the purge at once", ran)
	}
}
