package pool

import (
	"cmp"
	"slices"
)

// slot is one worker's free resources as a placement sees them.
type slot struct {
	id   string
	free Resources
}

// fitCount is how many ranks of size r fit in avail.
func fitCount(avail, r Resources) int64 {
	n := int64(MaxRanks)
	for _, d := range [][2]int64{{avail.MilliCPU, r.MilliCPU}, {avail.Memory, r.Memory}, {avail.GPUs, r.GPUs}} {
		if d[1] == 0 {
			continue
		}
		if d[0] <= 0 {
			return 0
		}
		n = min(n, d[0]/d[1])
	}
	return n
}

// placeGang places all ranks of one gang or none. Ranks are identical, so
// each worker hosts up to fitCount of them independently of the others and
// the gang fits exactly when those counts add up to its size: the greedy
// fill below is not a heuristic that can miss a fit. Workers that take the
// most ranks go first (fewer hosts, less cross-host traffic), ties by id,
// so the same inputs give the same placement.
func placeGang(slots []slot, r Resources, ranks int) ([]Assignment, bool) {
	type cand struct {
		id string
		n  int64
	}
	cs := make([]cand, 0, len(slots))
	var sum int64
	for _, s := range slots {
		if n := fitCount(s.free, r); n > 0 {
			cs = append(cs, cand{s.id, n})
			sum += n
		}
	}
	if sum < int64(ranks) {
		return nil, false
	}
	slices.SortFunc(cs, func(a, b cand) int {
		if c := cmp.Compare(b.n, a.n); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	left := int64(ranks)
	var out []Assignment
	for _, c := range cs {
		if left == 0 {
			break
		}
		take := min(c.n, left)
		out = append(out, Assignment{Worker: c.id, Ranks: int(take)})
		left -= take
	}
	slices.SortFunc(out, func(a, b Assignment) int { return cmp.Compare(a.Worker, b.Worker) })
	return out, true
}
