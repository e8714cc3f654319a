// Package quant compresses DiLoCo pseudo-gradients to int8 for the trip
// from an island to the outer optimizer, about four times smaller than
// float32.
//
// Quantize splits a vector into blocks (DefaultBlock = 256 values; the last
// may be shorter) and gives each block the scale s = max|x|/127, rounded up
// to a float32 so that every x/s lies in [−127, 127]. Each value becomes
// the integer code c = ⌊x/s⌋ or ⌊x/s⌋ + 1, the upper one with probability
// x/s − ⌊x/s⌋ (stochastic rounding), so that E[c·s] = x: the outer step
// averages many islands' pseudo-gradients over many rounds, and unbiased
// rounding errors average out where round-to-nearest errors would add up.
// Dequantize returns c·s, within s of x (plus the half unit in the last
// place of rounding the result to float32). The codes are symmetric: −128
// is never produced and never accepted.
//
// The random draws come from a math/rand/v2 Source, exactly one Uint64 per
// value, so a quantization is a function of the input and the source's
// state alone; seed the source per island and round to make it
// reproducible.
//
// # Encoding
//
// MarshalBinary writes, little-endian:
//
//	[0:4]   magic "FLQ8"
//	[4]     version (1)
//	[5:9]   n, the number of values, uint32
//	[9:13]  block size, uint32
//	[13:]   ⌈n/block⌉ scales, float32, then n codes, int8
//
// 13 + 4·⌈n/block⌉ + n bytes: for block 256, 3.94 times smaller than n
// float32 values. Decode reads it back for a known length, which the
// receiver takes from the model rather than from the sender, and refuses
// anything that MarshalBinary would not write: another magic or version, a
// block size or length out of range, a wrong length, a negative,
// non-finite or oversized scale, a code of −128, or a nonzero code in a
// block whose scale is 0. Every accepted encoding therefore re-encodes to
// the same bytes, and its dequantized values are finite.
//
// # 4-bit codes and error feedback
//
// Federated updates from devices use Quantize4: codes in [−7, 7] with the
// scale max|x|/7 per block, rounded stochastically the same way, so again
// E[c·s] = x and |c·s − x| < s; −8 is never produced and never accepted.
// Its encoding has the header above with magic "FLQ4" and version 1, then
// the ⌈n/block⌉ scales, then ⌈n/2⌉ bytes holding code 2j in the low nibble
// of byte j and code 2j+1 in the high one; for odd n the last high nibble
// is 0. That is 13 + 4·⌈n/block⌉ + ⌈n/2⌉ bytes, 7.76 times smaller than
// float32 at block 256, and Decode4 is as strict as Decode, refusing also
// a nonzero padding nibble.
//
// A step of max|x|/7 is too coarse to lose each round, so a device keeps
// a Feedback: Compress sends x + e quantized (8 or 4 bits) and keeps the
// difference as the new residual e. What the receiver gets over R rounds
// then sums to the sum of the updates minus the last residual, which stays
// within one step per value: the error of the running mean shrinks as 1/R
// rather than only in expectation, as 1/√R. MarshalBinary persists the
// residual ("FLEF", version 1, n as uint32, n float32 values).
package quant
