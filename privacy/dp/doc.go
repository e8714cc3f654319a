// Package dp is Fleetlearn's differential privacy: clipping, noise and
// accounting for user-level DP in federated training. It is pure: no I/O,
// no clocks, randomness only from an injected Source.
//
// # Mechanisms
//
// Every device update is clipped to L2 norm C (ClipL2, or AdaptiveClip to
// track a quantile of update norms). Noise of standard deviation z·C is
// then added in one of three places:
//
//   - central (AddCentralNoise): the server noises the sum, DP-FedAvg;
//   - distributed (Distributed, Encoder, Decoder): each of at least n
//     devices adds integer noise of variance (z·C)²/n (scaled) before
//     secure aggregation, so the server only sees the noised sum;
//   - local (AddLocalNoise): each device adds all of z·C itself.
//
// # Accounting
//
// Epsilon composes Events (rounds with sampling rate q and noise
// multiplier z) with the RDP or the PLD accountant; NoiseMultiplier
// searches the smallest z for a target ε; Budget tracks a task's spending
// round by round and persists as JSON. Distributed.Epsilon accounts the
// discrete mechanisms with their own RDP bounds.
//
// Errors wrap the sentinels in errors.go. docs/DP.md has the parameter
// heuristics and the caveats.
package dp
