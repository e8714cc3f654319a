package secagg

import (
	"crypto/ecdh"
	"crypto/ed25519"
	"encoding/binary"
	"fmt"
	"io"
	"slices"

	"github.com/fleetlearn/fleetlearn/privacy/secagg/internal/field"
	"github.com/fleetlearn/fleetlearn/privacy/secagg/internal/shamir"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// ClientOptions are a device's identity and randomness for one round. All
// fields but KeyID are required.
type ClientOptions struct {
	// ParticipantID is the device's number from RoundPlan.participant_id.
	ParticipantID uint32
	// Rand supplies every secret: key pairs, mask seeds, Shamir
	// coefficients and nonces. Use crypto/rand.Reader outside tests.
	Rand io.Reader
	// Identity is the device's enrolled Ed25519 key; it signs AdvertiseKeys
	// and ConsistencyCheck.
	Identity ed25519.PrivateKey
	// KeyID names Identity in the messages' key_id fields.
	KeyID string
	// VerifyPeer checks peers' signatures against their enrolled keys.
	VerifyPeer PeerVerifier
	// MinSurvivors is the fewest participants a survivor set may name for
	// this client to sign it (and so ever to unmask): the device's own
	// floor on how many inputs the sum it helps reveal must hold, such as
	// the contributors distributed DP noise was split across. 0 leaves
	// only the threshold's floor (t surviving neighbours); at most the
	// cohort size.
	MinSurvivors int
}

type clientStage int

const (
	clientNew clientStage = iota
	clientAdvertised
	clientShared
	clientMasked
	clientChecked
	clientDone
)

var clientStageNames = [...]string{"advertise", "share keys", "masked input", "consistency", "unmask", "done"}

// Client is one device's side of a round. Call its methods in stage order,
// each at most once: Advertise, ShareKeys, MaskedInput, Consistency,
// Unmask. A method that refuses its message leaves the client as it was, so
// a corrected message may follow, except when the refusal wraps ErrForged,
// ErrDoubleShareRequest or ErrTooFewSurvivors: those end the client's round
// and every later call returns ErrAborted. A Client is not safe for
// concurrent use.
type Client struct {
	r      *Round
	id     uint32
	rand   io.Reader
	ident  ed25519.PrivateKey
	keyID  string
	verify PeerVerifier
	// minSurvivors is ClientOptions.MinSurvivors.
	minSurvivors int

	stage clientStage
	err   error

	cipherKey *ecdh.PrivateKey
	maskKey   *ecdh.PrivateKey
	maskSK    field.Element // the mask private key as a field element
	seed      field.Element // self-mask seed b

	peers     map[uint32]*clientPeer // neighbours that advertised
	sharers   []uint32               // neighbours whose shares arrived, ascending
	survivors map[uint32]bool        // the survivor set this client signed
}

type clientPeer struct {
	recvKey   [32]byte // AES-GCM key of shares from the peer
	pairSeed  [32]byte
	keyShare  [shareSize]byte // this client's share of the peer's mask key
	seedShare [shareSize]byte // and of its self-mask seed
}

// NewClient prepares participant o.ParticipantID's side of round r.
func NewClient(r *Round, o ClientOptions) (*Client, error) {
	switch {
	case r == nil:
		return nil, fmt.Errorf("secagg: client: %w: nil round", ErrConfig)
	case !r.valid(o.ParticipantID):
		return nil, fmt.Errorf("secagg: client: %w: participant %d of %d", ErrConfig, o.ParticipantID, r.n)
	case o.Rand == nil:
		return nil, fmt.Errorf("secagg: client: %w: no randomness", ErrConfig)
	case len(o.Identity) != ed25519.PrivateKeySize:
		return nil, fmt.Errorf("secagg: client: %w: identity key of %d bytes", ErrConfig, len(o.Identity))
	case o.VerifyPeer == nil:
		return nil, fmt.Errorf("secagg: client: %w: no peer verifier", ErrConfig)
	case o.MinSurvivors < 0 || o.MinSurvivors > r.n:
		return nil, fmt.Errorf("secagg: client: %w: minimum of %d survivors in a cohort of %d", ErrConfig, o.MinSurvivors, r.n)
	}
	return &Client{r: r, id: o.ParticipantID, rand: o.Rand, ident: o.Identity, keyID: o.KeyID, verify: o.VerifyPeer,
		minSurvivors: o.MinSurvivors}, nil
}

// ParticipantID returns the client's participant number.
func (c *Client) ParticipantID() uint32 { return c.id }

func (c *Client) enter(want clientStage, op string) error {
	if c.err != nil {
		return fmt.Errorf("secagg: %s: %w: %w", op, ErrAborted, c.err)
	}
	if c.stage != want {
		return fmt.Errorf("secagg: %s: %w: client is at stage %s", op, ErrStage, clientStageNames[c.stage])
	}
	return nil
}

// abort ends the client's round and forgets its secrets.
func (c *Client) abort(err error) error {
	c.err = err
	c.forget()
	c.peers = nil
	return err
}

func (c *Client) forget() {
	c.cipherKey, c.maskKey = nil, nil
	c.maskSK, c.seed = field.Element{}, field.Element{}
}

func (c *Client) header(op, task string, round uint64, recipient uint32) error {
	if task != c.r.task || round != c.r.round {
		return fmt.Errorf("secagg: %s: %w: task %q round %d, want %q round %d", op, ErrWrongRound, task, round, c.r.task, c.r.round)
	}
	if recipient != c.id {
		return fmt.Errorf("secagg: %s: %w: addressed to participant %d, this is %d", op, ErrWrongRound, recipient, c.id)
	}
	return nil
}

// Advertise is stage 0: it makes the round's two X25519 key pairs and the
// self-mask seed and returns the signed advertisement for the server.
func (c *Client) Advertise() (*pb.AdvertiseKeys, error) {
	const op = "advertise"
	if err := c.enter(clientNew, op); err != nil {
		return nil, err
	}
	cb := make([]byte, 32)
	if _, err := io.ReadFull(c.rand, cb); err != nil {
		return nil, fmt.Errorf("secagg: %s: random: %w", op, err)
	}
	cipherKey, err := x25519Private(cb)
	if err != nil {
		return nil, fmt.Errorf("secagg: %s: %w", op, err)
	}
	maskSK, mb, err := shamir.RandomElement(c.rand)
	if err != nil {
		return nil, fmt.Errorf("secagg: %s: %w", op, err)
	}
	maskKey, err := x25519Private(mb)
	if err != nil {
		return nil, fmt.Errorf("secagg: %s: %w", op, err)
	}
	seed, _, err := shamir.RandomElement(c.rand)
	if err != nil {
		return nil, fmt.Errorf("secagg: %s: %w", op, err)
	}
	cpub, mpub := cipherKey.PublicKey().Bytes(), maskKey.PublicKey().Bytes()
	sig := ed25519.Sign(c.ident, c.r.advertiseMessage(c.id, cpub, mpub))
	c.cipherKey, c.maskKey, c.maskSK, c.seed = cipherKey, maskKey, maskSK, seed
	c.stage = clientAdvertised
	return &pb.AdvertiseKeys{TaskId: c.r.task, Round: c.r.round, ParticipantId: c.id,
		CipherPublicKey: cpub, MaskPublicKey: mpub, Signature: sig, KeyId: c.keyID}, nil
}

// ShareKeys is stage 1: it checks every neighbour's signed keys in pk,
// refusing a substituted key with ErrForged, and returns one encrypted
// share of each of its two secrets per neighbour. Fewer than threshold
// neighbours give ErrTooFewSurvivors.
func (c *Client) ShareKeys(pk *pb.PeerKeys) (*pb.ShareKeys, error) {
	const op = "share keys"
	if err := c.enter(clientAdvertised, op); err != nil {
		return nil, err
	}
	if pk == nil {
		return nil, fmt.Errorf("secagg: %s: %w: nil PeerKeys", op, ErrMalformed)
	}
	if err := c.header(op, pk.TaskId, pk.Round, pk.ParticipantId); err != nil {
		return nil, err
	}
	if len(pk.Peers) > c.r.k {
		return nil, fmt.Errorf("secagg: %s: %w: %d peers for %d neighbours", op, ErrMalformed, len(pk.Peers), c.r.k)
	}
	type adv struct {
		id               uint32
		cipher, maskPub  *ecdh.PublicKey
		keyID            string
		sig, cpub, mpubB []byte
	}
	advs := make([]adv, 0, len(pk.Peers))
	seen := make(map[uint32]bool, len(pk.Peers))
	for _, ak := range pk.Peers {
		if ak == nil {
			return nil, fmt.Errorf("secagg: %s: %w: nil peer", op, ErrMalformed)
		}
		id := ak.ParticipantId
		if ak.TaskId != c.r.task || ak.Round != c.r.round {
			return nil, fmt.Errorf("secagg: %s: peer %d: %w", op, id, ErrWrongRound)
		}
		if !c.r.IsNeighbour(c.id, id) {
			return nil, fmt.Errorf("secagg: %s: peer %d: %w: not a neighbour of %d", op, id, ErrNotParticipant, c.id)
		}
		if seen[id] {
			return nil, fmt.Errorf("secagg: %s: peer %d: %w", op, id, ErrDuplicate)
		}
		seen[id] = true
		cpub, err := parsePublic(ak.CipherPublicKey)
		if err != nil {
			return nil, fmt.Errorf("secagg: %s: peer %d: cipher key: %w", op, id, err)
		}
		mpub, err := parsePublic(ak.MaskPublicKey)
		if err != nil {
			return nil, fmt.Errorf("secagg: %s: peer %d: mask key: %w", op, id, err)
		}
		if len(ak.Signature) != ed25519.SignatureSize {
			return nil, fmt.Errorf("secagg: %s: peer %d: %w: signature of %d bytes", op, id, ErrMalformed, len(ak.Signature))
		}
		advs = append(advs, adv{id, cpub, mpub, ak.KeyId, ak.Signature, ak.CipherPublicKey, ak.MaskPublicKey})
	}
	// Signatures last: a bad one ends the round, so every cheaper refusal
	// above must not depend on them.
	for _, a := range advs {
		if err := c.verify(a.id, a.keyID, c.r.advertiseMessage(a.id, a.cpub, a.mpubB), a.sig); err != nil {
			return nil, c.abort(fmt.Errorf("secagg: %s: peer %d keys: %w: %w", op, a.id, ErrForged, err))
		}
	}
	if len(advs) < c.r.t {
		return nil, c.abort(fmt.Errorf("secagg: %s: %w: %d neighbours advertised, threshold %d", op, ErrTooFewSurvivors, len(advs), c.r.t))
	}
	slices.SortFunc(advs, func(a, b adv) int { return cmpID(a.id, b.id) })
	xs := make([]uint32, len(advs))
	peers := make(map[uint32]*clientPeer, len(advs))
	out := &pb.ShareKeys{TaskId: c.r.task, Round: c.r.round, ParticipantId: c.id,
		Shares: make([]*pb.EncryptedShare, 0, len(advs))}
	sendKeys := make([][32]byte, len(advs))
	for i, a := range advs {
		xs[i] = a.id
		shared, err := c.cipherKey.ECDH(a.cipher)
		if err != nil {
			return nil, fmt.Errorf("secagg: %s: peer %d: %w: cipher key agreement: %v", op, a.id, ErrMalformed, err)
		}
		mshared, err := c.maskKey.ECDH(a.maskPub)
		if err != nil {
			return nil, fmt.Errorf("secagg: %s: peer %d: %w: mask key agreement: %v", op, a.id, ErrMalformed, err)
		}
		sendKeys[i] = c.r.shareKey(shared, c.id, a.id)
		peers[a.id] = &clientPeer{recvKey: c.r.shareKey(shared, a.id, c.id), pairSeed: c.r.pairSeed(mshared, c.id, a.id)}
	}
	keyShares, err := shamir.Split(&c.maskSK, xs, c.r.t, c.rand)
	if err != nil {
		return nil, fmt.Errorf("secagg: %s: %w", op, err)
	}
	seedShares, err := shamir.Split(&c.seed, xs, c.r.t, c.rand)
	if err != nil {
		return nil, fmt.Errorf("secagg: %s: %w", op, err)
	}
	for i, x := range xs {
		pt := make([]byte, 0, sharePlainSize)
		pt = binary.BigEndian.AppendUint32(pt, c.id)
		pt = binary.BigEndian.AppendUint32(pt, x)
		ks, ss := keyShares[i].Bytes(), seedShares[i].Bytes()
		pt = append(append(pt, ks[:]...), ss[:]...)
		nonce := make([]byte, nonceSize)
		if _, err := io.ReadFull(c.rand, nonce); err != nil {
			return nil, fmt.Errorf("secagg: %s: random: %w", op, err)
		}
		ct := gcm(sendKeys[i]).Seal(nil, nonce, pt, c.r.shareAD(c.id, x))
		clear(pt)
		out.Shares = append(out.Shares, &pb.EncryptedShare{SenderId: c.id, ReceiverId: x, Nonce: nonce, Ciphertext: ct})
	}
	c.peers = peers
	c.cipherKey, c.maskKey = nil, nil
	c.stage = clientShared
	return out, nil
}

func parsePublic(b []byte) (*ecdh.PublicKey, error) {
	if len(b) != publicKeySize {
		return nil, fmt.Errorf("%w: public key of %d bytes", ErrMalformed, len(b))
	}
	k, err := ecdh.X25519().NewPublicKey(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return k, nil
}

// MaskedInput is stage 2: it decrypts the shares its neighbours sent and
// returns input masked with the self mask and one pairwise mask per
// neighbour that shared. input is the quantized update, each value below
// 2^bits (see Quantizer); the server expects the round's dimension.
func (c *Client) MaskedInput(fs *pb.ForwardedShares, input []uint32) (*pb.MaskedUpdate, error) {
	const op = "masked input"
	if err := c.enter(clientShared, op); err != nil {
		return nil, err
	}
	if fs == nil {
		return nil, fmt.Errorf("secagg: %s: %w: nil ForwardedShares", op, ErrMalformed)
	}
	if err := c.header(op, fs.TaskId, fs.Round, fs.ParticipantId); err != nil {
		return nil, err
	}
	if len(input) == 0 || len(input) > MaxDim {
		return nil, fmt.Errorf("secagg: %s: %w: input of %d values, want 1..%d", op, ErrMalformed, len(input), MaxDim)
	}
	m := c.r.mask()
	for i, v := range input {
		if v > m {
			return nil, fmt.Errorf("secagg: %s: %w: input[%d] = %d is not below 2^%d", op, ErrMalformed, i, v, c.r.bits)
		}
	}
	if len(fs.Shares) > len(c.peers) {
		return nil, fmt.Errorf("secagg: %s: %w: %d shares from %d peers", op, ErrMalformed, len(fs.Shares), len(c.peers))
	}
	type opened struct {
		from      uint32
		key, seed [shareSize]byte
	}
	got := make([]opened, 0, len(fs.Shares))
	seen := make(map[uint32]bool, len(fs.Shares))
	for _, s := range fs.Shares {
		if s == nil {
			return nil, fmt.Errorf("secagg: %s: %w: nil share", op, ErrMalformed)
		}
		if s.ReceiverId != c.id {
			return nil, fmt.Errorf("secagg: %s: share from %d: %w: for participant %d", op, s.SenderId, ErrWrongRound, s.ReceiverId)
		}
		p, ok := c.peers[s.SenderId]
		if !ok {
			return nil, fmt.Errorf("secagg: %s: share from %d: %w", op, s.SenderId, ErrNotParticipant)
		}
		if seen[s.SenderId] {
			return nil, fmt.Errorf("secagg: %s: share from %d: %w", op, s.SenderId, ErrDuplicate)
		}
		seen[s.SenderId] = true
		if len(s.Nonce) != nonceSize || len(s.Ciphertext) != shareCipherLen {
			return nil, fmt.Errorf("secagg: %s: share from %d: %w: nonce %d, ciphertext %d bytes", op, s.SenderId, ErrMalformed, len(s.Nonce), len(s.Ciphertext))
		}
		pt, err := gcm(p.recvKey).Open(nil, s.Nonce, s.Ciphertext, c.r.shareAD(s.SenderId, c.id))
		if err != nil {
			return nil, c.abort(fmt.Errorf("secagg: %s: share from %d: %w: %v", op, s.SenderId, ErrForged, err))
		}
		if binary.BigEndian.Uint32(pt[0:]) != s.SenderId || binary.BigEndian.Uint32(pt[4:]) != c.id {
			return nil, c.abort(fmt.Errorf("secagg: %s: share from %d: %w: plaintext names %d → %d", op, s.SenderId, ErrForged,
				binary.BigEndian.Uint32(pt[0:]), binary.BigEndian.Uint32(pt[4:])))
		}
		var o opened
		o.from = s.SenderId
		copy(o.key[:], pt[8:40])
		copy(o.seed[:], pt[40:72])
		clear(pt)
		var e field.Element
		if e.SetBytes(o.key[:]) != nil || e.SetBytes(o.seed[:]) != nil {
			return nil, fmt.Errorf("secagg: %s: share from %d: %w: share is not a field element", op, s.SenderId, ErrMalformed)
		}
		got = append(got, o)
	}
	if len(got) < c.r.t {
		return nil, c.abort(fmt.Errorf("secagg: %s: %w: shares from %d neighbours, threshold %d", op, ErrTooFewSurvivors, len(got), c.r.t))
	}
	slices.SortFunc(got, func(a, b opened) int { return cmpID(a.from, b.from) })

	y := slices.Clone(input)
	buf := make([]byte, prgChunk)
	seedBytes := c.seed.Bytes()
	self := c.r.selfSeed(seedBytes[:], c.id)
	addPRG(y, &self, false, buf)
	sharers := make([]uint32, len(got))
	for i, o := range got {
		p := c.peers[o.from]
		// The lower-numbered participant adds the pairwise mask and the
		// higher one subtracts it, so each pair cancels in the sum.
		addPRG(y, &p.pairSeed, c.id > o.from, buf)
		p.keyShare, p.seedShare = o.key, o.seed
		sharers[i] = o.from
	}
	for i := range y {
		y[i] &= m
	}
	for _, p := range c.peers {
		p.pairSeed, p.recvKey = [32]byte{}, [32]byte{}
	}
	c.forget()
	c.sharers = sharers
	c.stage = clientMasked
	return &pb.MaskedUpdate{ParticipantId: c.id, Bits: uint32(c.r.bits), Values: y}, nil
}

// Consistency is stage 3: it checks the survivor set and returns its
// signature over it. The set must contain this client, at least
// threshold of its neighbours, all of whom shared with it, and at least
// ClientOptions.MinSurvivors participants.
func (c *Client) Consistency(ss *pb.SurvivorSet) (*pb.ConsistencyCheck, error) {
	const op = "consistency"
	if err := c.enter(clientMasked, op); err != nil {
		return nil, err
	}
	if ss == nil {
		return nil, fmt.Errorf("secagg: %s: %w: nil SurvivorSet", op, ErrMalformed)
	}
	if err := c.header(op, ss.TaskId, ss.Round, c.id); err != nil {
		return nil, err
	}
	if err := c.ascending(ss.ParticipantIds); err != nil {
		return nil, fmt.Errorf("secagg: %s: survivors: %w", op, err)
	}
	set := make(map[uint32]bool, len(ss.ParticipantIds))
	for _, id := range ss.ParticipantIds {
		set[id] = true
	}
	if !set[c.id] {
		return nil, fmt.Errorf("secagg: %s: %w: survivor set omits participant %d", op, ErrNotParticipant, c.id)
	}
	if len(set) < c.minSurvivors {
		// A server that calls most of the cohort dropped leaves a sum of
		// few inputs, colluders' among them: never help reveal it.
		return nil, c.abort(fmt.Errorf("secagg: %s: %w: %d survivors, this device unmasks sums of at least %d",
			op, ErrTooFewSurvivors, len(set), c.minSurvivors))
	}
	shared := make(map[uint32]bool, len(c.sharers))
	for _, id := range c.sharers {
		shared[id] = true
	}
	nbr := 0
	for _, id := range ss.ParticipantIds {
		if c.r.IsNeighbour(c.id, id) {
			if !shared[id] {
				return nil, fmt.Errorf("secagg: %s: %w: survivor %d never shared with participant %d", op, ErrMalformed, id, c.id)
			}
			nbr++
		}
	}
	if nbr < c.r.t {
		return nil, c.abort(fmt.Errorf("secagg: %s: %w: %d surviving neighbours, threshold %d", op, ErrTooFewSurvivors, nbr, c.r.t))
	}
	sig := ed25519.Sign(c.ident, c.r.consistencyMessage(c.id, ss.ParticipantIds))
	c.survivors = set
	c.stage = clientChecked
	return &pb.ConsistencyCheck{TaskId: c.r.task, Round: c.r.round, ParticipantId: c.id, Signature: sig, KeyId: c.keyID}, nil
}

// ascending checks that ids are valid participant numbers in strictly
// ascending order.
func (c *Client) ascending(ids []uint32) error { return ascending(c.r, ids) }

func ascending(r *Round, ids []uint32) error {
	if len(ids) > r.n {
		return fmt.Errorf("%w: %d ids for %d participants", ErrMalformed, len(ids), r.n)
	}
	var prev uint32
	for _, id := range ids {
		if !r.valid(id) || id <= prev {
			return fmt.Errorf("%w: id %d not ascending in 1..%d", ErrMalformed, id, r.n)
		}
		prev = id
	}
	return nil
}

// Unmask is stage 4: it checks the request against the survivor set this
// client signed and returns, per peer, either the self-mask seed share
// (peer survived) or the mask key share (peer dropped), never both. A
// request for both, or one contradicting the signed set, fails with
// ErrDoubleShareRequest; fewer than threshold valid consistency signatures
// from neighbours fail with ErrTooFewSurvivors.
func (c *Client) Unmask(req *pb.UnmaskRequest) (*pb.UnmaskResponse, error) {
	const op = "unmask"
	if err := c.enter(clientChecked, op); err != nil {
		return nil, err
	}
	if req == nil {
		return nil, fmt.Errorf("secagg: %s: %w: nil UnmaskRequest", op, ErrMalformed)
	}
	if err := c.header(op, req.TaskId, req.Round, req.ParticipantId); err != nil {
		return nil, err
	}
	if err := c.ascending(req.SurvivorIds); err != nil {
		return nil, fmt.Errorf("secagg: %s: survivor ids: %w", op, err)
	}
	if err := c.ascending(req.DroppedIds); err != nil {
		return nil, fmt.Errorf("secagg: %s: dropped ids: %w", op, err)
	}
	asked := make(map[uint32]bool, len(req.SurvivorIds))
	for _, id := range req.SurvivorIds {
		asked[id] = true
		if !c.survivors[id] {
			return nil, c.abort(fmt.Errorf("secagg: %s: %w: self-mask share of %d, which is not in the signed survivor set", op, ErrDoubleShareRequest, id))
		}
	}
	for _, id := range req.DroppedIds {
		if asked[id] {
			return nil, c.abort(fmt.Errorf("secagg: %s: %w: both shares of %d", op, ErrDoubleShareRequest, id))
		}
		if c.survivors[id] {
			return nil, c.abort(fmt.Errorf("secagg: %s: %w: mask key share of %d, which is in the signed survivor set", op, ErrDoubleShareRequest, id))
		}
	}
	held := make(map[uint32]bool, len(c.sharers))
	for _, id := range c.sharers {
		held[id] = true
	}
	for _, ids := range [][]uint32{req.SurvivorIds, req.DroppedIds} {
		for _, id := range ids {
			if !held[id] {
				return nil, fmt.Errorf("secagg: %s: %w: holds no share of %d", op, ErrNotParticipant, id)
			}
		}
	}
	// Signers are checked over the set this client signed, so a server
	// that showed other neighbours another set cannot gather t of them.
	survivors := make([]uint32, 0, len(c.survivors))
	for id := range c.survivors {
		survivors = append(survivors, id)
	}
	slices.Sort(survivors)
	type check struct {
		id         uint32
		keyID      string
		sig        []byte
		neighbours bool
	}
	checks := make([]check, 0, len(req.ConsistencyChecks))
	signed := make(map[uint32]bool, len(req.ConsistencyChecks))
	for _, cc := range req.ConsistencyChecks {
		if cc == nil {
			return nil, fmt.Errorf("secagg: %s: %w: nil consistency check", op, ErrMalformed)
		}
		if cc.TaskId != c.r.task || cc.Round != c.r.round {
			return nil, fmt.Errorf("secagg: %s: check by %d: %w", op, cc.ParticipantId, ErrWrongRound)
		}
		if signed[cc.ParticipantId] {
			return nil, fmt.Errorf("secagg: %s: check by %d: %w", op, cc.ParticipantId, ErrDuplicate)
		}
		signed[cc.ParticipantId] = true
		if !c.survivors[cc.ParticipantId] {
			return nil, fmt.Errorf("secagg: %s: check by %d: %w: signer is not a survivor", op, cc.ParticipantId, ErrNotParticipant)
		}
		checks = append(checks, check{cc.ParticipantId, cc.KeyId, cc.Signature, c.r.IsNeighbour(c.id, cc.ParticipantId)})
	}
	valid := 0
	for _, ch := range checks {
		if !ch.neighbours {
			continue // only neighbours count towards t; others need no key
		}
		if err := c.verify(ch.id, ch.keyID, c.r.consistencyMessage(ch.id, survivors), ch.sig); err != nil {
			return nil, c.abort(fmt.Errorf("secagg: %s: check by %d: %w: %w", op, ch.id, ErrForged, err))
		}
		valid++
	}
	if valid < c.r.t {
		return nil, c.abort(fmt.Errorf("secagg: %s: %w: %d neighbours confirmed the survivor set, threshold %d", op, ErrTooFewSurvivors, valid, c.r.t))
	}
	out := &pb.UnmaskResponse{TaskId: c.r.task, Round: c.r.round, ParticipantId: c.id,
		SelfMaskShares:    make([]*pb.PeerShare, 0, len(req.SurvivorIds)),
		PairwiseKeyShares: make([]*pb.PeerShare, 0, len(req.DroppedIds))}
	for _, id := range req.SurvivorIds {
		s := c.peers[id].seedShare
		out.SelfMaskShares = append(out.SelfMaskShares, &pb.PeerShare{OwnerId: id, Share: s[:]})
	}
	for _, id := range req.DroppedIds {
		s := c.peers[id].keyShare
		out.PairwiseKeyShares = append(out.PairwiseKeyShares, &pb.PeerShare{OwnerId: id, Share: s[:]})
	}
	c.peers = nil
	c.stage = clientDone
	return out, nil
}
