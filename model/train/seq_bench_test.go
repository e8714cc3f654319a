package train

import (
	"testing"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model/seq"
	"github.com/fleetlearn/fleetlearn/model/sgd"
)

// BenchmarkSeqEpoch is one device's epoch of the LEAF CNN (6.5 million
// parameters) on 320 Fashion-MNIST-shaped examples, batch 32: what the seq
// module spends in host kernels on a round's training, natively.
func BenchmarkSeqEpoch(b *testing.B) {
	const n = 320
	d := &data.Dataset{Dim: 784, NumClasses: 10, Features: make([]float32, n*784), Labels: make([]uint8, n)}
	for i := range d.Features {
		d.Features[i] = float32((i*7919)%255) / 255
	}
	for i := range d.Labels {
		d.Labels[i] = uint8(i % 10)
	}
	a, err := seq.Parse("seq:input(1,28,28),conv(32,5,pad=2),relu,maxpool(2),conv(64,5,pad=2),relu,maxpool(2),dense(2048),relu,dense(10)")
	if err != nil {
		b.Fatal(err)
	}
	m, err := InitSeq(a, 1)
	if err != nil {
		b.Fatal(err)
	}
	h := sgd.Hyper{Epochs: 1, BatchSize: 32, EvalBatchSize: 32, LearningRate: 0.01}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, _, err := TrainSeq(m, d, h, 1, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n)/1e6, "ms/example")
}
