package canon

import (
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// Canonicalize parses one JSON value and writes it canonically, keeping the
// order of object members. A value is canonical when Canonicalize returns it
// unchanged.
func Canonicalize(in []byte) ([]byte, error) {
	p := &parser{in: in}
	p.ws()
	out, err := p.value(make([]byte, 0, len(in)), 0)
	if err != nil {
		return nil, err
	}
	p.ws()
	if p.pos != len(in) {
		return nil, p.fail("trailing data")
	}
	return out, nil
}

// CanonicalizeObject is Canonicalize for input that must be an object.
func CanonicalizeObject(in []byte) ([]byte, error) {
	i := 0
	for i < len(in) && isSpace(in[i]) {
		i++
	}
	if i == len(in) || in[i] != '{' {
		return nil, fmt.Errorf("not an object: %w", ErrInvalid)
	}
	return Canonicalize(in)
}

type parser struct {
	in  []byte
	pos int
}

func (p *parser) fail(what string) error {
	return fmt.Errorf("%s at byte %d: %w", what, p.pos, ErrInvalid)
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func (p *parser) ws() {
	for p.pos < len(p.in) && isSpace(p.in[p.pos]) {
		p.pos++
	}
}

func (p *parser) lit(s string) bool {
	if len(p.in)-p.pos >= len(s) && string(p.in[p.pos:p.pos+len(s)]) == s {
		p.pos += len(s)
		return true
	}
	return false
}

func (p *parser) value(out []byte, depth int) ([]byte, error) {
	if depth > MaxDepth {
		return nil, p.fail("nesting too deep")
	}
	if p.pos >= len(p.in) {
		return nil, p.fail("unexpected end")
	}
	switch c := p.in[p.pos]; {
	case c == '{':
		return p.object(out, depth)
	case c == '[':
		return p.array(out, depth)
	case c == '"':
		s, err := p.str()
		if err != nil {
			return nil, err
		}
		var e error
		return appendString(out, s, &e), e
	case c == 't' && p.lit("true"):
		return append(out, "true"...), nil
	case c == 'f' && p.lit("false"):
		return append(out, "false"...), nil
	case c == 'n' && p.lit("null"):
		return append(out, "null"...), nil
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number(out)
	}
	return nil, p.fail("unexpected character")
}

func (p *parser) object(out []byte, depth int) ([]byte, error) {
	p.pos++ // {
	out = append(out, '{')
	seen := map[string]bool{}
	p.ws()
	if p.pos < len(p.in) && p.in[p.pos] == '}' {
		p.pos++
		return append(out, '}'), nil
	}
	for {
		p.ws()
		if p.pos >= len(p.in) || p.in[p.pos] != '"' {
			return nil, p.fail("expected member name")
		}
		k, err := p.str()
		if err != nil {
			return nil, err
		}
		if seen[k] {
			return nil, p.fail(fmt.Sprintf("duplicate key %q", k))
		}
		seen[k] = true
		var e error
		out = appendString(out, k, &e)
		p.ws()
		if p.pos >= len(p.in) || p.in[p.pos] != ':' {
			return nil, p.fail("expected ':'")
		}
		p.pos++
		out = append(out, ':')
		p.ws()
		if out, err = p.value(out, depth+1); err != nil {
			return nil, err
		}
		p.ws()
		if p.pos >= len(p.in) {
			return nil, p.fail("unexpected end")
		}
		switch p.in[p.pos] {
		case ',':
			p.pos++
			out = append(out, ',')
		case '}':
			p.pos++
			return append(out, '}'), nil
		default:
			return nil, p.fail("expected ',' or '}'")
		}
	}
}

func (p *parser) array(out []byte, depth int) ([]byte, error) {
	p.pos++ // [
	out = append(out, '[')
	p.ws()
	if p.pos < len(p.in) && p.in[p.pos] == ']' {
		p.pos++
		return append(out, ']'), nil
	}
	for {
		p.ws()
		var err error
		if out, err = p.value(out, depth+1); err != nil {
			return nil, err
		}
		p.ws()
		if p.pos >= len(p.in) {
			return nil, p.fail("unexpected end")
		}
		switch p.in[p.pos] {
		case ',':
			p.pos++
			out = append(out, ',')
		case ']':
			p.pos++
			return append(out, ']'), nil
		default:
			return nil, p.fail("expected ',' or ']'")
		}
	}
}

// str reads a string token and returns its decoded value.
func (p *parser) str() (string, error) {
	p.pos++ // opening quote
	var b []byte
	for {
		if p.pos >= len(p.in) {
			return "", p.fail("unterminated string")
		}
		c := p.in[p.pos]
		switch {
		case c == '"':
			p.pos++
			return string(b), nil
		case c < 0x20:
			return "", p.fail("control character in string")
		case c == '\\':
			p.pos++
			if p.pos >= len(p.in) {
				return "", p.fail("unterminated escape")
			}
			e := p.in[p.pos]
			p.pos++
			switch e {
			case '"', '\\', '/':
				b = append(b, e)
			case 'b':
				b = append(b, '\b')
			case 'f':
				b = append(b, '\f')
			case 'n':
				b = append(b, '\n')
			case 'r':
				b = append(b, '\r')
			case 't':
				b = append(b, '\t')
			case 'u':
				r, err := p.hex4()
				if err != nil {
					return "", err
				}
				if utf16.IsSurrogate(r) {
					if !p.lit(`\u`) {
						return "", p.fail("lone surrogate")
					}
					r2, err := p.hex4()
					if err != nil {
						return "", err
					}
					r = utf16.DecodeRune(r, r2)
					if r == utf8.RuneError {
						return "", p.fail("invalid surrogate pair")
					}
				}
				b = utf8.AppendRune(b, r)
			default:
				return "", p.fail("invalid escape")
			}
		default:
			r, size := utf8.DecodeRune(p.in[p.pos:])
			if r == utf8.RuneError && size <= 1 {
				return "", p.fail("invalid UTF-8")
			}
			b = append(b, p.in[p.pos:p.pos+size]...)
			p.pos += size
		}
	}
}

func (p *parser) hex4() (rune, error) {
	if len(p.in)-p.pos < 4 {
		return 0, p.fail("short \\u escape")
	}
	v, err := strconv.ParseUint(string(p.in[p.pos:p.pos+4]), 16, 32)
	if err != nil {
		return 0, p.fail("invalid \\u escape")
	}
	p.pos += 4
	return rune(v), nil
}

// number reads a number per the JSON grammar and writes it canonically:
// integer literals that fit 64 bits stay as they are (minus zero becomes
// 0), everything else is written as its float64 value.
func (p *parser) number(out []byte) ([]byte, error) {
	start := p.pos
	if p.in[p.pos] == '-' {
		p.pos++
	}
	digits := func() int {
		n := 0
		for p.pos < len(p.in) && p.in[p.pos] >= '0' && p.in[p.pos] <= '9' {
			p.pos++
			n++
		}
		return n
	}
	intStart := p.pos
	if n := digits(); n == 0 {
		return nil, p.fail("invalid number")
	} else if n > 1 && p.in[intStart] == '0' {
		return nil, p.fail("leading zero")
	}
	integer := true
	if p.pos < len(p.in) && p.in[p.pos] == '.' {
		p.pos++
		integer = false
		if digits() == 0 {
			return nil, p.fail("invalid fraction")
		}
	}
	if p.pos < len(p.in) && (p.in[p.pos] == 'e' || p.in[p.pos] == 'E') {
		p.pos++
		integer = false
		if p.pos < len(p.in) && (p.in[p.pos] == '+' || p.in[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			return nil, p.fail("invalid exponent")
		}
	}
	lit := string(p.in[start:p.pos])
	if integer {
		if lit == "-0" {
			return append(out, '0'), nil
		}
		if _, err := strconv.ParseInt(lit, 10, 64); err == nil {
			return append(out, lit...), nil
		}
		if _, err := strconv.ParseUint(lit, 10, 64); err == nil {
			return append(out, lit...), nil
		}
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil {
		return nil, p.fail("number out of range")
	}
	var e error
	return appendFloat(out, f, &e, "number"), e
}
