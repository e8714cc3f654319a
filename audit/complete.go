package audit

import (
	"fmt"
	"slices"
	"strings"
)

// The server records a committed round's events in one atomic batch, so a
// log that verifies but misses one of them was written that way or rewritten
// by whoever holds the keys. Completeness follows each round through its
// events: which ones a round needs follows from the task's configuration
// as task.created recorded it.

// RoundRecord is what an export shows of one committed round.
type RoundRecord struct {
	Task   string
	Round  uint64
	Kind   string      // "train" or "evaluate", from round.opened
	Closed uint64      // index of its round.closed entry
	Events []EventType // its events, in log order
}

type roundKey struct {
	task  string
	round uint64
}

type roundState struct {
	opened     bool
	kind       string
	closed     int64 // index of round.closed, -1 while none
	committed  bool
	events     []EventType
	first      int64 // first entry about the round
	serverEval bool  // a model.evaluated on a server dataset
	fedEval    bool  // a model.evaluated on federated:evaluate
}

type taskState struct {
	created    bool
	dp         bool
	serverEval bool
	lastOpened uint64
}

type completeness struct {
	rounds map[roundKey]*roundState
	order  []roundKey // rounds in the order first seen
	tasks  map[string]*taskState
	skips  []skip
	err    error // first decoding problem
	errAt  int64
}

// skip is a round.opened whose round number jumps over rounds [from, to].
type skip struct {
	task     string
	from, to uint64
	at       int64
}

func newCompleteness() *completeness {
	return &completeness{rounds: map[roundKey]*roundState{}, tasks: map[string]*taskState{}, errAt: -1}
}

func (c *completeness) round(task string, round uint64, index int64) *roundState {
	k := roundKey{task, round}
	r := c.rounds[k]
	if r == nil {
		r = &roundState{closed: -1, first: index}
		c.rounds[k] = r
		c.order = append(c.order, k)
	}
	return r
}

func (c *completeness) task(id string) *taskState {
	t := c.tasks[id]
	if t == nil {
		t = &taskState{}
		c.tasks[id] = t
	}
	return t
}

// observe takes one verified event.
func (c *completeness) observe(index int64, ev Event) {
	switch ev.Type {
	case TypeTaskCreated, TypeRoundOpened, TypeRoundClosed, TypeModelCommitted, TypeModelEvaluated, TypePrivacySpent:
	default:
		return
	}
	p, err := ev.DecodePayload()
	if err != nil {
		if c.err == nil {
			c.err, c.errAt = fmt.Errorf("%w: %w", ErrTampered, err), index
		}
		return
	}
	switch p := p.(type) {
	case TaskCreated:
		t := c.task(p.Task)
		t.created, t.dp = true, p.DP
		t.serverEval = p.Settings["server_eval_dataset"] != ""
	case RoundOpened:
		r := c.round(p.Task, p.Round, index)
		r.opened, r.kind = true, roundKind(p.Eligibility)
		r.events = append(r.events, ev.Type)
		t := c.task(p.Task)
		if t.created && p.Round > t.lastOpened+1 {
			c.skips = append(c.skips, skip{task: p.Task, from: t.lastOpened + 1, to: p.Round - 1, at: index})
		}
		t.lastOpened = max(t.lastOpened, p.Round)
	case RoundClosed:
		r := c.round(p.Task, p.Round, index)
		r.closed, r.committed = index, p.Outcome == RoundCommitted
		r.events = append(r.events, ev.Type)
	case ModelCommitted:
		r := c.round(p.Task, p.Round, index)
		r.events = append(r.events, ev.Type)
	case PrivacySpent:
		r := c.round(p.Task, p.Round, index)
		r.events = append(r.events, ev.Type)
	case ModelEvaluated:
		if p.Round == 0 {
			return // an evaluation outside a round
		}
		r := c.round(p.Task, p.Round, index)
		r.events = append(r.events, ev.Type)
		switch {
		case strings.HasPrefix(p.Dataset, "server:"):
			r.serverEval = true
		case p.Dataset == "federated:evaluate":
			r.fedEval = true
		}
	}
}

