package checkpoint_test

import (
	"fmt"
	"log"
	"os"

	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/pool/checkpoint"
)

func Example() {
	dir, err := os.MkdirTemp("", "checkpoints")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := checkpoint.OpenDir(dir)
	if err != nil {
		log.Fatal(err)
	}

	params, _ := model.New(model.Tensor{Name: "w", Shape: []int{2}, Data: []float32{0.5, -1}})
	momentum, _ := model.New(model.Tensor{Name: "w.momentum", Shape: []int{2}, Data: []float32{0, 0}})
	saver, err := checkpoint.NewSaver(store, checkpoint.SaverOptions{Keep: 3})
	if err != nil {
		log.Fatal(err)
	}
	for step := int64(1); step <= 3; step++ {
		params.Tensors[0].Data[0] += 0.25 // a training step
		err := saver.Save(&checkpoint.Checkpoint{
			Job: "job-42", Step: step, Params: params, Optimizer: momentum,
			Cursor: checkpoint.Cursor{Epoch: 0, Offset: step * 32, Shard: "train-0"},
			RNG:    []byte{byte(step)},
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	if err := saver.Close(); err != nil {
		log.Fatal(err)
	}

	// After a restart: where was I?
	ck, err := checkpoint.LoadLatest(store)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("step", ck.Step, "offset", ck.Cursor.Offset, "w", ck.Params.Tensors[0].Data)
	fmt.Println("has parent:", !ck.Parent.IsZero())
	// Output:
	// step 3 offset 96 w [1.25 -1]
	// has parent: true
}

// A job that runs its own training command keeps its checkpoint as opaque
// files, byte for byte, with no tensors for the store to interpret.
func Example_files() {
	dir, err := os.MkdirTemp("", "checkpoints")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := checkpoint.OpenDir(dir)
	if err != nil {
		log.Fatal(err)
	}

	id, err := checkpoint.Write(store, &checkpoint.Checkpoint{
		Job: "job-43", Step: 100,
		Files: []checkpoint.File{
			{Name: "state.json", Data: []byte(`{"epoch":1}`)},
			{Name: "model.safetensors", Data: []byte("\x02\x00\x00\x00\x00\x00\x00\x00{}")},
		},
	}, checkpoint.Options{})
	if err != nil {
		log.Fatal(err)
	}

	ck, err := checkpoint.Load(store, id)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("step", ck.Step, "params", ck.Params != nil)
	for _, f := range ck.Files {
		fmt.Printf("%s %q\n", f.Name, f.Data)
	}
	// Output:
	// step 100 params false
	// model.safetensors "\x02\x00\x00\x00\x00\x00\x00\x00{}"
	// state.json "{\"epoch\":1}"
}
