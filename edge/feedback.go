package edge

import (
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"strings"

	"github.com/fleetlearn/fleetlearn/aggregator/quant"
	"github.com/fleetlearn/fleetlearn/internal/lru"
	"github.com/fleetlearn/fleetlearn/model"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// maxFeedbackTasks bounds the tasks whose quantization residual an agent
// keeps: one model-sized float32 buffer each. Past it, the task served
// least recently loses its residual, which costs it only the resolution
// the residual would have restored.
const maxFeedbackTasks = 4

// feedbackState is one task's error feedback: the residual and the model
// layout it belongs to.
type feedbackState struct {
	layout string
	used   uint64 // agent-wide counter at the last use, for eviction
	fb     quant.Feedback
}

// encodingBits is the code width of a quantized plaintext encoding.
func encodingBits(e pb.UpdateEncoding) (int, error) {
	if bits, ok := wire.EncodingBits(e); ok && bits > 0 {
		return bits, nil
	}
	return 0, fmt.Errorf("plan: update encoding %v is not a quantized one", e)
}

// layoutKey names a model layout: a residual is kept only while the
// tensors keep their names and shapes.
func layoutKey(m *model.Model) string {
	var b strings.Builder
	for _, t := range m.Tensors {
		b.WriteString(t.Name)
		for _, d := range t.Shape {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(d))
		}
		b.WriteByte(0)
	}
	return b.String()
}

// feedback returns task's error-feedback state for model m, with its
// residual dropped when the layout changed, creating it (and evicting the
// least recently used task past maxFeedbackTasks) when there is none. Only
// the protocol goroutine calls it, one round at a time.
func (a *Agent) feedback(task string, m *model.Model) *feedbackState {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.feedbacks == nil {
		a.feedbacks = map[string]*feedbackState{}
	}
	a.feedbackUses++
	key := layoutKey(m)
	s, ok := a.feedbacks[task]
	if !ok {
		if len(a.feedbacks) >= maxFeedbackTasks {
			lru.DropOldest(a.feedbacks, func(f *feedbackState) uint64 { return f.used })
		}
		s = &feedbackState{layout: key}
		a.feedbacks[task] = s
	}
	if s.layout != key {
		s.fb.Reset()
		s.layout = key
	}
	s.used = a.feedbackUses
	return s
}

// dropFeedback forgets task's residual, as for a round that sends float32.
func (a *Agent) dropFeedback(task string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.feedbacks, task)
}

// quantRand is a fresh source for stochastic rounding: unpredictable to
// the server, so that rounding stays unbiased whatever it knows.
func quantRand() (mrand.Source, error) {
	var seed [32]byte
	if _, err := rand.Read(seed[:]); err != nil {
		return nil, fmt.Errorf("quantize: seed: %w", err)
	}
	return mrand.NewChaCha8(seed), nil
}
