package poolsvc

import (
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/internal/clock"
)

var timeZero time.Time

func nowProto(c clock.Clock) *timestamppb.Timestamp { return timestamppb.New(c.Now()) }

// notifier wakes JobLogs followers when lines arrive; it is separate from
// the loop because log appends do not touch scheduling state.
type notifier struct {
	mu sync.Mutex
	ch map[string]chan struct{}
}

func newNotifier() *notifier { return &notifier{ch: map[string]chan struct{}{}} }

// wait returns a channel closed at the next notify of key.
func (n *notifier) wait(key string) <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	c, ok := n.ch[key]
	if !ok {
		c = make(chan struct{})
		n.ch[key] = c
	}
	return c
}

func (n *notifier) notify(key string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if c, ok := n.ch[key]; ok {
		close(c)
		delete(n.ch, key)
	}
}

func sortStrings(v []string) { slices.Sort(v) }
