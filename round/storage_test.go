package round_test

import (
	"testing"

	"github.com/fleetlearn/fleetlearn/round"
)

// TestStorageCharge walks one device's stored messages through the quota:
// an honest chunked report and its retry with other bytes, orphan chunks
// after the manifest, and a flood (server TestHostileChunkFlood end to end).
func TestStorageCharge(t *testing.T) {
	const quota = 100
	chunk := func(set string, size uint64) round.Stored { return round.Stored{Chunk: true, Size: size, Set: set} }
	steps := []struct {
		name string
		n    round.Stored
		want round.StoreAction
	}{
		{"first chunk of attempt a", chunk("a", 30), round.Keep},
		{"second chunk of a", chunk("a", 30), round.Keep},
		{"attempt b replaces a", chunk("b", 30), round.PurgeEarlier},
		{"b again", chunk("b", 30), round.Keep},
		{"b third", chunk("b", 30), round.Keep},
		{"manifest", round.Stored{Size: 5}, round.Keep},
		{"orphan chunk after the manifest", chunk("c", 50), round.DeleteMsg},
		{"a second report message goes over", round.Stored{Size: 10}, round.OverQuota},
	}
	var d round.Storage
	for _, s := range steps {
		if got := d.Charge(s.n, quota, true); got != s.want {
			t.Fatalf("%s: action %d, want %d (state %+v)", s.name, got, s.want, d)
		}
	}
	if !d.Over() {
		t.Fatal("not over after going over")
	}
	// Over the quota, what it stores is purged once per RepurgeBytes.
	purges := 0
	for range 10 {
		if d.Charge(chunk("x", round.RepurgeBytes/4), quota, true) == round.Repurge {
			purges++
		}
	}
	if purges != 2 {
		t.Errorf("%d purges for 2.5 × RepurgeBytes stored over the quota, want 2", purges)
	}

	// A flood of one set goes over on the chunk that passes the quota.
	var f round.Storage
	for i := range 4 {
		want := round.Keep
		if i == 3 {
			want = round.OverQuota
		}
		if got := f.Charge(chunk("s", 30), quota, true); got != want {
			t.Fatalf("flood chunk %d: action %d, want %d", i, got, want)
		}
	}
	// Many tiny messages are purged every RepurgeMsgs.
	purges = 0
	for range 3 * round.RepurgeMsgs {
		if f.Charge(chunk("s", 1), quota, true) == round.Repurge {
			purges++
		}
	}
	if purges != 3 {
		t.Errorf("%d purges for %d tiny messages over the quota, want 3", purges, 3*round.RepurgeMsgs)
	}

	// Chunks of a device without a seat are purged unread and uncharged;
	// its report messages are charged (they are refused when read).
	var u round.Storage
	for range 10 {
		if got := u.Charge(chunk("s", 60), quota, false); got != round.PurgeUnseated {
			t.Fatalf("unseated chunk: action %d", got)
		}
	}
	if u.Over() {
		t.Error("purged chunks were charged")
	}
	if got := u.Charge(round.Stored{Size: 101}, quota, false); got != round.OverQuota {
		t.Errorf("unseated report over the quota: action %d", got)
	}
	var nilStorage *round.Storage
	if nilStorage.Over() {
		t.Error("no storage is over")
	}
}
