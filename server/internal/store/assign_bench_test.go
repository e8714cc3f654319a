package store_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

// BenchmarkAssign seats a cohort of 1,000 devices in one round of an
// SQLite store; ns/op is one seat, averaged over the cohort, so a cost that
// grows with the seats already taken shows as a larger figure.
func BenchmarkAssign(b *testing.B) {
	ctx := context.Background()
	s, err := store.Open(ctx, filepath.Join(b.TempDir(), "s.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const cohort = 1000
	devices := make([]string, cohort)
	for i := range devices {
		devices[i] = fmt.Sprintf("d-%04d", i)
	}
	round := uint64(0)
	i := 0
	for b.Loop() {
		if i%cohort == 0 {
			round++
		}
		if _, _, err := s.Assign(ctx, "t-1", round, devices[i%cohort], 10, now); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
