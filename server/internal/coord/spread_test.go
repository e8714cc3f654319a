package coord

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

func TestCheckInSpread(t *testing.T) {
	const pace = 2 * time.Second
	for _, c := range []struct {
		n    int
		rate float64
		want time.Duration
	}{
		{0, 1000, MinCheckInSpread},
		{1, 1000, MinCheckInSpread},
		{30, 1000, 30 * time.Millisecond},
		{100, 1000, 100 * time.Millisecond},
		{2000, 1000, pace},
		{1 << 40, 1000, pace},
		{100, 0, pace},
		{100, math.NaN(), pace},
		{100, 1e-300, pace},
	} {
		if got := checkInSpread(c.n, c.rate, pace); got != c.want {
			t.Errorf("checkInSpread(%d, %v, %v) = %v, want %v", c.n, c.rate, pace, got, c.want)
		}
	}
	// A pace window under the floor is the spread: it caps.
	if got := checkInSpread(0, 1000, time.Millisecond); got != time.Millisecond {
		t.Errorf("checkInSpread under a 1 ms pace window = %v", got)
	}
}

// A round's announcement spreads the woken devices' check-ins over the time
// the fleet seen recently takes at the check-in rate, capped by the pace
// window: selection of a small fleet does not wait out the pace window.
func TestAnnouncementSpreadFollowsFleet(t *testing.T) {
	h := newHarness(t)
	// Four devices checked in lately; three long ago no longer count. A
	// coordinator starting now counts the four before it hears from them.
	for i := range 7 {
		at := h.clk.Now().Add(-time.Minute)
		if i >= 4 {
			at = h.clk.Now().Add(-SeenWindow - time.Minute)
		}
		if err := h.st.SeeDevice(t.Context(), fmt.Sprintf("dev-%d", i), &pb.DeviceAttributes{}, at); err != nil {
			t.Fatal(err)
		}
	}
	h.c.Shutdown()
	h.deps.CheckInRate = 10 // check-ins per second: 100 ms per device
	h.restart()
	anns := make(chan *pb.RoundAnnouncement, 16)
	sub, err := h.nc.Subscribe(wire.SubjectAnnounce, func(m *nats.Msg) {
		var a pb.RoundAnnouncement
		if proto.Unmarshal(m.Data, &a) == nil {
			anns <- &a
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := h.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	task := h.start(h.baseTask(func(t *pb.Task) { t.RoundsTotal = 2 }))
	ev := h.watch(task.Id)
	a := <-anns
	if a.Round != 1 || a.GetCheckInSpread().AsDuration() != 400*time.Millisecond {
		t.Fatalf("round 1 announced %v, want a spread of 400ms (4 devices at 10/s)", a)
	}
	// Fifteen devices check in: 1.5 s at 10/s, capped by the 1 s pace window.
	var devs []*device
	for i := range 15 {
		devs = append(devs, h.enroll(fmt.Sprintf("dev-new-%d", i), 5))
	}
	for i, d := range devs {
		if i < 3 {
			d.update(d.join(), constant(8, 0.1), 5, nil)
		} else {
			d.checkIn()
		}
	}
	if got := h.next(ev); got.Type != pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED {
		t.Fatalf("round 1: %v", got)
	}
	a = <-anns
	if a.Round != 2 || a.GetCheckInSpread().AsDuration() != h.deps.PaceWindow {
		t.Fatalf("round 2 announced %v, want the pace window %v", a, h.deps.PaceWindow)
	}
}

// The fleet an announcement counts is the devices heard from within
// SeenWindow; a coordinator that could not count the store's devices at its
// start knows too little to shorten the spread until SeenWindow has passed.
func TestSeenFleet(t *testing.T) {
	h := newHarness(t)
	c := h.c
	now := h.clk.Now()
	if n, ok := c.seenFleet(now); !ok || n != 0 {
		t.Fatalf("empty fleet: %d, %v", n, ok)
	}
	for i := range 5 {
		c.noteDevice(fmt.Sprintf("dev-%d", i), nil, now.Add(time.Duration(i)*time.Minute))
	}
	if n, _ := c.seenFleet(now.Add(4 * time.Minute)); n != 5 {
		t.Fatalf("five devices seen: %d", n)
	}
	// dev-0 and dev-1 fall out of the window; the others stay.
	if n, _ := c.seenFleet(now.Add(SeenWindow + time.Minute)); n != 3 {
		t.Fatalf("after the window passed two: %d", n)
	}
	// A device seen again counts once.
	c.noteDevice("dev-4", nil, now.Add(SeenWindow+90*time.Second))
	if n, _ := c.seenFleet(now.Add(SeenWindow + 90*time.Second)); n != 3 {
		t.Fatalf("a device seen twice: %d", n)
	}

	// Unknown at the start: the pace window, until SeenWindow has passed.
	c.mu.Lock()
	c.started, c.stored = now, -1
	c.mu.Unlock()
	h.clk.Set(now.Add(SeenWindow - time.Second))
	if got := c.announceSpread(); got != h.deps.PaceWindow {
		t.Fatalf("fleet unknown: spread %v, want the pace window %v", got, h.deps.PaceWindow)
	}
	// Then the count: dev-2 has left the window too.
	h.clk.Set(now.Add(SeenWindow + 2*time.Minute))
	if n, _ := c.seenFleet(h.clk.Now()); n != 2 {
		t.Fatalf("after dev-2 left the window: %d", n)
	}
	if got := c.announceSpread(); got != MinCheckInSpread {
		t.Fatalf("two devices at %v/s: spread %v, want %v", DefaultCheckInRate, got, MinCheckInSpread)
	}
}
