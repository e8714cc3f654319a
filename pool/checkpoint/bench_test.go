package checkpoint

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/model"
)

// benchCheckpoint is a 50 MiB model: 25 tensors of 2 MiB.
func benchCheckpoint(b *testing.B) *Checkpoint {
	b.Helper()
	ts := make([]model.Tensor, 25)
	for i := range ts {
		data := make([]float32, 512<<10)
		for j := range data {
			data[j] = float32(i*j%1000) * 1e-3
		}
		ts[i] = model.Tensor{Name: "layer" + string(rune('a'+i)), Shape: []int{512, 1024}, Data: data}
	}
	m, err := model.New(ts...)
	if err != nil {
		b.Fatal(err)
	}
	return &Checkpoint{Job: "bench", Params: m, RNG: make([]byte, 32)}
}

// touch changes one value in every tensor, as a training step changes all
// parameters, so that no save dedupes against the one before.
func touch(ck *Checkpoint, step int) {
	ck.Step = int64(step)
	for i := range ck.Params.Tensors {
		d := ck.Params.Tensors[i].Data
		d[step%len(d)] += 1
	}
}

func modelBytes(ck *Checkpoint) int64 {
	var n int64
	for _, t := range ck.Params.Tensors {
		n += 4 * int64(len(t.Data))
	}
	return n
}

// BenchmarkSaveBlocking times what training waits for per checkpoint: the
// snapshot Save takes before it returns. The buffers are prepared first, as
// the trainer does, and each write finishes, untimed, before the next Save,
// so that a buffer is always free and the figure is the copy alone.
func BenchmarkSaveBlocking(b *testing.B) {
	s, err := OpenDir(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	sv, err := NewSaver(s, SaverOptions{Keep: 2})
	if err != nil {
		b.Fatal(err)
	}
	ck := benchCheckpoint(b)
	if err := sv.Prepare(ck); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(modelBytes(ck))
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		touch(ck, i)
		b.StartTimer()
		start := time.Now()
		if err := sv.Save(ck); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		b.StopTimer()
		if _, err := sv.Wait(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	if err := sv.Close(); err != nil {
		b.Fatal(err)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(percentile(lat, 0.99))/1e6, "p99-ms")
	b.ReportMetric(float64(lat[len(lat)/2])/1e6, "p50-ms")
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(float64(len(sorted))*p+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// BenchmarkSaveTotal times whole checkpoints: snapshot, encoding, hashing,
// writing and syncing every blob, the manifest and the pointer.
func BenchmarkSaveTotal(b *testing.B) {
	s, err := OpenDir(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	sv, err := NewSaver(s, SaverOptions{Keep: 2})
	if err != nil {
		b.Fatal(err)
	}
	ck := benchCheckpoint(b)
	b.SetBytes(modelBytes(ck))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		touch(ck, i)
		b.StartTimer()
		if err := sv.Save(ck); err != nil {
			b.Fatal(err)
		}
		if _, err := sv.Wait(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := sv.Close(); err != nil {
		b.Fatal(err)
	}
}

// throttledStore is a store behind a link of fixed bandwidth: PutBlob holds
// the link for the time its bytes take to cross it, then keeps only their
// size; Commit is free.
type throttledStore struct {
	*discardStore
	link        sync.Mutex
	bytesPerSec float64
}

func (s *throttledStore) PutBlob(d Digest, data []byte) error {
	s.link.Lock()
	time.Sleep(time.Duration(float64(len(data)) / s.bytesPerSec * float64(time.Second)))
	s.link.Unlock()
	return s.discardStore.PutBlob(d, data)
}

// BenchmarkSaveSlowStore checkpoints the 50 MiB model at a fixed cadence
// (the training between checkpoints is a sleep), buffers prepared, into a
// store whose link takes 200 ms per checkpoint. Ahead: a checkpoint every 300 ms, and every
// Save finds a free buffer. Behind: one every 100 ms, faster than the link,
// so the two buffers fill and each Save waits about the 100 ms the store
// lacks; the wait is the stall, and waits/op counts it.
func BenchmarkSaveSlowStore(b *testing.B) {
	const perCheckpoint = 200 * time.Millisecond
	for _, c := range []struct {
		name    string
		cadence time.Duration
	}{{"ahead", 300 * time.Millisecond}, {"behind", 100 * time.Millisecond}} {
		b.Run(c.name, func(b *testing.B) {
			ck := benchCheckpoint(b)
			s := &throttledStore{discardStore: &discardStore{Store: newGateStore()},
				bytesPerSec: float64(modelBytes(ck)) / perCheckpoint.Seconds()}
			sv, err := NewSaver(s, SaverOptions{})
			if err != nil {
				b.Fatal(err)
			}
			if err := sv.Prepare(ck); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(modelBytes(ck))
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				time.Sleep(c.cadence)
				touch(ck, i)
				start := time.Now()
				if err := sv.Save(ck); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			if _, err := sv.Wait(); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			st := sv.Stats()
			if err := sv.Close(); err != nil {
				b.Fatal(err)
			}
			slices.Sort(lat)
			b.ReportMetric(float64(percentile(lat, 0.99))/1e6, "p99-ms")
			b.ReportMetric(float64(lat[len(lat)/2])/1e6, "p50-ms")
			b.ReportMetric(float64(st.Waits)/float64(b.N), "waits/op")
		})
	}
}
