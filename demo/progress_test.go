package demo

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestProgressPlain(t *testing.T) {
	var out bytes.Buffer
	pr := &progress{w: &out}
	ph := pr.start("enrolling agents", 3, "enrolling 3 edge agents")
	for _, id := range []string{"edge-000", "edge-001", "edge-002"} {
		ph.step(id)
	}
	pr.printf("task %s created", "t-1")
	pr.start("training rounds", 2, "training 2 rounds")
	pr.status("aggregating")
	pr.round(RoundResult{Round: 1, Reports: 4, Accuracy: 0.9, Loss: 0.3, Elapsed: time.Second})
	pr.printf("  round 2 abandoned: too few reports; retrying")
	pr.round(RoundResult{Round: 3, Reports: 4, Accuracy: 0.95, Loss: 0.2, Elapsed: time.Second})
	pr.end()
	want := "enrolling 3 edge agents ...\n" +
		"task t-1 created\n" +
		"training 2 rounds ...\n" +
		"[##########..........] round  1/2  accuracy  90.00%  loss 0.3000  reports 4  dropped 0  1s\n" +
		"  round 2 abandoned: too few reports; retrying\n" +
		"[####################] round  2/2  accuracy  95.00%  loss 0.2000  reports 4  dropped 0  1s\n"
	if out.String() != want {
		t.Errorf("plain output:\n%s\nwant:\n%s", out.String(), want)
	}
}

// TestProgressTerminal: on a terminal the bar is drawn with mpb, lines go
// above it, and the finished bar stays, full; end waits for the last frame,
// so what the test reads is complete.
func TestProgressTerminal(t *testing.T) {
	var out bytes.Buffer
	pr := &progress{w: &out, terminal: true}
	ph := pr.start("enrolling agents", 3, "enrolling 3 edge agents")
	for _, id := range []string{"edge-000", "edge-001", "edge-002"} {
		ph.step(id)
	}
	pr.end()
	pr.printf("task t-1 created")
	pr.start("training rounds", 2, "training 2 rounds")
	pr.round(RoundResult{Round: 1, Reports: 4, Accuracy: 0.9, Loss: 0.3, Elapsed: time.Second})
	pr.end()
	s := out.String()
	for _, want := range []string{"enrolling agents", "3/3", "edge-002", "task t-1 created\n",
		"round  1/2  accuracy  90.00%", "training rounds", "1/2", "[=========="} {
		if !strings.Contains(s, want) {
			t.Errorf("terminal output lacks %q:\n%q", want, s)
		}
	}
	if strings.Contains(s, "enrolling 3 edge agents ...") || strings.Contains(s, "[####") {
		t.Errorf("terminal output has the plain lines:\n%q", s)
	}
	// The enrolment bar's last frame comes before the next line.
	if i, j := strings.LastIndex(s, "3/3"), strings.Index(s, "task t-1 created"); i < 0 || j < i {
		t.Errorf("a finished bar is not above what follows it:\n%q", s)
	}
}

// TestProgressAbortedPhase: a demo that fails part way ends its bar where
// it stopped, and end returns rather than waiting for steps that never come.
func TestProgressAbortedPhase(t *testing.T) {
	var out bytes.Buffer
	pr := &progress{w: &out, terminal: true}
	ph := pr.start("pretraining", 10, "pretraining")
	ph.step("loss 1.0")
	pr.end()
	pr.end() // twice is harmless
	if !strings.Contains(out.String(), "1/10") {
		t.Errorf("aborted bar not drawn where it stopped:\n%q", out.String())
	}
}
