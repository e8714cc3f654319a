package audit

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/fleetlearn/fleetlearn/internal/ident"
)

// PseudonymKeySize is the size of the device pseudonym key.
const PseudonymKeySize = 32

// pseudonymPrefix marks pseudonyms so that a raw device id is never mistaken
// for one.
const pseudonymPrefix = "pd-"

// pseudonymDomain separates this use of the key from any other.
const pseudonymDomain = "fleetlearn audit device pseudonym v1\x00"

// PseudonymizeDevice returns the pseudonym under which a device appears in
// the log: "pd-" and the lowercase hex HMAC-SHA256, keyed with the log's
// pseudonym key, of a fixed domain string and the raw device id. The same
// device always gets the same pseudonym in one log, so its history can be
// followed; without the key the raw id cannot be recovered or confirmed by
// guessing.
func PseudonymizeDevice(key []byte, deviceID string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(pseudonymDomain))
	m.Write([]byte(deviceID))
	return pseudonymPrefix + hex.EncodeToString(m.Sum(nil))
}

func isPseudonym(s string) bool {
	rest, ok := strings.CutPrefix(s, pseudonymPrefix)
	return ok && ident.IsSHA256(rest)
}
