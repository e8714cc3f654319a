package ui

import (
	"sync"

	"github.com/fleetlearn/fleetlearn/identity"
)

// Why a live-update stream was refused: the fixed values a WithStreamRefused
// callback sees, so a metric labelled with them has a bounded set of series.
const (
	// StreamRefusedPrincipal: the viewer already holds its own limit of
	// streams (WithStreamsPerPrincipal).
	StreamRefusedPrincipal = "principal"
	// StreamRefusedReserved: what is left is kept for admins, operators and
	// auditors (WithStreamReserve), and the viewer is none of them.
	StreamRefusedReserved = "reserved"
	// StreamRefusedFull: every stream the dashboard serves is open
	// (WithMaxStreams).
	StreamRefusedFull = "full"
)

// StreamRefusals lists every reason a stream may be refused for.
var StreamRefusals = []string{StreamRefusedPrincipal, StreamRefusedReserved, StreamRefusedFull}

// streamGate shares the dashboard's live-update streams among principals:
// no principal holds more than perPrincipal, and principals that may
// operate or audit have the last reserve streams to themselves, so that
// no viewer, however many tabs or scripts it runs, keeps an operator's
// pages from being live.
type streamGate struct {
	max, perPrincipal, reserve int

	mu    sync.Mutex
	total int
	held  map[string]int // open streams by principal; no zero entries
}

func newStreamGate(max, perPrincipal, reserve int) *streamGate {
	return &streamGate{max: max, perPrincipal: perPrincipal, reserve: reserve, held: map[string]int{}}
}

// privileged reports whether p may use the streams kept in reserve.
func privileged(p identity.Principal) bool {
	return p.Has(identity.RoleAdmin) || p.Has(identity.RoleOperator) || p.Has(identity.RoleAuditor)
}

// principalKey names whose share a stream counts against. Tokens are
// minted per person or per workload, by subject; two tokens of one subject
// share its streams.
func principalKey(p identity.Principal) string { return p.Subject }

// acquire takes a stream for p, or says why not (one of StreamRefusals);
// release must be called exactly once for every stream taken.
func (g *streamGate) acquire(p identity.Principal) (release func(), refused string) {
	key := principalKey(p)
	g.mu.Lock()
	defer g.mu.Unlock()
	limit := g.max
	if !privileged(p) {
		limit = g.max - g.reserve
	}
	switch {
	case g.held[key] >= g.perPrincipal:
		return nil, StreamRefusedPrincipal
	case g.total >= g.max:
		return nil, StreamRefusedFull
	case g.total >= limit:
		return nil, StreamRefusedReserved
	}
	g.total++
	g.held[key]++
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.total--
			if g.held[key]--; g.held[key] == 0 {
				delete(g.held, key)
			}
		})
	}, ""
}

// open is how many streams are held in all, and by how many principals.
func (g *streamGate) open() (streams, principals int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.total, len(g.held)
}
