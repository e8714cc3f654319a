package secagg

import (
	"bytes"
	"crypto/ecdh"
	"crypto/ed25519"
	"errors"
	"fmt"
	"slices"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/privacy/secagg/internal/field"
	"github.com/fleetlearn/fleetlearn/privacy/secagg/internal/shamir"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Stage is the stage a Server is collecting messages for.
type Stage int

// Stages in order. StageDone follows the unmask deadline.
const (
	StageAdvertise Stage = iota
	StageShareKeys
	StageMaskedInput
	StageConsistency
	StageUnmask
	StageDone
)

func (s Stage) String() string {
	if s >= 0 && int(s) < len(clientStageNames) {
		return clientStageNames[s]
	}
	return fmt.Sprintf("Stage(%d)", int(s))
}

// ServerOptions tune a Server. The zero value is usable.
type ServerOptions struct {
	// VerifyPeer, when set, makes the server refuse AdvertiseKeys and
	// ConsistencyCheck messages whose signatures do not verify. Clients
	// verify them regardless; this only keeps forgeries out early.
	VerifyPeer PeerVerifier
	// Workers is how many goroutines Result uses to expand masks; 0 or 1
	// uses the caller's goroutine only. Each extra worker holds its own
	// dim-sized accumulator.
	Workers int
}

// Server is the aggregator's side of one round. Feed it each stage's
// messages as they arrive and call CloseStage at the stage's deadline; the
// participants whose messages arrived in time are that stage's survivors.
// A refused message leaves the server as it was. When CloseStage finds that
// the round can no longer succeed it aborts it with ErrTooFewSurvivors and
// every later call returns ErrAborted. A Server is not safe for concurrent
// use.
type Server struct {
	r    *Round
	dim  int
	opts ServerOptions

	stage Stage
	err   error

	adv     []*pb.AdvertiseKeys // by participant; nil = did not advertise
	maskPub []*ecdh.PublicKey
	u1      []bool // advertised and kept
	sent    []bool // sent ShareKeys
	u2      []bool // shared and kept
	inbox   [][]relayed
	sum     []uint32
	inS     []bool // masked input arrived
	checks  []*pb.ConsistencyCheck
	u4      []bool
	u5      []bool
	seedSh  [][]share // by owner: self-mask seed shares
	keySh   [][]share // by owner: mask key shares
	result  []uint32
}

type relayed struct {
	from      uint32
	nonce, ct []byte
}

type share struct {
	x uint32
	y field.Element
}

// NewServer prepares the aggregator's side of round r for masked vectors of
// dim values.
func NewServer(r *Round, dim int, o ServerOptions) (*Server, error) {
	if r == nil {
		return nil, fmt.Errorf("secagg: server: %w: nil round", ErrConfig)
	}
	if dim < 1 || dim > MaxDim {
		return nil, fmt.Errorf("secagg: server: %w: dimension %d, want 1..%d", ErrConfig, dim, MaxDim)
	}
	if o.Workers < 0 || o.Workers > 256 {
		return nil, fmt.Errorf("secagg: server: %w: %d workers", ErrConfig, o.Workers)
	}
	n := r.n + 1
	return &Server{r: r, dim: dim, opts: o,
		adv: make([]*pb.AdvertiseKeys, n), maskPub: make([]*ecdh.PublicKey, n),
		u1: make([]bool, n), sent: make([]bool, n), u2: make([]bool, n), inbox: make([][]relayed, n),
		inS: make([]bool, n), checks: make([]*pb.ConsistencyCheck, n), u4: make([]bool, n), u5: make([]bool, n),
		seedSh: make([][]share, n), keySh: make([][]share, n)}, nil
}

// Stage returns the stage the server is collecting.
func (s *Server) Stage() Stage { return s.stage }

// Round returns the server's round.
func (s *Server) Round() *Round { return s.r }

// Dim returns the length of the masked vectors the server sums.
func (s *Server) Dim() int { return s.dim }

func (s *Server) enter(want Stage, op string) error {
	if s.err != nil {
		return fmt.Errorf("secagg: %s: %w: %w", op, ErrAborted, s.err)
	}
	if s.stage != want {
		return fmt.Errorf("secagg: %s: %w: server is at stage %s", op, ErrStage, s.stage)
	}
	return nil
}

// after checks that stage `closed` has been closed, for the replies built
// from it.
func (s *Server) after(closed Stage, op string) error {
	if s.err != nil {
		return fmt.Errorf("secagg: %s: %w: %w", op, ErrAborted, s.err)
	}
	if s.stage <= closed {
		return fmt.Errorf("secagg: %s: %w: stage %s still open", op, ErrStage, closed)
	}
	return nil
}

func (s *Server) header(op, task string, round uint64) error {
	if task != s.r.task || round != s.r.round {
		return fmt.Errorf("secagg: %s: %w: task %q round %d, want %q round %d", op, ErrWrongRound, task, round, s.r.task, s.r.round)
	}
	return nil
}

func (s *Server) member(set []bool, id uint32) bool { return s.r.valid(id) && set[id] }

func (s *Server) sender(op string, set []bool, id uint32) error {
	if !s.member(set, id) {
		return fmt.Errorf("secagg: %s: participant %d: %w", op, id, ErrNotParticipant)
	}
	return nil
}

// AddAdvertise records a stage 0 message.
func (s *Server) AddAdvertise(ak *pb.AdvertiseKeys) error {
	const op = "add advertise"
	if err := s.enter(StageAdvertise, op); err != nil {
		return err
	}
	if ak == nil {
		return fmt.Errorf("secagg: %s: %w: nil message", op, ErrMalformed)
	}
	if err := s.header(op, ak.TaskId, ak.Round); err != nil {
		return err
	}
	id := ak.ParticipantId
	if !s.r.valid(id) {
		return fmt.Errorf("secagg: %s: participant %d: %w", op, id, ErrNotParticipant)
	}
	if s.adv[id] != nil {
		return fmt.Errorf("secagg: %s: participant %d: %w", op, id, ErrDuplicate)
	}
	if _, err := parsePublic(ak.CipherPublicKey); err != nil {
		return fmt.Errorf("secagg: %s: participant %d: cipher key: %w", op, id, err)
	}
	mpub, err := parsePublic(ak.MaskPublicKey)
	if err != nil {
		return fmt.Errorf("secagg: %s: participant %d: mask key: %w", op, id, err)
	}
	if len(ak.Signature) != ed25519.SignatureSize || len(ak.KeyId) > 256 {
		return fmt.Errorf("secagg: %s: participant %d: %w: signature of %d bytes, key id of %d", op, id, ErrMalformed, len(ak.Signature), len(ak.KeyId))
	}
	if s.opts.VerifyPeer != nil {
		if err := s.opts.VerifyPeer(id, ak.KeyId, s.r.advertiseMessage(id, ak.CipherPublicKey, ak.MaskPublicKey), ak.Signature); err != nil {
			return fmt.Errorf("secagg: %s: participant %d: %w: %w", op, id, ErrForged, err)
		}
	}
	s.adv[id] = proto.Clone(ak).(*pb.AdvertiseKeys)
	s.maskPub[id] = mpub
	return nil
}

// CloseStage ends the current stage at its deadline and fixes its
// survivors. It fails with ErrTooFewSurvivors, aborting the round, when a
// participant whose secrets must be reconstructed can no longer reach
// threshold shares.
func (s *Server) CloseStage() error {
	const op = "close stage"
	if s.err != nil {
		return fmt.Errorf("secagg: %s: %w: %w", op, ErrAborted, s.err)
	}
	set, err := s.closing()
	if errors.Is(err, ErrStage) {
		return err
	}
	if err != nil {
		s.err = err
		return err
	}
	switch s.stage {
	case StageAdvertise:
		copy(s.u1, set)
	case StageShareKeys:
		copy(s.u2, set)
		s.sum = make([]uint32, s.dim)
	}
	s.stage++
	return nil
}

// Closable reports what CloseStage would do now, without doing it: how
// many participants the current stage would keep, or the error (wrapping
// ErrTooFewSurvivors) with which closing would abort the round. A caller
// deciding when to close a stage uses it to tell a stage that may close
// from one that would lose the round if closed now.
func (s *Server) Closable() (int, error) {
	const op = "closable"
	if s.err != nil {
		return 0, fmt.Errorf("secagg: %s: %w: %w", op, ErrAborted, s.err)
	}
	set, err := s.closing()
	if err != nil {
		return 0, err
	}
	kept := 0
	for id := 1; id <= s.r.n; id++ {
		if set[id] {
			kept++
		}
	}
	return kept, nil
}

// closing returns the participants the current stage would keep if it
// closed now and whether closing would abort the round; it changes nothing
// (the advertise and share stages' sets are pruned copies).
func (s *Server) closing() ([]bool, error) {
	switch s.stage {
	case StageAdvertise:
		set := make([]bool, s.r.n+1)
		for id := 1; id <= s.r.n; id++ {
			set[id] = s.adv[id] != nil
		}
		return set, s.prune(set, "advertised")
	case StageShareKeys:
		set := slices.Clone(s.sent)
		return set, s.prune(set, "shared keys")
	case StageMaskedInput:
		return s.inS, s.feasible(s.inS, "masked inputs")
	case StageConsistency:
		return s.u4, s.feasible(s.u4, "consistency checks")
	case StageUnmask:
		return s.u5, s.reconstructible()
	default:
		return nil, fmt.Errorf("secagg: close stage: %w: round is done", ErrStage)
	}
}

// prune drops, until none is left, every member of set with fewer than t
// neighbours in set: its secrets could never be reconstructed, and its
// neighbours will mask with it only if it stays.
func (s *Server) prune(set []bool, what string) error {
	for changed := true; changed; {
		changed = false
		for id := uint32(1); int(id) <= s.r.n; id++ {
			if set[id] && s.count(id, set) < s.r.t {
				set[id], changed = false, true
			}
		}
	}
	left := 0
	for id := 1; id <= s.r.n; id++ {
		if set[id] {
			left++
		}
	}
	if left == 0 {
		return fmt.Errorf("secagg: close stage: %w: no participant %s with threshold %d neighbours alongside", ErrTooFewSurvivors, what, s.r.t)
	}
	return nil
}

func (s *Server) count(id uint32, set []bool) int {
	c := 0
	for _, j := range s.r.Neighbours(id) {
		if set[j] {
			c++
		}
	}
	return c
}

// feasible checks that every secret the server will need keeps threshold
// neighbours in holders: the self-mask seed of each survivor and the mask
// key of each participant that shared but sent no masked input.
func (s *Server) feasible(holders []bool, what string) error {
	if s.stage == StageMaskedInput {
		any := false
		for id := 1; id <= s.r.n; id++ {
			any = any || s.inS[id]
		}
		if !any {
			return fmt.Errorf("secagg: close stage: %w: no masked inputs", ErrTooFewSurvivors)
		}
	}
	for id := uint32(1); int(id) <= s.r.n; id++ {
		if !s.u2[id] || (!s.inS[id] && s.count(id, s.inS) == 0) {
			continue
		}
		if c := s.count(id, holders); c < s.r.t {
			return fmt.Errorf("secagg: close stage: %w: participant %d has %d neighbours with %s, threshold %d",
				ErrTooFewSurvivors, id, c, what, s.r.t)
		}
	}
	return nil
}

// dropped reports whether id's mask key must be reconstructed: it shared
// but sent no masked input, and some survivor masked with it.
func (s *Server) dropped(id uint32) bool {
	return s.u2[id] && !s.inS[id] && s.count(id, s.inS) > 0
}

func (s *Server) reconstructible() error {
	for id := uint32(1); int(id) <= s.r.n; id++ {
		var got int
		switch {
		case s.inS[id]:
			got = len(s.seedSh[id])
		case s.dropped(id):
			got = len(s.keySh[id])
		default:
			continue
		}
		if got < s.r.t {
			return fmt.Errorf("secagg: close stage: %w: %d shares of participant %d's secret, threshold %d",
				ErrTooFewSurvivors, got, id, s.r.t)
		}
	}
	return nil
}

// PeerKeys is the reply to stage 0 for participant id: the advertisements
// of its neighbours that were kept.
func (s *Server) PeerKeys(id uint32) (*pb.PeerKeys, error) {
	const op = "peer keys"
	if err := s.after(StageAdvertise, op); err != nil {
		return nil, err
	}
	if err := s.sender(op, s.u1, id); err != nil {
		return nil, err
	}
	out := &pb.PeerKeys{TaskId: s.r.task, Round: s.r.round, ParticipantId: id}
	for _, j := range s.r.Neighbours(id) {
		if s.u1[j] {
			out.Peers = append(out.Peers, proto.Clone(s.adv[j]).(*pb.AdvertiseKeys))
		}
	}
	return out, nil
}

// AddShares records a stage 1 message. It must hold exactly one share for
// each neighbour listed in the sender's PeerKeys.
func (s *Server) AddShares(sk *pb.ShareKeys) error {
	const op = "add shares"
	if err := s.enter(StageShareKeys, op); err != nil {
		return err
	}
	if sk == nil {
		return fmt.Errorf("secagg: %s: %w: nil message", op, ErrMalformed)
	}
	if err := s.header(op, sk.TaskId, sk.Round); err != nil {
		return err
	}
	id := sk.ParticipantId
	if err := s.sender(op, s.u1, id); err != nil {
		return err
	}
	if s.sent[id] {
		return fmt.Errorf("secagg: %s: participant %d: %w", op, id, ErrDuplicate)
	}
	want := s.count(id, s.u1)
	if len(sk.Shares) != want {
		return fmt.Errorf("secagg: %s: participant %d: %w: %d shares for %d neighbours", op, id, ErrMalformed, len(sk.Shares), want)
	}
	seen := make(map[uint32]bool, want)
	for _, e := range sk.Shares {
		if e == nil {
			return fmt.Errorf("secagg: %s: participant %d: %w: nil share", op, id, ErrMalformed)
		}
		if e.SenderId != id {
			return fmt.Errorf("secagg: %s: participant %d: %w: share names sender %d", op, id, ErrMalformed, e.SenderId)
		}
		if !s.member(s.u1, e.ReceiverId) || !s.r.IsNeighbour(id, e.ReceiverId) {
			return fmt.Errorf("secagg: %s: participant %d: share for %d: %w", op, id, e.ReceiverId, ErrNotParticipant)
		}
		if seen[e.ReceiverId] {
			return fmt.Errorf("secagg: %s: participant %d: share for %d: %w", op, id, e.ReceiverId, ErrDuplicate)
		}
		seen[e.ReceiverId] = true
		if len(e.Nonce) != nonceSize || len(e.Ciphertext) != shareCipherLen {
			return fmt.Errorf("secagg: %s: participant %d: %w: nonce %d, ciphertext %d bytes", op, id, ErrMalformed, len(e.Nonce), len(e.Ciphertext))
		}
	}
	for _, e := range sk.Shares {
		s.inbox[e.ReceiverId] = append(s.inbox[e.ReceiverId], relayed{id, bytes.Clone(e.Nonce), bytes.Clone(e.Ciphertext)})
	}
	s.sent[id] = true
	return nil
}

// ForwardedShares is the reply to stage 1 for participant id: the shares
// its kept neighbours addressed to it.
func (s *Server) ForwardedShares(id uint32) (*pb.ForwardedShares, error) {
	const op = "forwarded shares"
	if err := s.after(StageShareKeys, op); err != nil {
		return nil, err
	}
	if err := s.sender(op, s.u2, id); err != nil {
		return nil, err
	}
	in := slices.Clone(s.inbox[id])
	slices.SortFunc(in, func(a, b relayed) int { return cmpID(a.from, b.from) })
	out := &pb.ForwardedShares{TaskId: s.r.task, Round: s.r.round, ParticipantId: id}
	for _, e := range in {
		if s.u2[e.from] {
			out.Shares = append(out.Shares, &pb.EncryptedShare{SenderId: e.from, ReceiverId: id,
				Nonce: bytes.Clone(e.nonce), Ciphertext: bytes.Clone(e.ct)})
		}
	}
	return out, nil
}

func cmpID(a, b uint32) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// AddMasked records a stage 2 masked update and adds it to the running
// sum. MaskedUpdate carries no task or round: the caller checks those on
// the UpdateReport that carried it.
func (s *Server) AddMasked(m *pb.MaskedUpdate) error {
	const op = "add masked"
	if err := s.enter(StageMaskedInput, op); err != nil {
		return err
	}
	if m == nil {
		return fmt.Errorf("secagg: %s: %w: nil message", op, ErrMalformed)
	}
	id := m.ParticipantId
	if err := s.sender(op, s.u2, id); err != nil {
		return err
	}
	if s.inS[id] {
		return fmt.Errorf("secagg: %s: participant %d: %w", op, id, ErrDuplicate)
	}
	if err := Unpack(m, s.r.bits, s.dim); err != nil {
		return fmt.Errorf("secagg: %s: participant %d: %w", op, id, err)
	}
	if int(m.Bits) != s.r.bits || len(m.Values) != s.dim {
		return fmt.Errorf("secagg: %s: participant %d: %w: %d values of %d bits, want %d of %d",
			op, id, ErrMalformed, len(m.Values), m.Bits, s.dim, s.r.bits)
	}
	mask := s.r.mask()
	for i, v := range m.Values {
		if v > mask {
			return fmt.Errorf("secagg: %s: participant %d: %w: value[%d] = %d is not below 2^%d", op, id, ErrMalformed, i, v, s.r.bits)
		}
	}
	sum := s.sum[:len(m.Values)]
	for i, v := range m.Values {
		sum[i] += v
	}
	s.inS[id] = true
	return nil
}

// Survivors returns, once the masked-input stage is closed, the
// participants whose updates the sum contains, in ascending order.
func (s *Server) Survivors() ([]uint32, error) {
	if err := s.after(StageMaskedInput, "survivors"); err != nil {
		return nil, err
	}
	var ids []uint32
	for id := uint32(1); int(id) <= s.r.n; id++ {
		if s.inS[id] {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// SurvivorSet is the reply to stage 2 for participant id.
func (s *Server) SurvivorSet(id uint32) (*pb.SurvivorSet, error) {
	const op = "survivor set"
	if err := s.after(StageMaskedInput, op); err != nil {
		return nil, err
	}
	if err := s.sender(op, s.inS, id); err != nil {
		return nil, err
	}
	ids, _ := s.Survivors()
	return &pb.SurvivorSet{TaskId: s.r.task, Round: s.r.round, ParticipantIds: ids}, nil
}

// AddConsistency records a stage 3 signature.
func (s *Server) AddConsistency(cc *pb.ConsistencyCheck) error {
	const op = "add consistency"
	if err := s.enter(StageConsistency, op); err != nil {
		return err
	}
	if cc == nil {
		return fmt.Errorf("secagg: %s: %w: nil message", op, ErrMalformed)
	}
	if err := s.header(op, cc.TaskId, cc.Round); err != nil {
		return err
	}
	id := cc.ParticipantId
	if err := s.sender(op, s.inS, id); err != nil {
		return err
	}
	if s.u4[id] {
		return fmt.Errorf("secagg: %s: participant %d: %w", op, id, ErrDuplicate)
	}
	if len(cc.Signature) != ed25519.SignatureSize || len(cc.KeyId) > 256 {
		return fmt.Errorf("secagg: %s: participant %d: %w: signature of %d bytes, key id of %d", op, id, ErrMalformed, len(cc.Signature), len(cc.KeyId))
	}
	if s.opts.VerifyPeer != nil {
		ids, _ := s.Survivors()
		if err := s.opts.VerifyPeer(id, cc.KeyId, s.r.consistencyMessage(id, ids), cc.Signature); err != nil {
			return fmt.Errorf("secagg: %s: participant %d: %w: %w", op, id, ErrForged, err)
		}
	}
	s.checks[id] = proto.Clone(cc).(*pb.ConsistencyCheck)
	s.u4[id] = true
	return nil
}

// requestLists returns what UnmaskRequest asks of participant id.
func (s *Server) requestLists(id uint32) (survivors, dropped []uint32) {
	for _, j := range s.r.Neighbours(id) {
		switch {
		case s.inS[j]:
			survivors = append(survivors, j)
		case s.u2[j]:
			dropped = append(dropped, j) // id itself survived and masked with j
		}
	}
	return survivors, dropped
}

// UnmaskRequest is the stage 4 request for participant id: self-mask seed
// shares of its surviving neighbours, mask key shares of its neighbours
// that shared but sent no masked input, and its neighbours' consistency
// signatures.
func (s *Server) UnmaskRequest(id uint32) (*pb.UnmaskRequest, error) {
	const op = "unmask request"
	if err := s.after(StageConsistency, op); err != nil {
		return nil, err
	}
	if err := s.sender(op, s.u4, id); err != nil {
		return nil, err
	}
	sv, dr := s.requestLists(id)
	out := &pb.UnmaskRequest{TaskId: s.r.task, Round: s.r.round, ParticipantId: id, SurvivorIds: sv, DroppedIds: dr}
	for _, j := range s.r.Neighbours(id) {
		if s.u4[j] {
			out.ConsistencyChecks = append(out.ConsistencyChecks, proto.Clone(s.checks[j]).(*pb.ConsistencyCheck))
		}
	}
	return out, nil
}

// AddUnmask records a stage 4 response. It must answer exactly the
// participant's UnmaskRequest.
func (s *Server) AddUnmask(resp *pb.UnmaskResponse) error {
	const op = "add unmask"
	if err := s.enter(StageUnmask, op); err != nil {
		return err
	}
	if resp == nil {
		return fmt.Errorf("secagg: %s: %w: nil message", op, ErrMalformed)
	}
	if err := s.header(op, resp.TaskId, resp.Round); err != nil {
		return err
	}
	id := resp.ParticipantId
	if err := s.sender(op, s.u4, id); err != nil {
		return err
	}
	if s.u5[id] {
		return fmt.Errorf("secagg: %s: participant %d: %w", op, id, ErrDuplicate)
	}
	sv, dr := s.requestLists(id)
	seeds, err := decodeShares(resp.SelfMaskShares, sv)
	if err != nil {
		return fmt.Errorf("secagg: %s: participant %d: self-mask shares: %w", op, id, err)
	}
	keys, err := decodeShares(resp.PairwiseKeyShares, dr)
	if err != nil {
		return fmt.Errorf("secagg: %s: participant %d: mask key shares: %w", op, id, err)
	}
	for i, owner := range sv {
		s.seedSh[owner] = append(s.seedSh[owner], share{id, seeds[i]})
	}
	for i, owner := range dr {
		s.keySh[owner] = append(s.keySh[owner], share{id, keys[i]})
	}
	s.u5[id] = true
	return nil
}

func decodeShares(got []*pb.PeerShare, want []uint32) ([]field.Element, error) {
	if len(got) != len(want) {
		return nil, fmt.Errorf("%w: %d shares, requested %d", ErrMalformed, len(got), len(want))
	}
	out := make([]field.Element, len(got))
	for i, ps := range got {
		if ps == nil || ps.OwnerId != want[i] {
			return nil, fmt.Errorf("%w: share %d is not for participant %d", ErrMalformed, i, want[i])
		}
		if err := out[i].SetBytes(ps.Share); err != nil {
			return nil, fmt.Errorf("%w: share of %d: %v", ErrMalformed, want[i], err)
		}
	}
	return out, nil
}

// Result returns the sum of the survivors' inputs modulo 2^bits once the
// unmask stage is closed. It reconstructs each survivor's self-mask seed
// and each dropped participant's mask key from threshold shares and removes
// their masks; a reconstructed key that does not match its advertisement
// (a participant sent a bad share) fails with ErrForged and aborts the
// round.
func (s *Server) Result() ([]uint32, error) {
	const op = "result"
	if s.err != nil {
		return nil, fmt.Errorf("secagg: %s: %w: %w", op, ErrAborted, s.err)
	}
	if s.stage != StageDone {
		return nil, fmt.Errorf("secagg: %s: %w: server is at stage %s", op, ErrStage, s.stage)
	}
	if s.result != nil {
		return slices.Clone(s.result), nil
	}
	var jobs []uint32
	for id := uint32(1); int(id) <= s.r.n; id++ {
		if s.inS[id] || s.dropped(id) {
			jobs = append(jobs, id)
		}
	}
	workers := max(1, min(s.opts.Workers, len(jobs)))
	accs := make([][]uint32, workers)
	accs[0] = s.sum
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := 1; w < workers; w++ {
		accs[w] = make([]uint32, s.dim)
		wg.Go(func() { errs[w] = s.unmaskJobs(jobs, w, workers, accs[w]) })
	}
	errs[0] = s.unmaskJobs(jobs, 0, workers, accs[0])
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			s.err = err
			return nil, err
		}
	}
	for _, a := range accs[1:] {
		for i, v := range a {
			s.sum[i] += v
		}
	}
	m := s.r.mask()
	for i := range s.sum {
		s.sum[i] &= m
	}
	s.result = s.sum
	return slices.Clone(s.result), nil
}

// unmaskJobs runs every stride-th job from first on acc.
func (s *Server) unmaskJobs(jobs []uint32, first, stride int, acc []uint32) error {
	buf := make([]byte, prgChunk)
	for i := first; i < len(jobs); i += stride {
		if err := s.unmaskOne(jobs[i], acc, buf); err != nil {
			return err
		}
	}
	return nil
}

// unmaskOne removes participant id's self mask (survivor) or the pairwise
// masks survivors added with it (dropped) from acc.
func (s *Server) unmaskOne(id uint32, acc []uint32, buf []byte) error {
	if s.inS[id] {
		seed, err := combine(s.seedSh[id], s.r.t)
		if err != nil {
			return fmt.Errorf("secagg: result: participant %d seed: %w", id, err)
		}
		b := seed.Bytes()
		key := s.r.selfSeed(b[:], id)
		addPRG(acc, &key, true, buf)
		return nil
	}
	sk, err := combine(s.keySh[id], s.r.t)
	if err != nil {
		return fmt.Errorf("secagg: result: participant %d mask key: %w", id, err)
	}
	b := sk.Bytes()
	priv, err := x25519Private(b[:])
	if err != nil || !bytes.Equal(priv.PublicKey().Bytes(), s.adv[id].MaskPublicKey) {
		return fmt.Errorf("secagg: result: participant %d: %w: reconstructed mask key does not match its advertisement", id, ErrForged)
	}
	for _, j := range s.r.Neighbours(id) {
		if !s.inS[j] {
			continue
		}
		shared, err := priv.ECDH(s.maskPub[j])
		if err != nil {
			return fmt.Errorf("secagg: result: participant %d with %d: %w: %v", id, j, ErrMalformed, err)
		}
		seed := s.r.pairSeed(shared, id, j)
		// Survivor j added the mask if j < id and subtracted it otherwise.
		addPRG(acc, &seed, j < id, buf)
	}
	return nil
}

// combine reconstructs from the t shares with the lowest x-coordinates.
func combine(sh []share, t int) (field.Element, error) {
	sh = slices.Clone(sh)
	slices.SortFunc(sh, func(a, b share) int { return cmpID(a.x, b.x) })
	xs := make([]uint32, t)
	ys := make([]field.Element, t)
	for i := range t {
		xs[i], ys[i] = sh[i].x, sh[i].y
	}
	v, err := shamir.Combine(xs, ys)
	if err != nil {
		return v, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return v, nil
}
