package audit

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Filter selects entries by the fields of their events. Zero fields match
// everything; set fields must all match.
type Filter struct {
	Since     time.Time // earliest event time, inclusive
	Until     time.Time // latest event time, exclusive
	Task      string
	Round     uint64 // rounds count from 1; 0 matches any
	Type      EventType
	ActorKind ActorKind
	Actor     string // actor id (a pseudonym for devices)
}

// MaxFilterBytes bounds the text ParseFilter reads.
const MaxFilterBytes = 4096

// ParseFilter reads the filter syntax of the command line: space-separated
// key=value terms, each key at most once, values in double quotes when they
// hold spaces or quotes (with \" and \\ escapes). Keys:
//
//	type=round.closed            event type
//	task=t-1                     task id
//	round=3                      round number, from 1
//	actor=alice                  actor id, any kind
//	actor=operator:alice         actor kind and id (operator, service or device)
//	since=2026-01-01T00:00:00Z   RFC 3339 time or YYYY-MM-DD (UTC), inclusive
//	until=2026-02-01             same, exclusive
func ParseFilter(s string) (Filter, error) {
	var f Filter
	if len(s) > MaxFilterBytes {
		return f, fmt.Errorf("audit: filter of %d bytes: %w", len(s), ErrTooLarge)
	}
	if !utf8.ValidString(s) {
		return f, fmt.Errorf("audit: filter is not UTF-8: %w", ErrInvalidFilter)
	}
	seen := map[string]bool{}
	rest := s
	for {
		rest = strings.TrimLeftFunc(rest, unicode.IsSpace)
		if rest == "" {
			break
		}
		key, after, ok := strings.Cut(rest, "=")
		if !ok || key == "" || strings.IndexFunc(key, unicode.IsSpace) >= 0 {
			return Filter{}, fmt.Errorf("audit: filter: term %q is not key=value: %w", firstWord(rest), ErrInvalidFilter)
		}
		val, tail, err := filterValue(after)
		if err != nil {
			return Filter{}, fmt.Errorf("audit: filter: %s: %w", key, err)
		}
		rest = tail
		if seen[key] {
			return Filter{}, fmt.Errorf("audit: filter: %s given twice: %w", key, ErrInvalidFilter)
		}
		seen[key] = true
		if err := f.set(key, val); err != nil {
			return Filter{}, fmt.Errorf("audit: filter: %s=%q: %w", key, val, err)
		}
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return Filter{}, fmt.Errorf("audit: filter: since is not before until: %w", ErrInvalidFilter)
	}
	return f, nil
}

func firstWord(s string) string {
	if i := strings.IndexFunc(s, unicode.IsSpace); i >= 0 {
		return s[:i]
	}
	return s
}

// filterValue reads a bare or quoted value and returns the rest of the
// input, which must be empty or start with a space.
func filterValue(s string) (val, rest string, err error) {
	if !strings.HasPrefix(s, `"`) {
		end := strings.IndexFunc(s, unicode.IsSpace)
		if end < 0 {
			end = len(s)
		}
		val, rest = s[:end], s[end:]
		if strings.ContainsAny(val, `"\`) {
			return "", "", fmt.Errorf("quotes and backslashes need a quoted value: %w", ErrInvalidFilter)
		}
		return val, rest, nil
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			rest = s[i+1:]
			if rest != "" {
				if r, _ := utf8.DecodeRuneInString(rest); !unicode.IsSpace(r) {
					return "", "", fmt.Errorf("text after closing quote: %w", ErrInvalidFilter)
				}
			}
			return b.String(), rest, nil
		case '\\':
			if i+1 >= len(s) || (s[i+1] != '"' && s[i+1] != '\\') {
				return "", "", fmt.Errorf(`only \" and \\ escapes: %w`, ErrInvalidFilter)
			}
			i++
			b.WriteByte(s[i])
		default:
			b.WriteByte(c)
		}
	}
	return "", "", fmt.Errorf("unterminated quote: %w", ErrInvalidFilter)
}

func (f *Filter) set(key, val string) error {
	switch key {
	case "type":
		if len(val) > MaxFieldBytes || !typeRE.MatchString(val) {
			return fmt.Errorf("not an event type: %w", ErrInvalidFilter)
		}
		f.Type = EventType(val)
	case "task":
		if err := checkField("task", val, true); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidFilter, err)
		}
		f.Task = val
	case "round":
		r, err := strconv.ParseUint(val, 10, 64)
		if err != nil || r == 0 || strconv.FormatUint(r, 10) != val {
			return fmt.Errorf("round must be a number from 1: %w", ErrInvalidFilter)
		}
		f.Round = r
	case "actor":
		kind, id, ok := strings.Cut(val, ":")
		if ok && (kind == string(ActorOperator) || kind == string(ActorService) || kind == string(ActorDevice)) {
			f.ActorKind, val = ActorKind(kind), id
		}
		if err := checkField("actor", val, true); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidFilter, err)
		}
		f.Actor = val
	case "since", "until":
		t, err := parseFilterTime(val)
		if err != nil {
			return err
		}
		if key == "since" {
			f.Since = t
		} else {
			f.Until = t
		}
	default:
		return fmt.Errorf("unknown key (want type, task, round, actor, since or until): %w", ErrInvalidFilter)
	}
	return nil
}

func parseFilterTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		if t, err = time.Parse(time.DateOnly, s); err != nil {
			return time.Time{}, fmt.Errorf("want an RFC 3339 time or YYYY-MM-DD: %w", ErrInvalidFilter)
		}
	}
	if y := t.UTC().Year(); y < 1 || y > 9999 {
		return time.Time{}, fmt.Errorf("year %d out of range: %w", y, ErrInvalidFilter)
	}
	return t.UTC(), nil
}

// String writes the filter in the syntax ParseFilter reads.
func (f Filter) String() string {
	var terms []string
	add := func(k, v string) { terms = append(terms, k+"="+quoteFilterValue(v)) }
	if f.Type != "" {
		add("type", string(f.Type))
	}
	if f.Task != "" {
		add("task", f.Task)
	}
	if f.Round != 0 {
		add("round", strconv.FormatUint(f.Round, 10))
	}
	if f.Actor != "" || f.ActorKind != "" {
		if f.ActorKind != "" {
			add("actor", string(f.ActorKind)+":"+f.Actor)
		} else {
			add("actor", f.Actor)
		}
	}
	if !f.Since.IsZero() {
		add("since", f.Since.UTC().Format(time.RFC3339Nano))
	}
	if !f.Until.IsZero() {
		add("until", f.Until.UTC().Format(time.RFC3339Nano))
	}
	return strings.Join(terms, " ")
}

func quoteFilterValue(v string) string {
	if v != "" && !strings.ContainsAny(v, `"\`) && strings.IndexFunc(v, unicode.IsSpace) < 0 {
		return v
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(v) + `"`
}

// Match reports whether an event passes the filter, so that a client can
// check the entries a query returned against their own bytes.
func (f Filter) Match(ev Event) bool {
	switch {
	case !f.Since.IsZero() && ev.Time.Before(f.Since),
		!f.Until.IsZero() && !ev.Time.Before(f.Until),
		f.Task != "" && ev.Subject.Task != f.Task,
		f.Round != 0 && ev.Subject.Round != f.Round,
		f.Type != "" && ev.Type != f.Type,
		f.ActorKind != "" && ev.Actor.Kind != f.ActorKind,
		f.Actor != "" && ev.Actor.ID != f.Actor:
		return false
	}
	return true
}

// Query page sizes.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Page is one page of query results.
type Page struct {
	Entries []Entry // oldest first
	// Next is the token for the following page; empty on the last page.
	Next string
}

// Query returns the entries matching f, oldest first, at most limit of them
// (DefaultPageSize when limit <= 0, at most MaxPageSize), starting where
// token (a previous Page.Next, or "" for the first page) says. It reads the
// columns copied from each entry at append time; the entries' bytes stay
// authoritative (see Filter.Match and VerifyIndex).
func (l *Log) Query(ctx context.Context, f Filter, limit int, token string) (Page, error) {
	if err := l.live(); err != nil {
		return Page{}, fmt.Errorf("audit: query: %w", err)
	}
	if limit <= 0 {
		limit = DefaultPageSize
	}
	limit = min(limit, MaxPageSize)
	var start uint64
	if token != "" {
		var err error
		if start, err = strconv.ParseUint(token, 10, 64); err != nil || strconv.FormatUint(start, 10) != token || start > maxLeaves {
			return Page{}, fmt.Errorf("audit: query: bad page token: %w", ErrInvalidFilter)
		}
	}
	size := l.Size()
	q := "SELECT idx, data FROM entries WHERE idx >= ? AND idx < ?"
	args := []any{int64(start), int64(size)}
	if !f.Since.IsZero() {
		q += " AND ts >= ?"
		args = append(args, unixNano(f.Since))
	}
	if !f.Until.IsZero() {
		q += " AND ts < ?"
		args = append(args, unixNano(f.Until))
	}
	if f.Task != "" {
		q += " AND task = ?"
		args = append(args, f.Task)
	}
	if f.Round != 0 {
		q += " AND round = ?"
		args = append(args, int64(f.Round))
	}
	if f.Type != "" {
		q += " AND type = ?"
		args = append(args, string(f.Type))
	}
	if f.ActorKind != "" {
		q += " AND actor_kind = ?"
		args = append(args, string(f.ActorKind))
	}
	if f.Actor != "" {
		q += " AND actor = ?"
		args = append(args, f.Actor)
	}
	q += " ORDER BY idx LIMIT ?"
	args = append(args, limit+1)
	rows, err := l.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return Page{}, fmt.Errorf("audit: query: %w", err)
	}
	defer rows.Close()
	var page Page
	for rows.Next() {
		var idx int64
		var data []byte
		if err := rows.Scan(&idx, &data); err != nil {
			return Page{}, fmt.Errorf("audit: query: %w", err)
		}
		if len(page.Entries) == limit {
			page.Next = strconv.FormatInt(idx, 10)
			break
		}
		page.Entries = append(page.Entries, Entry{Index: uint64(idx), Data: data})
	}
	if err := rows.Err(); err != nil {
		return Page{}, fmt.Errorf("audit: query: %w", err)
	}
	return page, nil
}
