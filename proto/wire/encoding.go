package wire

import pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"

// encodingBits maps the wire's update encodings onto their code widths
// (round's encodings): 0 is float32.
var encodingBits = map[pb.UpdateEncoding]int{
	pb.UpdateEncoding_UPDATE_ENCODING_UNSPECIFIED: 0,
	pb.UpdateEncoding_UPDATE_ENCODING_INT8:        8,
	pb.UpdateEncoding_UPDATE_ENCODING_INT4:        4,
}

// EncodingBits is the code width of update encoding e; ok is false for an
// encoding this build does not know.
func EncodingBits(e pb.UpdateEncoding) (bits int, ok bool) {
	bits, ok = encodingBits[e]
	return bits, ok
}

// EncodingOfBits is the update encoding whose codes are bits wide.
func EncodingOfBits(bits int) (pb.UpdateEncoding, bool) {
	for e, b := range encodingBits {
		if b == bits {
			return e, true
		}
	}
	return 0, false
}
