package data_test

import (
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/fleetlearn/fleetlearn/data"
)

func ExampleIID() {
	// Ten examples over three clients; the seed fixes the shuffle.
	parts, err := data.IID(10, 3, 42)
	if err != nil {
		log.Fatal(err)
	}
	for c, idx := range parts {
		fmt.Println(c, idx)
	}
	// Output:
	// 0 [0 7 8]
	// 1 [1 4 5]
	// 2 [2 3 6 9]
}

func ExampleDirichlet() {
	// Two classes, interleaved; a small alpha concentrates each class on
	// few clients.
	labels := make([]uint8, 40)
	for i := range labels {
		labels[i] = uint8(i % 2)
	}
	parts, err := data.Dirichlet(labels, 2, 4, 0.3, 7)
	if err != nil {
		log.Fatal(err)
	}
	hist, err := data.Stats(labels, 2, parts)
	if err != nil {
		log.Fatal(err)
	}
	for c, h := range hist {
		fmt.Printf("client %d: %d examples, per class %v\n", c, len(parts[c]), h)
	}
	// Output:
	// client 0: 9 examples, per class [0 9]
	// client 1: 14 examples, per class [14 0]
	// client 2: 15 examples, per class [5 10]
	// client 3: 2 examples, per class [1 1]
}

func ExampleWriteDir() {
	tmp, err := os.MkdirTemp("", "fleetlearn-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "device-7")

	local := &data.Dataset{
		Features:   []float32{0, 0.5, 1, 0.25, 0.75, 1},
		Labels:     []uint8{3, 1, 3},
		Dim:        2,
		NumClasses: 10,
	}
	if err := data.WriteDir(dir, local, "mnist-device-7"); err != nil {
		log.Fatal(err)
	}

	// The edge agent reads it back, verified.
	d, err := data.ReadDir(dir, data.WithMaxExamples(60000))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Len(), d.Dim, d.NumClasses, d.Labels, d.Features[2:4])
	// Output:
	// 3 2 10 [3 1 3] [1 0.25]
}
