package edge

import (
	"context"
	"crypto/ed25519"
	crand "crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"slices"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/devproto"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/privacy/dp"
	"github.com/fleetlearn/fleetlearn/privacy/secagg"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/privacyconf"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/wasm"
)

// Stages at which WithDropout may make a device vanish from a secure round.
const (
	DropAfterAdvertise = "advertise" // after uploading its keys
	DropAfterShares    = "shares"    // after uploading its key shares
	DropAfterMasked    = "masked"    // after uploading its masked update
)

// WithDropout makes the agent vanish from a secure round at a stage when
// drop(task, round, stage) says so: it stops answering, as a device that lost
// power would. It exists to rehearse dropout recovery in simulations and
// tests; real agents leave it unset.
func WithDropout(drop func(task string, round uint64, stage string) bool) Option {
	return func(o *options) { o.dropout = drop }
}

// errDroppedOut marks a round this agent left on purpose (WithDropout): the
// protocol neither retries nor reports it.
var errDroppedOut = fmt.Errorf("simulated dropout: %w", devproto.ErrLeft)

// secureRound takes part in a secure aggregation round: it advertises keys,
// shares them with its graph neighbours, then trains and uploads its
// quantized update masked, and helps unmask the sum. The upload (r.Publish)
// outlives a later round's announcement; the rest ends with ctx.
func (a *Agent) secureRound(ctx context.Context, r *devproto.Round, mod *wasm.Module, call wasm.Call) error {
	plan, nc := r.Plan, r.Conn()
	cfg := plan.GetSecagg()
	n := int(cfg.GetNumParticipants())
	// The device's SecAgg+ instance is its group's when the cohort is split
	// (privacyconf.GroupSizes); its encoding is sized by the whole cohort
	// n, since the groups' sums add up to the round's.
	round, err := privacyconf.DeviceRound(cfg, plan.TaskId, plan.Round)
	if err != nil {
		return fmt.Errorf("secure round: %w", err)
	}
	_, upd, err := trainable(plan, call.Model)
	if err != nil {
		return err
	}
	encode, err := a.secureEncoder(plan, upd, round.Bits(), n)
	if err != nil {
		return fmt.Errorf("secure round: %w", err)
	}
	// Peers' identity keys as the server relays them with their
	// advertisements (docs/SECAGG.md: until enrollment certifies them, they
	// rest on the server being honest about who is who).
	peerKeys := map[uint32]ed25519.PublicKey{}
	verify := func(p uint32, _ string, msg, sig []byte) error {
		k, ok := peerKeys[p]
		if !ok || !ed25519.Verify(k, msg, sig) {
			return fmt.Errorf("participant %d: signature does not verify", p)
		}
		return nil
	}
	client, err := secagg.NewClient(round, secagg.ClientOptions{ParticipantID: plan.ParticipantId, Rand: crand.Reader,
		Identity: a.identity, KeyID: a.key.ID(), VerifyPeer: verify, MinSurvivors: minSurvivors(plan, n)})
	if err != nil {
		return fmt.Errorf("secure round: %w", err)
	}
	down := make(chan *nats.Msg, 8)
	sub, err := nc.ChanSubscribe(wire.SecAggDownSubject(plan.TaskId, plan.Round, a.cfg.DeviceID), down)
	if err != nil {
		return fmt.Errorf("secure round: subscribe: %w", err)
	}
	defer sub.Unsubscribe()
	if err := r.Flush(); err != nil {
		return fmt.Errorf("secure round: %w", err)
	}
	send := func(up *pb.SecAggUp) error {
		up.TaskId, up.Round, up.DeviceId = plan.TaskId, plan.Round, a.cfg.DeviceID
		b, err := proto.Marshal(up)
		if err != nil {
			return err
		}
		msg, err := r.Request(ctx, wire.SecAggUpSubject(plan.TaskId, plan.Round, a.cfg.DeviceID), b)
		if err != nil {
			return fmt.Errorf("secure round: send: %w", err)
		}
		var ack pb.SecAggAck
		if err := proto.Unmarshal(msg.Data, &ack); err != nil {
			return fmt.Errorf("secure round: ack: %w", err)
		}
		if !ack.Accepted {
			return fmt.Errorf("secure round: server refused: %s", ack.Reason)
		}
		return nil
	}
	drop := func(stage string) bool {
		return a.o.dropout != nil && a.o.dropout(plan.TaskId, plan.Round, stage)
	}

	ak, err := client.Advertise()
	if err != nil {
		return fmt.Errorf("secure round: %w", err)
	}
	ak.IdentityPublicKey = a.identity.Public().(ed25519.PublicKey)
	if err := send(&pb.SecAggUp{Msg: &pb.SecAggUp_Advertise{Advertise: ak}}); err != nil {
		return err
	}
	if drop(DropAfterAdvertise) {
		return errDroppedOut
	}

	// Training waits for the key exchange: the key stages have short
	// deadlines, a device that misses one is out of the round, and its
	// training would be wasted.
	for {
		var m *nats.Msg
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case m = <-down:
		}
		var d pb.SecAggDown
		if err := proto.Unmarshal(m.Data, &d); err != nil || d.TaskId != plan.TaskId || d.Round != plan.Round {
			a.o.log.Warn("ignoring a malformed secure aggregation message", "subject", m.Subject)
			continue
		}
		switch msg := d.Msg.(type) {
		case *pb.SecAggDown_PeerKeys:
			for _, p := range msg.PeerKeys.GetPeers() {
				if len(p.GetIdentityPublicKey()) == ed25519.PublicKeySize {
					peerKeys[p.GetParticipantId()] = ed25519.PublicKey(p.GetIdentityPublicKey())
				}
			}
			sk, err := client.ShareKeys(msg.PeerKeys)
			if err != nil {
				return fmt.Errorf("secure round: %w", err)
			}
			if err := send(&pb.SecAggUp{Msg: &pb.SecAggUp_Shares{Shares: sk}}); err != nil {
				return err
			}
			if drop(DropAfterShares) {
				return errDroppedOut
			}
		case *pb.SecAggDown_ForwardedShares:
			input := a.secureInput
			if plan.GetAsyncStage() == pb.AsyncStage_ASYNC_STAGE_AGGREGATE {
				input = a.heldInput
			}
			values, keep, err := input(ctx, r.Plan, mod, call, encode)
			if err != nil {
				return err
			}
			mu, err := client.MaskedInput(msg.ForwardedShares, values)
			if err != nil {
				return fmt.Errorf("secure round: %w", err)
			}
			// The signed hash is of the values; packing only shrinks them
			// to the ring's ⌈bits/8⌉ bytes each for the trip.
			sum := wire.MaskedSHA256(mu)
			if err := secagg.Pack(mu); err != nil {
				return fmt.Errorf("secure round: %w", err)
			}
			rep := &pb.UpdateReport{TaskId: plan.TaskId, Round: plan.Round, DeviceId: a.cfg.DeviceID,
				ModelVersion: plan.GetModel().GetVersion(), ModuleSha256: plan.GetModule().GetSha256(),
				Payload: &pb.UpdateReport_Masked{Masked: mu}, PayloadSha256: sum, KeyId: a.key.ID()}
			if rep.Signature, err = a.signReport(identity.UpdateStatement(rep)); err != nil {
				return err
			}
			payload, err := proto.Marshal(rep)
			if err != nil {
				return err
			}
			if err := r.Publish(payload); err != nil {
				return err
			}
			keep()
			if drop(DropAfterMasked) {
				return errDroppedOut
			}
		case *pb.SecAggDown_Survivors:
			cc, err := client.Consistency(msg.Survivors)
			if err != nil {
				return fmt.Errorf("secure round: %w", err)
			}
			if err := send(&pb.SecAggUp{Msg: &pb.SecAggUp_Consistency{Consistency: cc}}); err != nil {
				return err
			}
		case *pb.SecAggDown_Unmask:
			ur, err := client.Unmask(msg.Unmask)
			if err != nil {
				return fmt.Errorf("secure round: %w", err)
			}
			return send(&pb.SecAggUp{Msg: &pb.SecAggUp_Unmask{Unmask: ur}})
		case *pb.SecAggDown_Abort:
			return fmt.Errorf("secure round aborted by the server: %s", msg.Abort.GetReason())
		}
	}
}

