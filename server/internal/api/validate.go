package api

import (
	"encoding/json"
	"fmt"
	"unicode"

	"github.com/fleetlearn/fleetlearn/internal/ident"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
)

// Bounds on request fields. They are far above any legitimate value and only
// keep absurd requests from reaching the backend.
const (
	maxIDLen          = ident.MaxNameBytes // device attributes
	maxTokenLen       = 1024               // page tokens
	maxTextLen        = 4096               // reasons, descriptions, paths
	maxHyperBytes     = 1 << 20            // task hyperparameters
	maxSignatureBytes = 64 << 10
)

// checkID checks a required identifier.
func checkID(op, field, v string) error {
	if v == "" {
		return invalid(op, field+" is required")
	}
	return checkName(op, field, v)
}

// checkName checks an optional identifier or name (task ids, model
// versions, names) by the rule names follow everywhere.
func checkName(op, field, v string) error {
	if v == "" {
		return nil
	}
	if err := ident.Name(v); err != nil {
		return invalid(op, field+" "+err.Error())
	}
	return nil
}

// checkText checks an optional free-form field.
func checkText(op, field, v string, limit int) error {
	if len(v) > limit {
		return invalid(op, fmt.Sprintf("%s is longer than %d bytes", field, limit))
	}
	return nil
}

// checkSHA256 checks a digest written as 64 lowercase hexadecimal characters;
// empty is accepted only when the digest is optional.
func checkSHA256(op, field, v string, required bool) error {
	if v == "" && !required {
		return nil
	}
	if !ident.IsSHA256(v) {
		return invalid(op, fmt.Sprintf("%s %q is not 64 lowercase hexadecimal characters", field, truncate(v)))
	}
	return nil
}

// page translates and bounds the paging fields of a List request.
func page(op string, size int32, token string) (backend.Page, error) {
	if size < 0 {
		return backend.Page{}, invalid(op, fmt.Sprintf("page_size %d is negative", size))
	}
	if err := checkText(op, "page_token", token, maxTokenLen); err != nil {
		return backend.Page{}, err
	}
	// The proto promises that the server caps page_size instead of refusing it.
	return backend.Page{Size: int(min(size, MaxPageSize)), Token: token}, nil
}

// checkJSONObject checks optional hyperparameters: a UTF-8 JSON object.
func checkJSONObject(op, field string, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if len(b) > maxHyperBytes {
		return invalid(op, fmt.Sprintf("%s is longer than %d bytes", field, maxHyperBytes))
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil || obj == nil {
		return invalid(op, field+" is not a JSON object")
	}
	return nil
}

// truncate shortens a value echoed in an error message.
func truncate(v string) string {
	const n = 80
	if len(v) <= n {
		return v
	}
	return v[:n] + "..."
}

// hasControl reports whether v contains control characters, which have no
// place in names that end up in tables and logs.
func hasControl(v string) bool {
	for _, r := range v {
		if unicode.IsControl(r) {
			return true
		}
	}
	return false
}
