// Package ident is the one definition of the two kinds of identifier every
// part of Fleetlearn checks: names (of models, modules, tasks, datasets) and
// sha256 digests written in hex. It imports nothing of ours, so the pure
// libraries can use it too; callers add their own field name and sentinel.
package ident

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// MaxNameBytes bounds a name. Names are copied into audit events, whose
// identifier fields hold at most this much (audit.MaxFieldBytes).
const MaxNameBytes = 256

// Name returns nil if s is a valid name: 1 to MaxNameBytes bytes of UTF-8
// without control characters or U+FFFD, since names end up in tables, logs
// and the audit log, where either would garble or forge what a reader sees.
// The error says what is wrong without repeating s.
func Name(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("is empty (names are 1-%d bytes)", MaxNameBytes)
	case len(s) > MaxNameBytes:
		return fmt.Errorf("is %d bytes, longer than %d", len(s), MaxNameBytes)
	case !utf8.ValidString(s):
		return fmt.Errorf("is not UTF-8")
	}
	for _, r := range s {
		if unicode.IsControl(r) || r == utf8.RuneError {
			return fmt.Errorf("contains character %U (no control characters or U+FFFD)", r)
		}
	}
	return nil
}

// IsSHA256 reports whether s is a sha256 digest as Fleetlearn writes one: 64
// lowercase hex digits. Uppercase is refused so that a digest has one
// spelling, which blob names, store keys and audit events rely on.
func IsSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
