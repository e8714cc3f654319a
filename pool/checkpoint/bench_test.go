package checkpoint

import (
	"slices"
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
// snapshot Save takes before it returns. Each write finishes, untimed,
// before the next Save, so that the figure is the snapshot alone.
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
