package ui

import (
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/slots"
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
// no principal holds more than its share, and principals that may operate
// or audit have the last reserve streams to themselves, so that no viewer,
// however many tabs or scripts it runs, keeps an operator's pages from
// being live.
type streamGate struct {
	pool         *slots.Pool
	max, reserve int
}

func newStreamGate(max, perPrincipal, reserve int) *streamGate {
	return &streamGate{pool: slots.New(max, perPrincipal), max: max, reserve: reserve}
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
// release must be called for every stream taken.
func (g *streamGate) acquire(p identity.Principal) (release func(), refused string) {
	limit := g.max
	if !privileged(p) {
		limit = g.max - g.reserve
	}
	release, why := g.pool.Acquire(principalKey(p), limit)
	return release, streamRefusal[why]
}

// streamRefusal names each refusal of the pool among StreamRefusals.
var streamRefusal = map[slots.Refusal]string{slots.Granted: "", slots.PerKey: StreamRefusedPrincipal,
	slots.Full: StreamRefusedFull, slots.Reserved: StreamRefusedReserved}

// open is how many streams are held in all, and by how many principals.
func (g *streamGate) open() (streams, principals int) { return g.pool.Open() }