// minSurvivors is the fewest survivors this device helps unmask a sum of.
// Under distributed DP each device adds 1/min_noise_contributors of the
// noise, so a sum of fewer carries less noise than the task's ε promises:
// a server that declares the rest dropped gets no signature, hence no
// unmasking, from this device. Otherwise the threshold is the floor.
func minSurvivors(plan *pb.RoundPlan, n int) int {
	if _, ok := privacyconf.Distributed(plan.GetDp()); ok {
		return min(int(plan.GetDp().GetMinNoiseContributors()), n)
	}
	return 0
}

// encoder turns a trained update and its example count into the vector a
// secure round masks, and a keep to call once it is sent: it records the
// quantization residual for error feedback (a no-op without).
type encoder func(delta []float32, examples int) (values []uint32, keep func(), err error)

// secureEncoder returns the round's encoding. With distributed DP the update
// is rotated, clipped, scaled, rounded and noised on the device
// (privacy/dp); otherwise it is clipped to the norm bound, weighted by the
// example count (1 under DP; capped at the round's weight bound), quantized,
// and the weight appended. With a quantized update encoding (an 8-bit ring)
// the residual of that quantization is error feedback: it joins the next
// update of the task before the clip, so every bound that DP and the
// server's slack rely on holds for what is masked. Distributed DP quantizes
// inside its own encoder (rotated, noised, in the integer domain) and keeps
// no residual.
func (a *Agent) secureEncoder(plan *pb.RoundPlan, m *model.Model, bits, n int) (encoder, error) {
	dim := m.Layout().Size()
	if dc, ok := privacyconf.Distributed(plan.GetDp()); ok {
		dist, err := dp.DistributedFor(dc, dim, bits)
		if err != nil {
			return nil, err
		}
		src, err := dp.NewSource(crand.Reader)
		if err != nil {
			return nil, err
		}
		enc, err := dist.NewEncoder(wire.RotationSeed(plan.TaskId, plan.Round, plan.Seed), src)
		if err != nil {
			return nil, err
		}
		return func(delta []float32, _ int) ([]uint32, func(), error) {
			encode := enc.Encode
			if dist.Counts() {
				// Adaptive clipping: the encoder appends the bit of its clip.
				encode = enc.EncodeCounted
			}
			v, err := encode(delta)
			return v, func() {}, err
		}, nil
	}
	cfg := plan.GetSecagg()
	quant, err := secagg.NewQuantizer(bits, cfg.GetClipRange(), n, cfg.GetMaxWeight())
	if err != nil {
		return nil, err
	}
	var ef *feedbackState
	if plan.GetUpdateEncoding() == pb.UpdateEncoding_UPDATE_ENCODING_UNSPECIFIED {
		a.dropFeedback(plan.TaskId)
	} else {
		ef = a.feedback(plan.TaskId, m)
	}
	return func(delta []float32, examples int) ([]uint32, func(), error) {
		if ef != nil {
			if err := ef.fb.AddTo(delta); err != nil {
				ef.fb.Reset()
			}
		}
		delta, bit, err := a.privatize(delta, plan)
		if err != nil {
			return nil, nil, err
		}
		weight := min(float64(examples), cfg.GetMaxWeight())
		if plan.GetDp() != nil {
			weight = 1
		}
		if weight <= 0 {
			return nil, nil, fmt.Errorf("module reported %d examples", examples)
		}
		var seed [32]byte
		if _, err := crand.Read(seed[:]); err != nil {
			return nil, nil, err
		}
		rng := mrand.New(mrand.NewChaCha8(seed))
		// Adaptive clipping's bit follows the weight, through the same
		// secure sum: the server learns how many were unclipped, not whose.
		withBit := func(v []uint32) ([]uint32, error) {
			if bit == pb.ClipBit_CLIP_BIT_UNSPECIFIED {
				return v, nil
			}
			unclipped := 0.0
			if bit == pb.ClipBit_CLIP_BIT_UNCLIPPED {
				unclipped = 1
			}
			c, err := quant.QuantizeCount(unclipped, rng)
			return append(v, c), err
		}
		if ef == nil {
			v, err := quant.Quantize(delta, weight, rng)
			if err == nil {
				v, err = withBit(v)
			}
			return v, func() {}, err
		}
		residual := make([]float32, len(delta))
		v, err := quant.QuantizeResidual(delta, weight, rng, residual)
		if err == nil {
			v, err = withBit(v)
		}
		if err != nil {
			return nil, nil, err
		}
		// residual is clip(y) − sent, so "sent" here is y − residual.
		return v, func() {
			for i := range residual {
				residual[i] = delta[i] - residual[i]
			}
			if err := ef.fb.Keep(delta, residual); err != nil {
				ef.fb.Reset()
			}
		}, nil
	}, nil
}

