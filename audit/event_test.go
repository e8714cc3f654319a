package audit

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// allPayloads has one valid payload of every event type.
func allPayloads() []Payload {
	dev := PseudonymizeDevice([]byte("key"), "device-1")
	return []Payload{
		TaskCreated{Task: "t-1", Name: "fine-tune", BaseModel: hexA, Module: hexB, Rounds: 50, CohortTarget: 20, ReportGoal: 15,
			AggregationRule: "fedavg", SecAgg: true, DP: true, ConfigSHA256: hexC, Settings: map[string]string{"lr": "0.01", "epochs": "2"}},
		TaskChanged{Task: "t-1", Changes: []Change{{Field: "rounds_total", Old: "50", New: "60"}}, ConfigSHA256: hexC},
		TaskStopped{Task: "t-1", State: TaskStoppedBy, Reason: "operator request", Rounds: 12},
		ModuleRegistered{Module: hexB, Name: "mlp", ABI: 1, Size: 123456, Signer: "release-key-1"},
		ModelImported{Model: hexA, SHA256: hexA, Name: "mnist-base", SourceJob: "pool-job-7", Size: 1 << 20, Parameters: 101770},
		RoundOpened{Task: "t-1", Round: 1, Model: hexA, Module: hexB, CohortSize: 26, Eligibility: "idle, charging", SecAggSHA256: hexC},
		RoundClosed{Task: "t-1", Round: 1, Outcome: RoundAbandoned, Reports: 3, Dropouts: 23, AggregationRule: "fedavg", Reason: "report goal not met"},
		ModelCommitted{Task: "t-1", Round: 2, Model: hexC, SHA256: hexC, Parent: hexA},
		ModelEvaluated{Task: "t-1", Round: 2, Model: hexC, Dataset: "holdout", Samples: 10000, Metrics: map[string]float64{"accuracy": 0.9731, "loss": 0.0873}},
		PrivacySpent{Task: "t-1", Round: 2, Mechanism: "gaussian", Accountant: "rdp", ClipNorm: 1, NoiseMultiplier: 1.1, SamplingRate: 0.02,
			Delta: 1e-5, Epsilon: 0.31, CumulativeEpsilon: 0.62, EpsilonBudget: 8},
		BudgetRefused{Task: "t-1", Round: 27, CumulativeEpsilon: 7.9, RequestedEpsilon: 0.31, EpsilonBudget: 8, Delta: 1e-5, Reason: "budget exhausted"},
		DeviceEnrolled{Device: dev, Credential: "ed25519:0a1b"},
		DeviceRevoked{Device: dev, Reason: "reported lost"},
		OperatorAction{Method: "fleetlearn.v1.TaskService/StopTask", Resource: "tasks/t-1", Result: ResultDenied, Code: "PERMISSION_DENIED",
			RequestSHA256: hexA, Task: "t-1"},
		PoolJob{Job: "pool-job-7", Kind: "pretrain", State: JobSucceeded, Model: hexA, Detail: "42 epochs"},
		ParticipationRefused{Task: "t-1", Round: 9, Step: 7, MaxRounds: 4, MinSeparation: 3,
			Devices: []RefusedDevice{{Device: dev, Rule: RuleMinSeparation, LastStep: 5}}, More: 2},
	}
}

