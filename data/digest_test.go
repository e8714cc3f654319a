package data

import "testing"

func TestDigest(t *testing.T) {
	a := &Dataset{Features: []float32{0, 1, 2, 3}, Labels: []uint8{0, 1}, Dim: 2, NumClasses: 2}
	same := &Dataset{Features: []float32{0, 1, 2, 3}, Labels: []uint8{0, 1}, Dim: 2, NumClasses: 2}
	if a.Digest() != same.Digest() || len(a.Digest()) != 64 {
		t.Fatalf("equal datasets digest %s and %s", a.Digest(), same.Digest())
	}
	for name, d := range map[string]*Dataset{
		"feature": {Features: []float32{0, 1, 2, 4}, Labels: []uint8{0, 1}, Dim: 2, NumClasses: 2},
		"label":   {Features: []float32{0, 1, 2, 3}, Labels: []uint8{1, 1}, Dim: 2, NumClasses: 2},
		"dim":     {Features: []float32{0, 1, 2, 3}, Labels: []uint8{0, 1, 0, 0}, Dim: 1, NumClasses: 2},
		"classes": {Features: []float32{0, 1, 2, 3}, Labels: []uint8{0, 1}, Dim: 2, NumClasses: 3},
		"order":   a.Subset([]int{1, 0}),
	} {
		if d.Digest() == a.Digest() {
			t.Errorf("%s change kept the digest", name)
		}
	}
}
