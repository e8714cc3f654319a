package round

import (
	"fmt"
)

// The update encodings, by code width: 0 is float32, 8 and 4 are the
// quantized ones. The wire's enum maps onto these widths (wire.EncodingBits);
// names are how the task option, the CLI and the audit log spell them.
var encodings = []struct {
	name string
	bits int
}{{"none", 0}, {"int8", 8}, {"int4", 4}}

// EncodingName names the encoding of bits bits.
func EncodingName(bits int) string {
	for _, e := range encodings {
		if e.bits == bits {
			return e.name
		}
	}
	return fmt.Sprintf("%d-bit", bits)
}

// ParseEncoding returns the code width of the encoding named name.
func ParseEncoding(name string) (bits int, ok bool) {
	for _, e := range encodings {
		if e.name == name {
			return e.bits, true
		}
	}
	return 0, false
}

// EncodingNames lists the encodings' names, float32's ("none") first.
func EncodingNames() []string {
	out := make([]string, 0, len(encodings))
	for _, e := range encodings {
		out = append(out, e.name)
	}
	return out
}
