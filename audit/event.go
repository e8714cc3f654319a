package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fleetlearn/fleetlearn/audit/internal/canon"
	"github.com/fleetlearn/fleetlearn/internal/ident"
)

// EventVersion is the "v" of the event schema this package writes.
const EventVersion = 1

// Limits on event fields.
const (
	MaxFieldBytes   = 256      // identifiers: actor id, task, model, module
	MaxPayloadBytes = 64 << 10 // the canonical payload object
	MaxEventBytes   = 96 << 10 // the whole canonical event
)

// ActorKind says who caused an event.
type ActorKind string

// Actor kinds.
const (
	ActorOperator ActorKind = "operator" // a person, through the API or CLI
	ActorService  ActorKind = "service"  // the aggregator service or one of its parts
	ActorDevice   ActorKind = "device"   // an edge device, by pseudonym only
)

// Actor identifies who caused an event.
type Actor struct {
	Kind ActorKind
	ID   string
}

// Operator is the actor for a person acting through the API.
func Operator(id string) Actor { return Actor{Kind: ActorOperator, ID: id} }

// Service is the actor for a component of the service.
func Service(id string) Actor { return Actor{Kind: ActorService, ID: id} }

// Device is the actor for an edge device; pseudonym must come from
// PseudonymizeDevice (or (*Log).PseudonymizeDevice).
func Device(pseudonym string) Actor { return Actor{Kind: ActorDevice, ID: pseudonym} }

// String is "kind:id".
func (a Actor) String() string { return string(a.Kind) + ":" + a.ID }

// Subject says what an event is about. Empty fields (and round 0, since
// rounds are numbered from 1) mean "not about one".
type Subject struct {
	Task   string
	Round  uint64
	Model  string // model version, 64 lowercase hex
	Module string // module SHA-256, 64 lowercase hex
}

// Event is one audit event. The log stamps Time when the event is appended;
// its canonical JSON is the payload of the entry's JWS:
//
//	{"v":1,"ts":"2026-01-02T03:04:05.123456789Z","actor":{"kind":"operator","id":"alice"},
//	 "type":"task.created","subject":{"task":"t-1","round":0,"model":"","module":""},"payload":{...}}
type Event struct {
	Time    time.Time
	Actor   Actor
	Type    EventType
	Subject Subject
	// Payload is the canonical JSON object of the typed payload; see
	// DecodePayload.
	Payload json.RawMessage
}

// NewEvent builds an event from a typed payload, checking it. Time is left
// zero for the log to stamp.
func NewEvent(actor Actor, p Payload) (Event, error) {
	if p == nil {
		return Event{}, fmt.Errorf("audit: event: nil payload: %w", ErrInvalidEvent)
	}
	if err := p.validate(); err != nil {
		return Event{}, fmt.Errorf("audit: event %s: %w", p.EventType(), err)
	}
	body, err := canon.Build(p.encode)
	if err != nil {
		return Event{}, fmt.Errorf("audit: event %s: %w: %w", p.EventType(), ErrInvalidEvent, err)
	}
	ev := Event{Actor: actor, Type: p.EventType(), Subject: p.subject(), Payload: body}
	// canon.Build wrote the payload canonical; the append that takes the
	// event checks it whole, once.
	if err := ev.checkFields(); err != nil {
		return Event{}, fmt.Errorf("audit: event %s: %w", p.EventType(), err)
	}
	return ev, nil
}

var typeRE = regexp.MustCompile(`^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$`)

// check validates everything but Time.
func (e Event) check() error {
	if err := e.checkFields(); err != nil {
		return err
	}
	if len(e.Payload) > 0 {
		c, err := canon.CanonicalizeObject(e.Payload)
		if err != nil {
			return fmt.Errorf("payload: %w: %w", ErrInvalidEvent, err)
		}
		if !bytes.Equal(c, e.Payload) {
			return fmt.Errorf("payload: %w", ErrNotCanonical)
		}
	}
	return nil
}

// checkFields validates everything but Time and the payload's form.
func (e Event) checkFields() error {
	if err := e.Actor.check(); err != nil {
		return err
	}
	if len(e.Type) > MaxFieldBytes || !typeRE.MatchString(string(e.Type)) {
		return fmt.Errorf("type %q: %w", e.Type, ErrInvalidEvent)
	}
	if err := checkField("subject.task", e.Subject.Task, false); err != nil {
		return err
	}
	if err := checkHexField("subject.model", e.Subject.Model, false); err != nil {
		return err
	}
	if err := checkHexField("subject.module", e.Subject.Module, false); err != nil {
		return err
	}
	if len(e.Payload) > MaxPayloadBytes {
		return fmt.Errorf("payload of %d bytes: %w", len(e.Payload), ErrTooLarge)
	}
	return nil
}

func (a Actor) check() error {
	switch a.Kind {
	case ActorOperator, ActorService:
		return checkField("actor.id", a.ID, true)
	case ActorDevice:
		if !isPseudonym(a.ID) {
			return fmt.Errorf("actor.id: %w", ErrNotPseudonym)
		}
		return nil
	}
	return fmt.Errorf("actor.kind %q: %w", a.Kind, ErrInvalidEvent)
}

