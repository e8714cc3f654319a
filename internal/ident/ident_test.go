package ident_test

import (
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/internal/ident"
)

func TestName(t *testing.T) {
	for _, c := range []struct {
		name, in string
		mention  string // empty: valid
	}{
		{"plain", "mnist-ft", ""},
		{"spaces and unicode", "fine tune · Zürich", ""},
		{"longest", strings.Repeat("n", ident.MaxNameBytes), ""},
		{"empty", "", "empty"},
		{"too long", strings.Repeat("n", ident.MaxNameBytes+1), "257 bytes"},
		{"multibyte past the limit", strings.Repeat("é", ident.MaxNameBytes/2) + "x", "257 bytes"},
		{"invalid UTF-8", "model\xff", "not UTF-8"},
		{"newline", "a\nb", "U+000A"},
		{"escape", "red\x1b[31m", "U+001B"},
		{"DEL", "a\x7f", "U+007F"},
		{"C1 control", "a\u0085", "U+0085"},
		{"replacement character", "a\ufffd", "U+FFFD"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := ident.Name(c.in)
			if c.mention == "" {
				if err != nil {
					t.Fatalf("Name(%q) = %v, want nil", c.in, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.mention) {
				t.Fatalf("Name(%q) = %v, want an error mentioning %q", c.in, err, c.mention)
			}
		})
	}
}

func TestIsSHA256(t *testing.T) {
	good := strings.Repeat("0123456789abcdef", 4)
	for _, c := range []struct {
		in   string
		want bool
	}{
		{good, true},
		{strings.Repeat("f", 64), true},
		{"", false},
		{good[:63], false},
		{good + "0", false},
		{strings.ToUpper(good), false},
		{good[:63] + "g", false},
		{good[:62] + "é", false}, // 64 bytes, not 64 digits
		{good[:63] + " ", false},
	} {
		if got := ident.IsSHA256(c.in); got != c.want {
			t.Errorf("IsSHA256(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}