// secureInput trains and encodes the update for masking.
func (a *Agent) secureInput(ctx context.Context, plan *pb.RoundPlan, mod *wasm.Module, call wasm.Call, encode encoder) ([]uint32, func(), error) {
	res, err := a.train(ctx, plan, mod, call)
	if err != nil {
		return nil, nil, fmt.Errorf("train: %w", err)
	}
	a.scratch.delta = updateOf(a.scratch.delta, call.Model, res.Model, call.Trainable)
	return encode(a.scratch.delta, res.NumExamples)
}

// privatize clips an update to the plan's norm bound and, under local DP,
// adds the device's Gaussian noise. bit is adaptive clipping's bit for
// the update (unset when the plan's DP does not clip adaptively).
func (a *Agent) privatize(delta []float32, plan *pb.RoundPlan) (_ []float32, bit pb.ClipBit, _ error) {
	if bound := plan.GetMaxUpdateNorm(); bound > 0 {
		norm, err := dp.ClipL2(delta, bound)
		if err != nil {
			return nil, 0, fmt.Errorf("clip update: %w", err)
		}
		if privacyconf.Adaptive(plan.GetDp()) {
			bit = pb.ClipBit_CLIP_BIT_CLIPPED
			if norm <= bound {
				bit = pb.ClipBit_CLIP_BIT_UNCLIPPED
			}
		}
	}
	if d := plan.GetDp(); d.GetMechanism() == pb.DPMechanism_DP_MECHANISM_LOCAL {
		src, err := dp.NewSource(crand.Reader)
		if err != nil {
			return nil, 0, err
		}
		if err := dp.AddLocalNoise(delta, d.GetClipNorm(), d.GetNoiseMultiplier(), src); err != nil {
			return nil, 0, err
		}
	}
	return delta, bit, nil
}