// checkField: UTF-8 identifier text without control characters.
func checkField(name, v string, required bool) error {
	switch {
	case v == "" && required:
		return fmt.Errorf("%s is required: %w", name, ErrInvalidEvent)
	case len(v) > MaxFieldBytes:
		return fmt.Errorf("%s of %d bytes: %w", name, len(v), ErrInvalidEvent)
	case !utf8.ValidString(v):
		return fmt.Errorf("%s is not UTF-8: %w", name, ErrInvalidEvent)
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return fmt.Errorf("%s contains control character %U: %w", name, r, ErrInvalidEvent)
		}
	}
	return nil
}

// checkText is checkField for free text: longer, newlines and tabs allowed.
func checkText(name, v string) error {
	if len(v) > 4096 {
		return fmt.Errorf("%s of %d bytes: %w", name, len(v), ErrInvalidEvent)
	}
	if !utf8.ValidString(v) {
		return fmt.Errorf("%s is not UTF-8: %w", name, ErrInvalidEvent)
	}
	return nil
}

func checkHexField(name, v string, required bool) error {
	if v == "" && !required {
		return nil
	}
	if !ident.IsSHA256(v) {
		return fmt.Errorf("%s %q is not 64 lowercase hex digits: %w", name, v, ErrInvalidEvent)
	}
	return nil
}

// MarshalCanonical returns the event's canonical JSON. Time must be set; it
// is written in UTC with RFC 3339 nanosecond precision.
func (e Event) MarshalCanonical() ([]byte, error) {
	if err := e.check(); err != nil {
		return nil, fmt.Errorf("audit: event: %w", err)
	}
	return e.marshal()
}

// marshal is MarshalCanonical for an event that passed check.
func (e Event) marshal() ([]byte, error) {
	if e.Time.IsZero() {
		return nil, fmt.Errorf("audit: event: no time: %w", ErrInvalidEvent)
	}
	if y := e.Time.UTC().Year(); y < 1 || y > 9999 {
		return nil, fmt.Errorf("audit: event: time %v: %w", e.Time, ErrInvalidEvent)
	}
	payload := e.Payload
	if len(payload) == 0 {
		payload = json.RawMessage("{}")
	}
	b, err := canon.Build(func(o *canon.Object) {
		o.Int("v", EventVersion)
		o.String("ts", formatTime(e.Time))
		o.Object("actor", func(a *canon.Object) {
			a.String("kind", string(e.Actor.Kind))
			a.String("id", e.Actor.ID)
		})
		o.String("type", string(e.Type))
		o.Object("subject", func(s *canon.Object) {
			s.String("task", e.Subject.Task)
			s.Uint("round", e.Subject.Round)
			s.String("model", e.Subject.Model)
			s.String("module", e.Subject.Module)
		})
		o.Raw("payload", payload)
	})
	if err != nil {
		return nil, fmt.Errorf("audit: event: %w: %w", ErrInvalidEvent, err)
	}
	if len(b) > MaxEventBytes {
		return nil, fmt.Errorf("audit: event of %d bytes: %w", len(b), ErrTooLarge)
	}
	return b, nil
}

func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// wireEvent mirrors the canonical JSON for decoding.
type wireEvent struct {
	V     *int   `json:"v"`
	TS    string `json:"ts"`
	Actor struct {
		Kind string `json:"kind"`
		ID   string `json:"id"`
	} `json:"actor"`
	Type    string `json:"type"`
	Subject struct {
		Task   string `json:"task"`
		Round  uint64 `json:"round"`
		Model  string `json:"model"`
		Module string `json:"module"`
	} `json:"subject"`
	Payload json.RawMessage `json:"payload"`
}

// ParseEvent decodes an event's JSON and checks that it is exactly the
// canonical form MarshalCanonical writes: same members, order, escaping and
// number formatting. Any other spelling of the same event is rejected, so
// the bytes an auditor hashes are the only spelling there is.
func ParseEvent(b []byte) (Event, error) {
	if len(b) > MaxEventBytes {
		return Event{}, fmt.Errorf("audit: event of %d bytes: %w", len(b), ErrTooLarge)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var w wireEvent
	if err := dec.Decode(&w); err != nil {
		return Event{}, fmt.Errorf("audit: event: %w: %w", ErrInvalidEvent, err)
	}
	if dec.More() {
		return Event{}, fmt.Errorf("audit: event: trailing data: %w", ErrInvalidEvent)
	}
	if w.V == nil || *w.V != EventVersion {
		return Event{}, fmt.Errorf("audit: event: unsupported version: %w", ErrInvalidEvent)
	}
	ts, err := time.Parse(time.RFC3339Nano, w.TS)
	if err != nil || ts.Location() != time.UTC {
		return Event{}, fmt.Errorf("audit: event: ts %q is not RFC 3339 UTC: %w", w.TS, ErrInvalidEvent)
	}
	ev := Event{
		Time:    ts,
		Actor:   Actor{Kind: ActorKind(w.Actor.Kind), ID: w.Actor.ID},
		Type:    EventType(w.Type),
		Subject: Subject{Task: w.Subject.Task, Round: w.Subject.Round, Model: w.Subject.Model, Module: w.Subject.Module},
		Payload: w.Payload,
	}
	if len(ev.Payload) == 0 || bytes.Equal(ev.Payload, []byte("null")) {
		return Event{}, fmt.Errorf("audit: event: no payload object: %w", ErrInvalidEvent)
	}
	again, err := ev.MarshalCanonical()
	if err != nil {
		return Event{}, err
	}
	if !bytes.Equal(again, b) {
		return Event{}, fmt.Errorf("audit: event: %w", ErrNotCanonical)
	}
	return ev, nil
}
