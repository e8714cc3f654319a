package edge

import (
	"testing"

	"github.com/fleetlearn/fleetlearn/model"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

func TestTrainablePlan(t *testing.T) {
	m, err := model.New(model.Tensor{Name: "a", Shape: []int{2}, Data: []float32{1, 2}},
		model.Tensor{Name: "b", Shape: []int{1}, Data: []float32{3}},
		model.Tensor{Name: "c", Shape: []int{3}, Data: []float32{4, 5, 6}})
	if err != nil {
		t.Fatal(err)
	}
	idx, sub, err := trainable(&pb.RoundPlan{Trainable: []uint32{0, 2}}, m)
	if err != nil || len(idx) != 2 || sub.Layout().Size() != 5 || sub.Tensors[1].Name != "c" {
		t.Fatalf("%v %v %v", idx, sub, err)
	}
	after := m.Clone()
	for i := range after.Tensors {
		for j := range after.Tensors[i].Data {
			after.Tensors[i].Data[j] += float32(i + 1)
		}
	}
	got := updateOf(nil, m, after, idx)
	want := []float32{1, 1, 3, 3, 3}
	if len(got) != len(want) {
		t.Fatalf("update %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("update %v, want %v", got, want)
		}
	}
	if all := updateOf(nil, m, after, nil); len(all) != 6 {
		t.Fatalf("full update %v", all)
	}
	for _, bad := range [][]uint32{{3}, {1, 0}, {0, 0}, {0, 1, 2, 3}} {
		if _, _, err := trainable(&pb.RoundPlan{Trainable: bad}, m); err == nil {
			t.Errorf("trainable %v accepted", bad)
		}
	}
}
