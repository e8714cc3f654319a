package model_test

import (
	"bytes"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/fleetlearn/fleetlearn/model"
)

// mnistMLP returns a 784-128-10 perceptron's parameters (101,770 values).
func mnistMLP(b *testing.B) *model.Model {
	rng := rand.New(rand.NewPCG(1, 2))
	tensor := func(name string, shape ...int) model.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		data := make([]float32, n)
		for i := range data {
			data[i] = float32(rng.NormFloat64() * 0.05)
		}
		return model.Tensor{Name: name, Shape: shape, Data: data}
	}
	m, err := model.New(
		tensor("fc1.weight", 784, 128), tensor("fc1.bias", 128),
		tensor("fc2.weight", 128, 10), tensor("fc2.bias", 10),
	)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

func BenchmarkHash(b *testing.B) {
	m := mnistMLP(b)
	b.SetBytes(int64(4 * len(m.Flatten())))
	for b.Loop() {
		m.Hash()
	}
}

func BenchmarkWriteSafetensors(b *testing.B) {
	m := mnistMLP(b)
	b.SetBytes(int64(4 * len(m.Flatten())))
	for b.Loop() {
		if err := model.WriteSafetensors(io.Discard, m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeSafetensors(b *testing.B) {
	m := mnistMLP(b)
	var buf bytes.Buffer
	if err := model.WriteSafetensors(&buf, m); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(buf.Len()))
	for b.Loop() {
		if _, err := model.DecodeSafetensors(buf.Bytes()); err != nil {
			b.Fatal(err)
		}
	}
}