func TestEveryEventType(t *testing.T) {
	ps := allPayloads()
	if len(ps) != len(EventTypes()) {
		t.Fatalf("%d payloads for %d types", len(ps), len(EventTypes()))
	}
	seen := map[EventType]bool{}
	for _, p := range ps {
		seen[p.EventType()] = true
		ev, err := NewEvent(Operator("alice@example.com"), p)
		if err != nil {
			t.Fatalf("%s: %v", p.EventType(), err)
		}
		ev.Time = t0.Add(123456789)
		b, err := ev.MarshalCanonical()
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseEvent(b)
		if err != nil {
			t.Fatalf("%s: ParseEvent: %v\n%s", p.EventType(), err, b)
		}
		if !back.Time.Equal(ev.Time) || back.Type != ev.Type || back.Actor != ev.Actor || back.Subject != ev.Subject {
			t.Fatalf("%s: round trip %+v", p.EventType(), back)
		}
		typed, err := back.DecodePayload()
		if err != nil {
			t.Fatalf("%s: DecodePayload: %v", p.EventType(), err)
		}
		// The decoded payload encodes to the same bytes: encode and the
		// json tags agree.
		ev2, err := NewEvent(back.Actor, typed)
		if err != nil || !bytes.Equal(ev2.Payload, ev.Payload) {
			t.Fatalf("%s: re-encoded payload %s, want %s (%v)", p.EventType(), ev2.Payload, ev.Payload, err)
		}
	}
	for _, typ := range EventTypes() {
		if !seen[typ] {
			t.Errorf("no payload for %s", typ)
		}
	}
}

