package audit

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/audit/internal/testvectors"
)

func TestQuery(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		lg, _, _ := openTest(t)
		var all []Event
		for i := range 90 {
			e, err := lg.Append(ctx, sampleEvent(t, i))
			if err != nil {
				t.Fatal(err)
			}
			ev, err := e.Event()
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, ev)
		}
		mid := all[40].Time
		filters := []string{
			"",
			"type=round.closed",
			"task=t-1",
			"task=t-2 round=3",
			"round=2",
			"actor=op-1",
			"actor=operator:op-0",
			"actor=service:coordinator type=dp.spent",
			"actor=device:" + all[5].Actor.ID,
			"since=" + mid.Format(time.RFC3339Nano),
			"until=" + mid.Format(time.RFC3339Nano),
			"since=" + all[10].Time.Format(time.RFC3339Nano) + " until=" + all[20].Time.Format(time.RFC3339Nano) + " type=round.opened",
			"type=model.committed task=t-2",
			`task="t-1"`,
		}
		for _, s := range filters {
			f, err := ParseFilter(s)
			if err != nil {
				t.Fatalf("%q: %v", s, err)
			}
			var want []uint64
			for i, ev := range all {
				if f.Match(ev) {
					want = append(want, uint64(i))
				}
			}
			var got []uint64
			token := ""
			for pages := 0; ; pages++ {
				page, err := lg.Query(ctx, f, 7, token)
				if err != nil {
					t.Fatal(err)
				}
				if len(page.Entries) > 7 || pages > 100 {
					t.Fatalf("%q: page of %d", s, len(page.Entries))
				}
				for _, e := range page.Entries {
					ev, err := VerifyEntry(e, lg.PublicKeys().Entry)
					if err != nil || !f.Match(ev) {
						t.Fatalf("%q: entry %d does not match: %v", s, e.Index, err)
					}
					got = append(got, e.Index)
				}
				if page.Next == "" {
					break
				}
				token = page.Next
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%q: got %v\nwant %v", s, got, want)
			}
			if s != "" && len(want) == 0 {
				t.Errorf("%q matches nothing: a weak test", s)
			}
		}
		if _, err := lg.Query(ctx, Filter{}, 5, "x"); !errors.Is(err, ErrInvalidFilter) {
			t.Errorf("bad token: %v", err)
		}
		if _, err := lg.Query(ctx, Filter{}, 5, "007"); !errors.Is(err, ErrInvalidFilter) {
			t.Errorf("non-canonical token: %v", err)
		}
		page, err := lg.Query(ctx, Filter{}, 0, "")
		if err != nil || len(page.Entries) != 90 || page.Next != "" {
			t.Fatalf("default page: %d entries, next %q, %v", len(page.Entries), page.Next, err)
		}
		page, err = lg.Query(ctx, Filter{}, 5000, "85")
		if err != nil || len(page.Entries) != 5 || page.Entries[0].Index != 85 {
			t.Fatalf("page from a token: %v", err)
		}
	})
}

func TestParseFilter(t *testing.T) {
	day := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want Filter
	}{
		{"", Filter{}},
		{"  type=round.closed   task=t-1 ", Filter{Type: TypeRoundClosed, Task: "t-1"}},
		{"since=2026-01-01T00:00:00Z until=2026-02-01", Filter{Since: day, Until: day.AddDate(0, 1, 0)}},
		{"since=2026-01-01T01:00:00+01:00", Filter{Since: day}},
		{"round=12 actor=alice", Filter{Round: 12, Actor: "alice"}},
		{"actor=service:aggregator", Filter{ActorKind: ActorService, Actor: "aggregator"}},
		{"actor=svc:aggregator", Filter{Actor: "svc:aggregator"}},
		{`task="a b \"c\" \\"`, Filter{Task: `a b "c" \`}},
		{"actor=operator:a=b", Filter{ActorKind: ActorOperator, Actor: "a=b"}},
	} {
		got, err := ParseFilter(tc.in)
		if err != nil || !filtersEqual(got, tc.want) {
			t.Errorf("ParseFilter(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			continue
		}
		back, err := ParseFilter(got.String())
		if err != nil || !filtersEqual(back, got) {
			t.Errorf("round trip of %q via %q: %+v, %v", tc.in, got.String(), back, err)
		}
	}
	for _, bad := range []string{
		"type", "type=", "=x", "type=Round", "type=round", "round=0", "round=-1", "round=01", "round=x",
		"since=yesterday", "since=0000-01-01", "since=2026-02-01 until=2026-01-01", "since=2026-01-01 until=2026-01-01",
		"task=a task=b", "colour=red", `task="open`, `task="a"b`, `task=a"b`, `task="\n"`, "task=\x01",
		"actor=operator:", "actor=", "task=\xff", string(make([]byte, MaxFilterBytes+1)),
	} {
		if f, err := ParseFilter(bad); !errors.Is(err, ErrInvalidFilter) && !errors.Is(err, ErrTooLarge) {
			t.Errorf("ParseFilter(%q) = %+v, %v; want an error", bad, f, err)
		}
	}
}

func filtersEqual(a, b Filter) bool {
	return a.Since.Equal(b.Since) && a.Until.Equal(b.Until) && a.Task == b.Task && a.Round == b.Round &&
		a.Type == b.Type && a.ActorKind == b.ActorKind && a.Actor == b.Actor
}

// TestCheckpointVectors reads the real sum.golang.org checkpoint of the
// signed-note vectors as a checkpoint.
func TestCheckpointVectors(t *testing.T) {
	var v testvectors.SignedNotes
	testvectors.Load(t, "signed_note_vectors.json", &v)
	n := 0
	for _, o := range v.Open {
		if o.Checkpoint == nil {
			continue
		}
		n++
		cp, err := ParseCheckpoint([]byte(o.Note), o.VerifierKeys[0])
		if err != nil {
			t.Fatalf("%s: %v", o.Desc, err)
		}
		if cp.Origin != o.Checkpoint.Origin || cp.Size != o.Checkpoint.Size {
			t.Errorf("%s: got %q %d", o.Desc, cp.Origin, cp.Size)
		}
		bad := []byte(o.Note)
		bad[len(o.Checkpoint.Origin)+2] ^= 1 // a digit of the size
		if _, err := ParseCheckpoint(bad, o.VerifierKeys[0]); !errors.Is(err, ErrBadCheckpoint) {
			t.Errorf("%s: altered size accepted: %v", o.Desc, err)
		}
	}
	if n == 0 {
		t.Fatal("no checkpoint vectors")
	}
	for _, o := range v.Open {
		if o.Want != "ok" && len(o.VerifierKeys) > 0 {
			if _, err := ParseCheckpoint([]byte(o.Note), o.VerifierKeys[0]); !errors.Is(err, ErrBadCheckpoint) {
				t.Errorf("%s: %v", o.Desc, err)
			}
		}
	}
	if _, err := ParseCheckpoint(nil, "bad"); !errors.Is(err, ErrInvalidKeys) {
		t.Errorf("bad vkey: %v", err)
	}
}
