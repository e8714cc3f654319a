package secagg

import "errors"

// Sentinel errors. Every error from this package wraps at least one of them;
// an aborted round's errors wrap ErrAborted and the cause.
var (
	// ErrConfig reports an invalid Config, cohort size, dimension or
	// option.
	ErrConfig = errors.New("invalid configuration")
	// ErrStage reports a message or call that does not belong to the current
	// stage, such as shares before the key stage closed or a second Unmask.
	ErrStage = errors.New("out of stage")
	// ErrWrongRound reports a message for another task, round or recipient.
	ErrWrongRound = errors.New("wrong task, round or recipient")
	// ErrDuplicate reports a second message from one participant in a stage,
	// or an entry repeated inside one message.
	ErrDuplicate = errors.New("duplicate message")
	// ErrNotParticipant reports a sender or peer that is not in the stage's
	// participant set or not a graph neighbour.
	ErrNotParticipant = errors.New("not a participant of this stage")
	// ErrMalformed reports wrong sizes, unsorted lists, non-canonical
	// encodings or values out of range.
	ErrMalformed = errors.New("malformed message")
	// ErrForged reports a signature that does not verify, a share that fails
	// authenticated decryption, or a reconstructed key that does not match
	// its advertisement: somebody substituted or altered a message.
	ErrForged = errors.New("forged or altered message")
	// ErrDoubleShareRequest reports an unmask request that would reveal both
	// secrets of one peer, or that contradicts the survivor set this client
	// signed.
	ErrDoubleShareRequest = errors.New("request for both shares of a peer")
	// ErrTooFewSurvivors reports that fewer than threshold participants
	// remain where a secret must be shared or reconstructed.
	ErrTooFewSurvivors = errors.New("too few survivors")
	// ErrAborted reports a call after the round was aborted; the error also
	// wraps the cause.
	ErrAborted = errors.New("round aborted")
	// ErrRange reports an unusable quantization input: NaN, a weight out of
	// bounds, a sum that decodes outside the representable range.
	ErrRange = errors.New("value out of range")
)
