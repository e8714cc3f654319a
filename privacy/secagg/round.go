package secagg

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
)

// Limits.
const (
	// MaxParticipants bounds the cohort of one round.
	MaxParticipants = 10000
	// MaxDim bounds the length of a masked vector: 2^25 values, 128 MiB
	// as uint32, room for the update of a 64 MB model and its weight, which
	// travels as a chunked report (docs/PROTOCOL.md). A round's server
	// holds a few vectors of this length at most, so it bounds memory too.
	MaxDim = 1 << 25
	// DefaultBits is the modulus exponent when Config.Bits is 0.
	DefaultBits = 32
	// GraphLogFactor is c in the default degree k = 2⌈c·log2 n⌉.
	GraphLogFactor = 3
)

// RecommendedK is the default neighbour count for a cohort of n:
// min(n−1, 2⌈3·log2 n⌉), the O(log n) degree of Bell et al. (CCS 2020).
// With the default threshold (k/2 + 1) it keeps the union bound over all
// participants of "some neighbourhood loses k/2 neighbours to dropout" and
// of "k/2 + 1 neighbours of an honest participant are corrupt" below 2^-20
// from n = 20, 2^-25 from n = 100 and 2^-35 from n = 1000, when at most 10%
// of the cohort drops out and at most 10% colludes with the server;
// docs/SECAGG.md tabulates other rates.
func RecommendedK(n int) int {
	if n < 2 {
		return 0
	}
	k := 2 * int(math.Ceil(GraphLogFactor*math.Log2(float64(n))))
	return min(k, n-1)
}

// Config is a round's secure aggregation settings as the task and the
// server choose them; NewRound resolves it for a cohort. Zero fields take
// defaults. It is a value: a Round keeps its own copy, so changing one after
// NewRound changes no round.
type Config struct {
	// K is the number of neighbours of each participant in the SecAgg+
	// graph; 0 picks RecommendedK(n), at least n−1 the complete graph.
	K int
	// Threshold is the Shamir threshold t, in k/2 < t ≤ k; 0 picks
	// ⌊k/2⌋ + 1.
	Threshold int
	// Bits is the modulus exponent b, 1..32: sums are taken modulo 2^b. 0
	// picks DefaultBits.
	Bits int
	// ClipRange is the per-element clip bound of the round's Quantizer,
	// finite and ≥ 0; the round digest binds it.
	ClipRange float64
	// GraphSeed seeds the neighbour graph; the server draws it per round.
	GraphSeed uint64
	// Group numbers one of a round's independent instances, 1-based, when
	// the round's cohort is split into groups (Bonawitz et al. 2019); 0
	// when the round is one instance. The digest binds a non-zero group,
	// so that no message, share or mask of one group counts in another.
	Group uint32
}

// Validate checks what can be checked of c without the cohort: no negative
// counts, bits at most 32, a finite, non-negative clip range. NewRound checks
// the rest. The error wraps ErrConfig.
func (c Config) Validate() error {
	switch {
	case c.K < 0 || c.Threshold < 0:
		return fmt.Errorf("secagg: config: %w: k %d, threshold %d", ErrConfig, c.K, c.Threshold)
	case c.Bits < 0 || c.Bits > 32:
		return fmt.Errorf("secagg: config: %w: bits %d, want 1..32", ErrConfig, c.Bits)
	case math.IsNaN(c.ClipRange) || math.IsInf(c.ClipRange, 0) || c.ClipRange < 0:
		return fmt.Errorf("secagg: config: %w: clip range %v", ErrConfig, c.ClipRange)
	}
	return nil
}

// Round is the resolved, immutable configuration of one secure-aggregation
// round: the parameters and the neighbour graph both parties derive from
// the round's Config. It is safe for concurrent use.
type Round struct {
	task      string
	round     uint64
	n, k, t   int
	bits      int
	clip      float64
	graphSeed uint64
	group     uint32
	complete  bool
	pos       []uint32 // pos[id] = ring position of participant id (1-based ids)
	ring      []uint32 // ring[p] = participant at position p
	ctx       [32]byte // digest every signature and key derivation binds
}

// NewRound resolves cfg for a cohort of n participants, numbered 1..n, of
// round number round of task taskID.
//
// Zero fields take defaults: k = RecommendedK(n), threshold = ⌊k/2⌋ + 1,
// bits = 32. A k of at least n−1 gives the complete graph (classic SecAgg);
// an odd k < n−1 is raised to the next even number, since the ring graph
// links k/2 neighbours on each side. The threshold must satisfy
// k/2 < t ≤ k, so no two disjoint sets of neighbours can each reconstruct
// one of a participant's two secrets.
func NewRound(cfg Config, taskID string, round uint64, n int) (*Round, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if taskID == "" || len(taskID) > 255 {
		return nil, fmt.Errorf("secagg: round: %w: task id of %d bytes", ErrConfig, len(taskID))
	}
	if n < 2 || n > MaxParticipants {
		return nil, fmt.Errorf("secagg: round: %w: %d participants, want 2..%d", ErrConfig, n, MaxParticipants)
	}
	r := &Round{task: taskID, round: round, n: n, bits: cfg.Bits, clip: cfg.ClipRange, graphSeed: cfg.GraphSeed, group: cfg.Group}
	if r.bits == 0 {
		r.bits = DefaultBits
	}
	k := min(cfg.K, MaxParticipants)
	if k == 0 {
		k = RecommendedK(n)
	}
	if k >= n-1 {
		k, r.complete = n-1, true
	} else if k%2 == 1 {
		k++
		r.complete = k == n-1
	}
	r.k = k
	t := min(cfg.Threshold, MaxParticipants)
	if t == 0 {
		t = k/2 + 1
	}
	if 2*t <= k || t > k {
		return nil, fmt.Errorf("secagg: round: %w: threshold %d with %d neighbours, want %d..%d",
			ErrConfig, t, k, k/2+1, k)
	}
	r.t = t
	r.ctx = r.digest()
	r.buildGraph()
	return r, nil
}