// updateOf writes the trained model minus the round's model, flattened, over
// dst's storage: the tensors train lists, in order, or all when it is empty.
// The sandbox returns the same layout it was given.
func updateOf(dst []float32, before, after *model.Model, train []int) []float32 {
	dst = dst[:0]
	n := len(train)
	if n == 0 {
		n = len(after.Tensors)
	}
	for k := range n {
		i := k
		if len(train) > 0 {
			i = train[k]
		}
		t := after.Tensors[i]
		b := before.Tensors[i].Data[:len(t.Data)]
		off := len(dst)
		dst = slices.Grow(dst, len(t.Data))[:off+len(t.Data)]
		out := dst[off:]
		for j, x := range t.Data {
			out[j] = x - b[j] // the compiler proves both indices: no bounds checks
		}
	}
	return dst
}

// trainable reads the plan's trainable list against the round's model: the
// indices (nil: every tensor trains) and the model of just those tensors,
// sharing m's storage, whose layout the update has. A list that is not
// ascending indices of m's tensors is refused: the server resolved it
// against this very model.
func trainable(plan *pb.RoundPlan, m *model.Model) ([]int, *model.Model, error) {
	list := plan.GetTrainable()
	if len(list) == 0 {
		return nil, m, nil
	}
	if len(list) > len(m.Tensors) {
		return nil, nil, fmt.Errorf("trainable: %d entries for a model of %d tensors", len(list), len(m.Tensors))
	}
	idx := make([]int, len(list))
	for k, v := range list {
		idx[k] = int(min(v, uint32(len(m.Tensors)))) // out of range either way, without wrapping
	}
	sub, err := m.Select(idx)
	if err != nil {
		return nil, nil, fmt.Errorf("trainable: %w", err)
	}
	return idx, sub, nil
}
