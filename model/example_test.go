package model_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"log"
	"strings"

	"github.com/fleetlearn/fleetlearn/model"
)

func ExampleWriteSafetensors() {
	m, err := model.New(
		model.Tensor{Name: "fc.weight", Shape: []int{2, 2}, Data: []float32{1, 2, 3, 4}},
		model.Tensor{Name: "fc.bias", Shape: []int{2}, Data: []float32{0.5, -0.5}},
	)
	if err != nil {
		log.Fatal(err)
	}
	m.Lineage = model.Lineage{Version: "task-7/3", Parent: "task-7/2", Task: "task-7", Round: 3}

	var buf bytes.Buffer
	if err := model.WriteSafetensors(&buf, m); err != nil {
		log.Fatal(err)
	}
	file := buf.Bytes()
	n := binary.LittleEndian.Uint64(file)
	fmt.Printf("header: %d bytes\n", n)
	fmt.Println(strings.TrimRight(string(file[8:8+n]), " "))
	fmt.Printf("data: %d bytes\n", len(file)-8-int(n))

	back, err := model.DecodeSafetensors(file)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("round", back.Lineage.Round, "same hash:", back.Hash() == m.Hash())
	// Output:
	// header: 256 bytes
	// {"__metadata__":{"fleetlearn.version":"task-7/3","fleetlearn.parent":"task-7/2","fleetlearn.task":"task-7","fleetlearn.round":"3"},"fc.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"fc.bias":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}}
	// data: 24 bytes
	// round 3 same hash: true
}

func ExampleModel_Hash() {
	a, err := model.New(
		model.Tensor{Name: "w", Shape: []int{2}, Data: []float32{1, 2}},
		model.Tensor{Name: "b", Shape: []int{}, Data: []float32{0}},
	)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(a.HashHex())

	// Lineage is not hashed: the same parameters are the same content.
	b := a.Clone()
	b.Lineage = model.Lineage{Version: "v2", Parent: "v1"}
	fmt.Println(a.Hash() == b.Hash())

	b.Tensors[0].Data[1] = 3
	fmt.Println(a.Hash() == b.Hash())
	// Output:
	// 49a2897f3d8d7e9574ffbd5ae5e7e0813c0fd883d2b08dea63d03a5c0083f5e6
	// true
	// false
}

func ExampleLayout_Unflatten() {
	global, err := model.New(
		model.Tensor{Name: "w", Shape: []int{2, 2}, Data: []float32{1, 2, 3, 4}},
		model.Tensor{Name: "b", Shape: []int{2}, Data: []float32{0, 0}},
	)
	if err != nil {
		log.Fatal(err)
	}
	// Edge devices return flat vectors in the layout both sides agreed on.
	layout := global.Layout()
	update := []float32{0.1, 0.1, 0.1, 0.1, -1, 1}
	v := global.Flatten()
	for i := range v {
		v[i] += update[i]
	}
	next, err := layout.Unflatten(v)
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range next.Tensors {
		fmt.Println(t.Name, t.Shape, t.Data)
	}
	_, err = layout.Unflatten(v[:5])
	fmt.Println(err)
	// Output:
	// w [2 2] [1.1 2.1 3.1 4.1]
	// b [2] [-1 1]
	// model: unflatten: vector has 5 values, layout needs 6: shape mismatch
}