// N returns the cohort size.
func (r *Round) N() int { return r.n }

// K returns the number of neighbours of every participant (n−1 for the
// complete graph).
func (r *Round) K() int { return r.k }

// Threshold returns the Shamir threshold t.
func (r *Round) Threshold() int { return r.t }

// Bits returns the modulus exponent b: sums are taken modulo 2^b.
func (r *Round) Bits() int { return r.bits }

// TaskID returns the task the round belongs to.
func (r *Round) TaskID() string { return r.task }

// Group returns the round's group, 0 when it is one instance.
func (r *Round) Group() uint32 { return r.group }

// Number returns the round number.
func (r *Round) Number() uint64 { return r.round }

// Config returns the resolved configuration, with every default filled in.
func (r *Round) Config() Config {
	return Config{K: r.k, Threshold: r.t, Bits: r.bits, ClipRange: r.clip, GraphSeed: r.graphSeed, Group: r.group}
}

func (r *Round) mask() uint32 { return uint32(1<<r.bits - 1) }

func (r *Round) valid(id uint32) bool { return id >= 1 && int(id) <= r.n }

// IsNeighbour reports whether participants a and b are linked in the graph.
func (r *Round) IsNeighbour(a, b uint32) bool {
	if !r.valid(a) || !r.valid(b) || a == b {
		return false
	}
	if r.complete {
		return true
	}
	d := int(r.pos[a]) - int(r.pos[b])
	if d < 0 {
		d = -d
	}
	return min(d, r.n-d) <= r.k/2
}

// Neighbours returns participant id's neighbours in ascending order.
func (r *Round) Neighbours(id uint32) []uint32 {
	if !r.valid(id) {
		return nil
	}
	out := make([]uint32, 0, r.k)
	if r.complete {
		for j := uint32(1); int(j) <= r.n; j++ {
			if j != id {
				out = append(out, j)
			}
		}
		return out
	}
	p := int(r.pos[id])
	for d := 1; d <= r.k/2; d++ {
		out = append(out, r.ring[(p+d)%r.n], r.ring[(p-d+r.n)%r.n])
	}
	slices.Sort(out)
	return out
}

// digest binds every public parameter of the round, so that signatures and
// keys made under one view of the configuration are useless under another.
func (r *Round) digest() [32]byte {
	h := sha256.New()
	var b []byte
	b = append(b, "fleetlearn/secagg/v1 round\x00"...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.task)))
	b = append(b, r.task...)
	b = binary.BigEndian.AppendUint64(b, r.round)
	b = binary.BigEndian.AppendUint32(b, uint32(r.n))
	b = binary.BigEndian.AppendUint32(b, uint32(r.k))
	b = binary.BigEndian.AppendUint32(b, uint32(r.t))
	b = binary.BigEndian.AppendUint32(b, uint32(r.bits))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(r.clip))
	b = binary.BigEndian.AppendUint64(b, r.graphSeed)
	if r.group != 0 {
		// Appended only for a group, so that a round of one instance keeps
		// the digest it always had.
		b = append(b, "\x00group"...)
		b = binary.BigEndian.AppendUint32(b, r.group)
	}
	h.Write(b)
	return [32]byte(h.Sum(nil))
}

// buildGraph places the participants on a ring in the order of a uniform
// permutation drawn from the public graph seed (Fisher–Yates over an
// AES-256-CTR stream keyed by SHA-256 of the seed and the round).
func (r *Round) buildGraph() {
	r.pos = make([]uint32, r.n+1)
	r.ring = make([]uint32, r.n)
	for i := range r.ring {
		r.ring[i] = uint32(i + 1)
	}
	if !r.complete {
		h := sha256.New()
		h.Write([]byte("fleetlearn/secagg/v1 graph\x00"))
		h.Write(r.ctx[:])
		block, _ := aes.NewCipher(h.Sum(nil)) // a 32-byte key never fails
		ctr := cipher.NewCTR(block, make([]byte, aes.BlockSize))
		var buf [4]byte
		next := func() uint32 {
			buf = [4]byte{}
			ctr.XORKeyStream(buf[:], buf[:])
			return binary.LittleEndian.Uint32(buf[:])
		}
		for i := r.n - 1; i > 0; i-- {
			// Uniform j in [0, i] by rejection of the biased tail.
			bound := uint32(i + 1)
			limit := math.MaxUint32 - math.MaxUint32%bound
			v := next()
			for v >= limit {
				v = next()
			}
			j := v % bound
			r.ring[i], r.ring[j] = r.ring[j], r.ring[i]
		}
	}
	for p, id := range r.ring {
		r.pos[id] = uint32(p)
	}
}