// roundKind reads the kind from round.opened's eligibility ("kind=train
// min_examples=1 ..."); rounds recorded before kinds existed trained.
func roundKind(eligibility string) string {
	for _, f := range strings.Fields(eligibility) {
		if k, ok := strings.CutPrefix(f, "kind="); ok {
			return k
		}
	}
	return "train"
}

// check returns the committed rounds in log order and the tasks it could
// not check, or the entry index and reason of the first gap. What a round
// needs follows from its task's task.created; a task created before this
// log began (a log continued under new keys) cannot be checked.
func (c *completeness) check() (rounds []RoundRecord, unchecked []string, at int64, err error) {
	if c.err != nil {
		return nil, nil, c.errAt, c.err
	}
	for _, k := range c.order {
		r := c.rounds[k]
		t := c.tasks[k.task]
		if t == nil || !t.created {
			if n := len(unchecked); n == 0 || unchecked[n-1] != k.task {
				if !slices.Contains(unchecked, k.task) {
					unchecked = append(unchecked, k.task)
				}
			}
			continue
		}
		has := func(e EventType) bool { return slices.Contains(r.events, e) }
		gap := func(format string, args ...any) (int64, error) {
			at := r.closed
			if at < 0 {
				at = r.first
			}
			return at, fmt.Errorf("task %s round %d: "+format+": %w", append([]any{k.task, k.round}, append(args, ErrIncomplete)...)...)
		}
		if r.closed < 0 {
			if has(TypeModelCommitted) || has(TypePrivacySpent) || has(TypeModelEvaluated) {
				at, err := gap("%s without round.closed", strings.Join(eventNames(slices.DeleteFunc(slices.Clone(r.events),
					func(e EventType) bool { return e == TypeRoundOpened })), ", "))
				return nil, nil, at, err
			}
			if t.lastOpened > k.round {
				at, err := gap("round %d was opened after it, but it has no round.closed", t.lastOpened)
				return nil, nil, at, err
			}
			continue
		}
		if !r.opened {
			at, err := gap("round.closed without round.opened")
			return nil, nil, at, err
		}
		if !r.committed {
			if has(TypeModelCommitted) || has(TypePrivacySpent) {
				at, err := gap("abandoned, yet it has %s", strings.Join(eventNames(r.events), ", "))
				return nil, nil, at, err
			}
			continue
		}
		var missing []string
		if r.kind == "evaluate" {
			if !r.fedEval {
				missing = append(missing, "model.evaluated (federated:evaluate)")
			}
		} else {
			if !has(TypeModelCommitted) {
				missing = append(missing, string(TypeModelCommitted))
			}
			if t.serverEval && !r.serverEval {
				missing = append(missing, "model.evaluated (server dataset)")
			}
			if t.dp && !has(TypePrivacySpent) {
				missing = append(missing, string(TypePrivacySpent))
			}
		}
		if len(missing) > 0 {
			at, err := gap("committed, but %s missing", strings.Join(missing, " and "))
			return nil, nil, at, err
		}
		rounds = append(rounds, RoundRecord{Task: k.task, Round: k.round, Kind: r.kind, Closed: uint64(r.closed), Events: r.events})
	}
	// A round of the gap with events of its own was named above, at its
	// own entries; one with none is missing as a whole.
	for _, s := range c.skips {
		for r := s.from; r <= s.to; r++ {
			if c.rounds[roundKey{s.task, r}] == nil {
				return nil, nil, s.at, fmt.Errorf("task %s round %d: no event of it at all, yet round %d of the task was opened: %w",
					s.task, r, s.to+1, ErrIncomplete)
			}
		}
	}
	return rounds, unchecked, -1, nil
}

func eventNames(ts []EventType) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = string(t)
	}
	return out
}
