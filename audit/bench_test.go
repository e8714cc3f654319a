package audit

import (
	"bytes"
	"context"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/audit/internal/merkle"
)

// checkpointEvery signs checkpoints in the background, as the server's
// ticker does, until the returned stop is called.
func checkpointEvery(b *testing.B, lg *Log, d time.Duration) (stop func() int) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	n := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if _, err := lg.Checkpoint(context.Background()); err != nil {
					b.Error(err)
					return
				}
				n++
			}
		}
	}()
	return func() int { close(done); wg.Wait(); return n }
}

// BenchmarkAppend measures sustained single-event appends from many
// goroutines (group commit), signed, durable (synchronous=FULL), with a
// checkpoint every 100 ms.
func BenchmarkAppend(b *testing.B) {
	lg, _, _ := openTest(b)
	evs := make([]Event, 64)
	for i := range evs {
		evs[i] = sampleEvent(b, i)
	}
	stop := checkpointEvery(b, lg, 100*time.Millisecond)
	b.SetParallelism(64)
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := lg.Append(context.Background(), evs[i%len(evs)]); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
	elapsed := time.Since(start)
	stop()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "entries/s")
}

// BenchmarkAppendBatch measures AppendBatch with 256 events per call from
// 4×GOMAXPROCS goroutines, with a checkpoint every 100 ms.
func BenchmarkAppendBatch(b *testing.B) {
	const per = 256
	lg, _, _ := openTest(b)
	evs := make([]Event, per)
	for i := range evs {
		evs[i] = sampleEvent(b, i)
	}
	stop := checkpointEvery(b, lg, 100*time.Millisecond)
	b.SetParallelism(4)
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := lg.AppendBatch(context.Background(), evs); err != nil {
				b.Error(err)
				return
			}
		}
	})
	elapsed := time.Since(start)
	cps := stop()
	b.ReportMetric(float64(b.N*per)/elapsed.Seconds(), "entries/s")
	b.ReportMetric(float64(cps), "checkpoints")
}

// buildFixture writes a log of n leaves straight into SQLite in large
// transactions. The entries are short placeholders, not signed JWS: proofs
// read only the tree, and signing a million entries would dominate the
// setup.
func buildFixture(b *testing.B, n uint64) *Log {
	ctx := context.Background()
	dir := b.TempDir()
	lg, err := Open(ctx, dir, WithKeys(testKeys(b, 1)))
	if err != nil {
		b.Fatal(err)
	}
	lg.Close()
	db := rawDB(b, dir)
	mustExec(b, db, "PRAGMA journal_mode=WAL")
	mustExec(b, db, "PRAGMA synchronous=OFF")
	f := &merkle.Frontier{}
	const chunk = 200_000
	for start := uint64(0); start < n; start += chunk {
		tx, err := db.Begin()
		if err != nil {
			b.Fatal(err)
		}
		insE, _ := tx.Prepare("INSERT INTO entries(idx, data, ts, type, actor_kind, actor, task, round) VALUES (?, ?, ?, 'bench.fixture', 'service', 'bench', 't', 0)")
		insN, _ := tx.Prepare("INSERT INTO nodes(id, hash) VALUES (?, ?)")
		for i := start; i < min(n, start+chunk); i++ {
			data := fmt.Appendf(nil, "fixture entry %d", i)
			if _, err := insE.Exec(int64(i), data, int64(i)); err != nil {
				b.Fatal(err)
			}
			f.Append(merkle.LeafHash(data), func(id merkle.NodeID, h merkle.Hash) {
				if _, err := insN.Exec(nodeKey(id), h[:]); err != nil {
					b.Fatal(err)
				}
			})
		}
		insE.Close()
		insN.Close()
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
	db.Close()
	lg, err = Open(ctx, dir, WithKeys(testKeys(b, 1)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lg.Close() })
	return lg
}

// BenchmarkInclusionProof1M measures one inclusion proof, at a random index,
// in a tree of 1,000,000 entries.
func BenchmarkInclusionProof1M(b *testing.B) {
	const n = 1_000_000
	start := time.Now()
	lg := buildFixture(b, n)
	b.Logf("fixture of %d entries built in %v", n, time.Since(start).Round(time.Millisecond))
	ctx := context.Background()
	root, err := lg.RootAt(ctx, n)
	if err != nil {
		b.Fatal(err)
	}
	rng := mrand.New(mrand.NewPCG(1, 2))
	// Check a few proofs before timing them.
	for range 10 {
		i := rng.Uint64N(n)
		proof, err := lg.InclusionProof(ctx, i, n)
		if err != nil {
			b.Fatal(err)
		}
		leaf := merkle.LeafHash(fmt.Appendf(nil, "fixture entry %d", i))
		if err := VerifyInclusion(i, n, leaf[:], proof, root[:]); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := lg.InclusionProof(ctx, rng.Uint64N(n), n); err != nil {
			b.Fatal(err)
		}
	}
}

// exportFixture is a log of n signed sample entries with a checkpoint after
// every 4,000.
func exportFixture(b *testing.B, n int) *Log {
	lg, _, _ := openTest(b)
	evs := make([]Event, 4000)
	for i := range evs {
		evs[i] = sampleEvent(b, i)
	}
	for range n / len(evs) {
		if _, err := lg.AppendBatch(context.Background(), evs); err != nil {
			b.Fatal(err)
		}
		if _, err := lg.Checkpoint(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	return lg
}

// BenchmarkVerifyExport measures offline verification of an export of
// 20,000 signed entries.
func BenchmarkVerifyExport(b *testing.B) {
	const n = 20_000
	lg := exportFixture(b, n)
	exp := exportBytes(b, lg)
	b.SetBytes(int64(len(exp)))
	b.ResetTimer()
	for b.Loop() {
		rep, err := VerifyExport(bytes.NewReader(exp))
		if err != nil || rep.Entries != n {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "entries/s")
}

// BenchmarkExportProofs measures an export of 20,000 entries in 5
// checkpoints, without proofs and with a proof for every entry and
// checkpoint, and the verification of each.
func BenchmarkExportProofs(b *testing.B) {
	const n = 20_000
	lg := exportFixture(b, n)
	for _, c := range []struct {
		name string
		opts []ExportOption
	}{{"plain", nil}, {"proofs", []ExportOption{WithProofs()}}} {
		exp := exportBytes(b, lg, c.opts...)
		b.Run("export/"+c.name, func(b *testing.B) {
			b.SetBytes(int64(len(exp)))
			var buf bytes.Buffer
			for b.Loop() {
				buf.Reset()
				if err := lg.Export(context.Background(), &buf, c.opts...); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("verify/"+c.name, func(b *testing.B) {
			b.SetBytes(int64(len(exp)))
			for b.Loop() {
				if rep, err := VerifyExport(bytes.NewReader(exp)); err != nil || rep.Entries != n {
					b.Fatal(err)
				}
			}
		})
	}
}