func TestCanonicalGolden(t *testing.T) {
	ev, err := NewEvent(Operator("alice"), RoundClosed{Task: "t-1", Round: 3, Outcome: RoundCommitted, Reports: 18, Dropouts: 2,
		AggregationRule: "fedavg", Reason: "quota \"met\" <ok>"})
	if err != nil {
		t.Fatal(err)
	}
	ev.Time = time.Date(2026, 1, 2, 3, 4, 5, 120000000, time.FixedZone("CET", 3600))
	b, err := ev.MarshalCanonical()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"v":1,"ts":"2026-01-02T02:04:05.12Z","actor":{"kind":"operator","id":"alice"},"type":"round.closed",` +
		`"subject":{"task":"t-1","round":3,"model":"","module":""},` +
		`"payload":{"task":"t-1","round":3,"outcome":"committed","reports":18,"dropouts":2,"aggregation_rule":"fedavg","reason":"quota \"met\" <ok>"}}`
	if string(b) != want {
		t.Fatalf("got  %s\nwant %s", b, want)
	}
	ev2, _ := NewEvent(Operator("a"), PrivacySpent{Task: "t", Round: 1, Mechanism: "gaussian", Delta: 1e-7, Epsilon: 0.1, EpsilonBudget: 1e21})
	ev2.Time = t0
	b2, _ := ev2.MarshalCanonical()
	if !strings.Contains(string(b2), `"delta":1e-7,"epsilon":0.1,"cumulative_epsilon":0,"epsilon_budget":1e+21}`) {
		t.Fatalf("number formatting: %s", b2)
	}
}

func TestParseEventRejects(t *testing.T) {
	ev, _ := NewEvent(Service("coordinator"), TaskStopped{Task: "t-1", State: TaskCompleted})
	ev.Time = t0
	good, _ := ev.MarshalCanonical()
	if _, err := ParseEvent(good); err != nil {
		t.Fatal(err)
	}
	variants := map[string]string{
		"space":            strings.Replace(string(good), `"v":1,`, `"v": 1,`, 1),
		"key order":        strings.Replace(string(good), `{"v":1,"ts":"2026-01-02T03:04:05Z",`, `{"ts":"2026-01-02T03:04:05Z","v":1,`, 1),
		"offset time":      strings.Replace(string(good), `03:04:05Z`, `04:04:05+01:00`, 1),
		"version 2":        strings.Replace(string(good), `"v":1`, `"v":2`, 1),
		"no version":       strings.Replace(string(good), `"v":1,`, ``, 1),
		"extra member":     strings.Replace(string(good), `"v":1,`, `"v":1,"x":0,`, 1),
		"duplicate":        strings.Replace(string(good), `"v":1,`, `"v":1,"v":1,`, 1),
		"escaped slash":    strings.Replace(string(good), `"t-1"`, `"t\/1"`, 1),
		"unicode escape":   strings.Replace(string(good), `"t-1"`, `"\u0074-1"`, 1),
		"payload spacing":  strings.Replace(string(good), `"payload":{"task"`, `"payload":{ "task"`, 1),
		"null payload":     string(good[:bytes.Index(good, []byte(`"payload"`))]) + `"payload":null}`,
		"raw device":       strings.Replace(string(good), `{"kind":"service","id":"coordinator"}`, `{"kind":"device","id":"dev-1"}`, 1),
		"trailing":         string(good) + " ",
		"second value":     string(good) + "{}",
		"upper key":        strings.Replace(string(good), `"v":1`, `"V":1`, 1),
		"fraction version": strings.Replace(string(good), `"v":1`, `"v":1.0`, 1),
		"negative round":   strings.Replace(string(good), `"round":0`, `"round":-1`, 1),
		"bad utf8":         strings.Replace(string(good), `"t-1"`, "\"t\xff1\"", 1),
	}
	for name, v := range variants {
		if v == string(good) {
			t.Fatalf("%s: variant unchanged", name)
		}
		_, err := ParseEvent([]byte(v))
		if err == nil {
			t.Errorf("%s: accepted %s", name, v)
		}
		t.Logf("%s: %v", name, err)
	}
	if _, err := ParseEvent(bytes.Repeat([]byte(" "), MaxEventBytes+1)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversized: %v", err)
	}
}

// Adaptive clipping's fields read back as written, a noised fraction
// outside [0, 1] included.
func TestPrivacySpentAdaptiveClipping(t *testing.T) {
	p := PrivacySpent{Task: "t", Round: 3, Mechanism: "central-gaussian", Accountant: "rdp", ClipNorm: 0.8, NoiseMultiplier: 1,
		Delta: 1e-6, Epsilon: 0.1, CumulativeEpsilon: 0.3, EpsilonBudget: 8, UnclippedFraction: new(-0.0625), NextClipNorm: 0.9}
	ev, err := NewEvent(Operator("a"), p)
	if err != nil {
		t.Fatal(err)
	}
	ev.Time = t0
	b, err := ev.MarshalCanonical()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"unclipped_fraction":-0.0625,"next_clip_norm":0.9`) {
		t.Fatalf("encoding %s", b)
	}
	back, err := ParseEvent(b)
	if err != nil {
		t.Fatal(err)
	}
	got, err := back.DecodePayload()
	if err != nil {
		t.Fatal(err)
	}
	if q := got.(PrivacySpent); q.UnclippedFraction == nil || *q.UnclippedFraction != -0.0625 || q.NextClipNorm != 0.9 {
		t.Fatalf("read back %+v", q)
	}
}

func TestPayloadValidation(t *testing.T) {
	for _, p := range []Payload{
		TaskCreated{Task: "t", BaseModel: "v1", Module: hexB, AggregationRule: "fedavg"},
		TaskCreated{Task: "t", BaseModel: hexA, Module: hexB},
		TaskCreated{Task: "t", BaseModel: hexA, Module: hexB, AggregationRule: "x", Settings: map[string]string{"": "x"}},
		TaskChanged{Task: "t"},
		TaskStopped{Task: "t", State: "paused"},
		ModuleRegistered{Module: strings.ToUpper(hexB)},
		ModelImported{Model: hexA, SHA256: hexA[:63]},
		RoundOpened{Task: "t", Round: 0, Model: hexA},
		RoundClosed{Task: "t", Round: 1, Outcome: "done"},
		ModelCommitted{Task: "t", Round: 1, Model: hexA, SHA256: hexA},
		ModelEvaluated{Model: hexA, Metrics: map[string]float64{"loss": math.NaN()}},
		ModelEvaluated{Model: hexA},
		PrivacySpent{Task: "t", Round: 1, Mechanism: "gaussian", Epsilon: math.Inf(1)},
		PrivacySpent{Task: "t", Round: 1, Mechanism: "gaussian", Delta: -1},
		PrivacySpent{Task: "t", Round: 1, Mechanism: "gaussian", Noise: "fft"},
		PrivacySpent{Task: "t", Round: 1, Mechanism: "gaussian", Noise: "tree", NoiseStateSHA256: "xyz"},
		PrivacySpent{Task: "t", Round: 1, Mechanism: "gaussian", NextClipNorm: 1},
		PrivacySpent{Task: "t", Round: 1, Mechanism: "gaussian", UnclippedFraction: new(0.5)},
		PrivacySpent{Task: "t", Round: 1, Mechanism: "gaussian", UnclippedFraction: new(math.NaN()), NextClipNorm: 1},
		BudgetRefused{Task: "t", Round: 1, EpsilonBudget: math.NaN()},
		DeviceEnrolled{Device: "device-1"},
		DeviceRevoked{Device: "pd-" + hexA[:10]},
		OperatorAction{Method: "m", Result: "maybe"},
		OperatorAction{Result: ResultOK},
		PoolJob{Job: "j", Kind: "k", State: "lost"},
		ParticipationRefused{Task: "t", Round: 1, Devices: []RefusedDevice{{Device: "device-1", Rule: RuleMaxRounds}}},
		ParticipationRefused{Task: "t", Round: 1, Devices: []RefusedDevice{{Device: PseudonymizeDevice([]byte("k"), "d"), Rule: "often"}}},
		ParticipationRefused{Task: "t", Round: 1, Devices: make([]RefusedDevice, MaxRefusedListed+1)},
		TaskStopped{Task: "t\x00", State: TaskCompleted},
		TaskStopped{Task: strings.Repeat("t", MaxFieldBytes+1), State: TaskCompleted},
		TaskStopped{Task: "t", State: TaskCompleted, Reason: "\xff"},
	} {
		if _, err := NewEvent(Operator("a"), p); err == nil {
			t.Errorf("%T %+v accepted", p, p)
		} else if !errors.Is(err, ErrInvalidEvent) && !errors.Is(err, ErrNotPseudonym) {
			t.Errorf("%T: %v", p, err)
		}
	}
	if _, err := NewEvent(Operator("a"), nil); !errors.Is(err, ErrInvalidEvent) {
		t.Errorf("nil payload: %v", err)
	}
	if _, err := (Event{Actor: Operator("a"), Type: TypeTaskStopped}).MarshalCanonical(); !errors.Is(err, ErrInvalidEvent) {
		t.Errorf("no time: %v", err)
	}
	if _, err := (Event{Type: "x.y"}).DecodePayload(); !errors.Is(err, ErrInvalidEvent) {
		t.Errorf("unknown type: %v", err)
	}
}

// forge builds a compact JWS from raw parts.
func forge(header, payload string, sig []byte) []byte {
	b64 := base64.RawURLEncoding.EncodeToString
	return []byte(b64([]byte(header)) + "." + b64([]byte(payload)) + "." + b64(sig))
}

func TestVerifyEntryRejects(t *testing.T) {
	k := testKeys(t, 5)
	pub := k.Entry.Public().(ed25519.PublicKey)
	kid, _ := keyID(pub)
	s := entrySigner{priv: k.Entry, kid: kid}
	ev, _ := NewEvent(Operator("a"), TaskStopped{Task: "t", State: TaskCompleted})
	ev.Time = t0
	payload, _ := ev.MarshalCanonical()
	good, err := s.sign(4, payload)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := VerifyEntry(Entry{Index: 4, Data: good}, pub); err != nil || got.Type != TypeTaskStopped {
		t.Fatalf("good entry: %v", err)
	}
	signHeader := func(header string, sign func(msg []byte) []byte) []byte {
		b64 := base64.RawURLEncoding.EncodeToString
		msg := b64([]byte(header)) + "." + b64(payload)
		return []byte(msg + "." + b64(sign([]byte(msg))))
	}
	edSign := func(msg []byte) []byte { return ed25519.Sign(k.Entry, msg) }
	hmacPub := func(msg []byte) []byte {
		m := hmac.New(sha256.New, pub)
		m.Write(msg)
		return m.Sum(nil)
	}
	hdr := func(alg, extra string) string {
		return `{"alg":"` + alg + `","idx":4,"kid":"` + kid + `","typ":"fleetlearn-audit-event"` + extra + `}`
	}
	other := testKeys(t, 6)
	otherSigner := entrySigner{priv: other.Entry, kid: kid}
	otherSigned, _ := otherSigner.sign(4, payload)
	tamperedPayload := bytes.Clone(good)
	tamperedPayload[len(tamperedPayload)/2] ^= 1
	cases := map[string]struct {
		data  []byte
		index uint64
		want  error
	}{
		"wrong index":          {good, 5, ErrBadSignature},
		"wrong key":            {otherSigned, 4, ErrBadSignature},
		"flipped byte":         {tamperedPayload, 4, nil},
		"alg HS256 with pub":   {signHeader(hdr("HS256", ""), hmacPub), 4, ErrMalformedEntry},
		"alg none":             {forge(hdr("none", ""), string(payload), nil), 4, ErrMalformedEntry},
		"alg ES256 header":     {signHeader(hdr("ES256", ""), edSign), 4, ErrMalformedEntry},
		"b64 false":            {signHeader(hdr("EdDSA", `,"b64":false,"crit":["b64"]`), edSign), 4, ErrMalformedEntry},
		"embedded jwk":         {signHeader(hdr("EdDSA", `,"jwk":{"kty":"OKP"}`), edSign), 4, ErrMalformedEntry},
		"duplicate alg":        {signHeader(`{"alg":"EdDSA","alg":"HS256","idx":4,"kid":"`+kid+`","typ":"fleetlearn-audit-event"}`, edSign), 4, ErrMalformedEntry},
		"other kid":            {signHeader(`{"alg":"EdDSA","idx":4,"kid":"x","typ":"fleetlearn-audit-event"}`, edSign), 4, ErrBadSignature},
		"no idx":               {signHeader(`{"alg":"EdDSA","kid":"`+kid+`","typ":"fleetlearn-audit-event"}`, edSign), 4, ErrMalformedEntry},
		"other typ":            {signHeader(`{"alg":"EdDSA","idx":4,"kid":"`+kid+`","typ":"JWT"}`, edSign), 4, ErrMalformedEntry},
		"JSON serialization":   {[]byte(`{"payload":"e30","signatures":[]}`), 4, ErrMalformedEntry},
		"two parts":            {good[:bytes.LastIndexByte(good, '.')], 4, ErrMalformedEntry},
		"four parts":           {append(bytes.Clone(good), ".x"...), 4, ErrMalformedEntry},
		"padding":              {append(bytes.Clone(good), '='), 4, ErrMalformedEntry},
		"empty":                {nil, 4, ErrMalformedEntry},
		"oversized":            {bytes.Repeat([]byte("a"), MaxEntryBytes+1), 4, ErrTooLarge},
		"signed non-canonical": {signHeaderPayload(hdr("EdDSA", ""), " "+string(payload), edSign), 4, ErrNotCanonical},
	}
	for name, tc := range cases {
		_, err := VerifyEntry(Entry{Index: tc.index, Data: tc.data}, pub)
		t.Logf("%s: %v", name, err)
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	if _, err := VerifyEntry(Entry{Index: 4, Data: good}, pub[:10]); !errors.Is(err, ErrInvalidKeys) {
		t.Errorf("short key: %v", err)
	}
}

func signHeaderPayload(header, payload string, sign func([]byte) []byte) []byte {
	b64 := base64.RawURLEncoding.EncodeToString
	msg := b64([]byte(header)) + "." + b64([]byte(payload))
	return []byte(msg + "." + b64(sign([]byte(msg))))
}
