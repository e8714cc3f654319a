package edge

import (
	"fmt"
	"testing"

	"github.com/fleetlearn/fleetlearn/model"
)

func feedbackModel(t *testing.T, shape ...int) *model.Model {
	t.Helper()
	n := 1
	for _, d := range shape {
		n *= d
	}
	m, err := model.New(model.Tensor{Name: "w", Shape: shape, Data: make([]float32, n)})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestFeedbackState: a task's residual survives from round to round of the
// same layout, is dropped when the layout changes, and at most
// maxFeedbackTasks tasks keep one, the least recently served losing it.
func TestFeedbackState(t *testing.T) {
	a := &Agent{}
	m := feedbackModel(t, 2, 3)
	fs := a.feedback("t-1", m)
	if err := fs.fb.Keep([]float32{1, 2, 3, 4, 5, 6}, make([]float32, 6)); err != nil {
		t.Fatal(err)
	}
	if a.feedback("t-1", m).fb.Len() != 6 {
		t.Fatal("residual lost between rounds of one layout")
	}
	if a.feedback("t-1", feedbackModel(t, 3, 2)).fb.Len() != 0 {
		t.Fatal("residual kept across a layout change")
	}
	fs = a.feedback("t-1", m)
	fs.fb.Keep(make([]float32, 6), make([]float32, 6))
	for i := range maxFeedbackTasks {
		a.feedback(fmt.Sprintf("t-other-%d", i), m)
	}
	if len(a.feedbacks) != maxFeedbackTasks {
		t.Fatalf("%d tasks keep a residual, at most %d may", len(a.feedbacks), maxFeedbackTasks)
	}
	if _, ok := a.feedbacks["t-1"]; ok {
		t.Fatal("the least recently served task kept its residual")
	}
	a.dropFeedback("t-other-0")
	if _, ok := a.feedbacks["t-other-0"]; ok {
		t.Fatal("a float32 round kept the task's residual")
	}
}
