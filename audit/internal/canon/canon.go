// Package canon writes and checks the canonical JSON of audit events: no
// insignificant whitespace, members in the order the writer emits them (no
// sorting, except for maps, whose keys are sorted), strings escaped only
// where JSON requires it (RFC 8785 style), integers as plain digits and other
// numbers in the ECMAScript shortest round-trip form. Invalid UTF-8, lone
// surrogates, non-finite numbers and duplicate keys are errors.
package canon

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"
)

// Errors. Every failure wraps exactly one of them.
var (
	ErrInvalid  = errors.New("invalid JSON")
	ErrNotValue = errors.New("value cannot be encoded")
)

// MaxDepth bounds nesting in Canonicalize.
const MaxDepth = 32

// Object writes one JSON object's members in call order. The first error
// sticks; Build reports it.
type Object struct {
	b   []byte
	n   int
	err error
}

// Build runs fn on a fresh object and returns its bytes.
func Build(fn func(*Object)) ([]byte, error) {
	o := &Object{b: make([]byte, 0, 256)}
	o.b = append(o.b, '{')
	fn(o)
	o.b = append(o.b, '}')
	if o.err != nil {
		return nil, o.err
	}
	return o.b, nil
}

func (o *Object) key(k string) {
	if o.n > 0 {
		o.b = append(o.b, ',')
	}
	o.n++
	o.b = appendString(o.b, k, &o.err)
	o.b = append(o.b, ':')
}

// String writes a string member.
func (o *Object) String(k, v string) {
	o.key(k)
	o.b = appendString(o.b, v, &o.err)
}

// Uint writes an unsigned integer member.
func (o *Object) Uint(k string, v uint64) {
	o.key(k)
	o.b = strconv.AppendUint(o.b, v, 10)
}

// Int writes a signed integer member.
func (o *Object) Int(k string, v int64) {
	o.key(k)
	o.b = strconv.AppendInt(o.b, v, 10)
}

// Float writes a number member; NaN and infinities are errors.
func (o *Object) Float(k string, v float64) {
	o.key(k)
	o.b = appendFloat(o.b, v, &o.err, k)
}

// Bool writes a boolean member.
func (o *Object) Bool(k string, v bool) {
	o.key(k)
	o.b = strconv.AppendBool(o.b, v)
}

// Object writes a nested object member.
func (o *Object) Object(k string, fn func(*Object)) {
	o.key(k)
	in := &Object{b: append(o.b, '{')}
	fn(in)
	o.b = append(in.b, '}')
	if o.err == nil {
		o.err = in.err
	}
}

// Raw writes a member whose value is already canonical JSON.
func (o *Object) Raw(k string, v []byte) {
	o.key(k)
	o.b = append(o.b, v...)
}

// Strings writes an array of strings.
func (o *Object) Strings(k string, vs []string) {
	o.key(k)
	o.b = append(o.b, '[')
	for i, v := range vs {
		if i > 0 {
			o.b = append(o.b, ',')
		}
		o.b = appendString(o.b, v, &o.err)
	}
	o.b = append(o.b, ']')
}

// Objects writes an array of n objects, the i-th written by fn(i, ...).
func (o *Object) Objects(k string, n int, fn func(i int, in *Object)) {
	o.key(k)
	o.b = append(o.b, '[')
	for i := range n {
		if i > 0 {
			o.b = append(o.b, ',')
		}
		in := &Object{b: append(o.b, '{')}
		fn(i, in)
		o.b = append(in.b, '}')
		if o.err == nil {
			o.err = in.err
		}
	}
	o.b = append(o.b, ']')
}

// StringMap writes an object of strings with sorted keys.
func (o *Object) StringMap(k string, m map[string]string) {
	o.Object(k, func(in *Object) {
		for _, key := range sortedKeys(m) {
			in.String(key, m[key])
		}
	})
}

// FloatMap writes an object of numbers with sorted keys.
func (o *Object) FloatMap(k string, m map[string]float64) {
	o.Object(k, func(in *Object) {
		for _, key := range sortedKeys(m) {
			in.Float(key, m[key])
		}
	})
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

const hexDigits = "0123456789abcdef"

func appendString(b []byte, s string, err *error) []byte {
	if !utf8.ValidString(s) {
		if *err == nil {
			*err = fmt.Errorf("string %q is not UTF-8: %w", s, ErrNotValue)
		}
		return append(b, `""`...)
	}
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c >= 0x20:
			b = append(b, c)
		case c == '\b':
			b = append(b, '\\', 'b')
		case c == '\f':
			b = append(b, '\\', 'f')
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\r':
			b = append(b, '\\', 'r')
		case c == '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&15])
		}
	}
	return append(b, '"')
}

// appendFloat writes the ECMAScript Number::toString form.
func appendFloat(b []byte, f float64, err *error, what string) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		if *err == nil {
			*err = fmt.Errorf("%s: %v: %w", what, f, ErrNotValue)
		}
		return append(b, '0')
	}
	if f == 0 {
		return append(b, '0') // also -0
	}
	format := byte('f')
	if abs := math.Abs(f); abs < 1e-6 || abs >= 1e21 {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// e-07 → e-7, as ECMAScript writes exponents.
		n := len(b)
		if n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		} else if n >= 4 && b[n-4] == 'e' && b[n-3] == '+' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}
