package secagg_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fleetlearn/fleetlearn/privacy/secagg"
)

// TestGroupsAreSeparate: two groups of one round, run by the same devices'
// keys, each sum their own inputs; a message of one group is refused by the
// other's server, since the group is bound into the round digest that
// every signature covers.
func TestGroupsAreSeparate(t *testing.T) {
	const n, dim = 6, 5
	r := rand.New(rand.NewPCG(3, 4))
	for _, g := range []uint32{1, 2} {
		c := newCohort(t, secagg.Config{ClipRange: 1, Group: g}, n, dim, 11)
		if c.r.Group() != g || c.r.Config().Group != g {
			t.Fatalf("group %d: round says %d, config %d", g, c.r.Group(), c.r.Config().Group)
		}
		inputs := randomInputs(r, n, dim, c.r.Bits())
		out := c.run(t, nil, inputs)
		if out.err != nil {
			t.Fatalf("group %d: %v", g, out.err)
		}
		if want := plainSum(inputs, out.survivors, c.r.Bits()); !slices.Equal(out.sum, want) {
			t.Fatalf("group %d: sum %v, want %v", g, out.sum, want)
		}
	}

	one := newCohort(t, secagg.Config{ClipRange: 1, Group: 1}, n, dim, 11)
	two := newCohort(t, secagg.Config{ClipRange: 1, Group: 2}, n, dim, 11)
	ak, err := one.clients[0].Advertise()
	if err != nil {
		t.Fatal(err)
	}
	if err := two.srv.AddAdvertise(ak); err == nil {
		t.Fatal("group 2's server took an advertisement signed for group 1")
	}
	ungrouped := newCohort(t, secagg.Config{ClipRange: 1}, n, dim, 11)
	if err := ungrouped.srv.AddAdvertise(ak); err == nil {
		t.Fatal("a round of one instance took an advertisement signed for group 1")
	}
}
