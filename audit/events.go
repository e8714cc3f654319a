package audit

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/fleetlearn/fleetlearn/audit/internal/canon"
)

// EventType names a kind of event, "area.what".
type EventType string

// Event types. docs/AUDIT.md lists what each records and which record-keeping
// requirement it serves.
const (
	TypeTaskCreated      EventType = "task.created"
	TypeTaskChanged      EventType = "task.changed"
	TypeTaskStopped      EventType = "task.stopped"
	TypeModuleRegistered EventType = "module.registered"
	TypeModelImported    EventType = "model.imported"
	TypeRoundOpened      EventType = "round.opened"
	TypeRoundClosed      EventType = "round.closed"
	TypeModelCommitted   EventType = "model.committed"
	TypeModelEvaluated   EventType = "model.evaluated"
	TypePrivacySpent     EventType = "dp.spent"
	TypeBudgetRefused    EventType = "dp.budget_refused"
	TypeDeviceEnrolled   EventType = "device.enrolled"
	TypeDeviceRevoked    EventType = "device.revoked"
	TypeOperatorAction   EventType = "operator.action"
	TypePoolJob          EventType = "pool.job"
	// TypeParticipationRefused lists the devices a round turned away for
	// differential privacy's participation limits.
	TypeParticipationRefused EventType = "dp.participation_refused"
)

// EventTypes lists every event type this package defines.
func EventTypes() []EventType {
	return []EventType{
		TypeTaskCreated, TypeTaskChanged, TypeTaskStopped, TypeModuleRegistered,
		TypeModelImported, TypeRoundOpened, TypeRoundClosed, TypeModelCommitted,
		TypeModelEvaluated, TypePrivacySpent, TypeBudgetRefused, TypeDeviceEnrolled,
		TypeDeviceRevoked, TypeOperatorAction, TypePoolJob, TypeParticipationRefused,
	}
}

// Payload is the typed body of one event type. The implementations are the
// structs of this file; NewEvent turns one into an Event and
// Event.DecodePayload turns it back. Their JSON members are written in the
// order of the struct fields, maps with sorted keys.
type Payload interface {
	// EventType is the type of event this payload belongs to.
	EventType() EventType
	subject() Subject
	validate() error
	encode(*canon.Object)
}

// DecodePayload returns the typed payload of an event of a type this
// package defines.
func (e Event) DecodePayload() (Payload, error) {
	var p Payload
	switch e.Type {
	case TypeTaskCreated:
		p = &TaskCreated{}
	case TypeTaskChanged:
		p = &TaskChanged{}
	case TypeTaskStopped:
		p = &TaskStopped{}
	case TypeModuleRegistered:
		p = &ModuleRegistered{}
	case TypeModelImported:
		p = &ModelImported{}
	case TypeRoundOpened:
		p = &RoundOpened{}
	case TypeRoundClosed:
		p = &RoundClosed{}
	case TypeModelCommitted:
		p = &ModelCommitted{}
	case TypeModelEvaluated:
		p = &ModelEvaluated{}
	case TypePrivacySpent:
		p = &PrivacySpent{}
	case TypeBudgetRefused:
		p = &BudgetRefused{}
	case TypeDeviceEnrolled:
		p = &DeviceEnrolled{}
	case TypeDeviceRevoked:
		p = &DeviceRevoked{}
	case TypeOperatorAction:
		p = &OperatorAction{}
	case TypePoolJob:
		p = &PoolJob{}
	case TypeParticipationRefused:
		p = &ParticipationRefused{}
	default:
		return nil, fmt.Errorf("audit: payload of unknown type %q: %w", e.Type, ErrInvalidEvent)
	}
	if err := json.Unmarshal(e.Payload, p); err != nil {
		return nil, fmt.Errorf("audit: payload of %s: %w: %w", e.Type, ErrInvalidEvent, err)
	}
	return deref(p), nil
}

// deref returns the struct value, so payloads compare and print as built.
func deref(p Payload) Payload {
	switch v := p.(type) {
	case *TaskCreated:
		return *v
	case *TaskChanged:
		return *v
	case *TaskStopped:
		return *v
	case *ModuleRegistered:
		return *v
	case *ModelImported:
		return *v
	case *RoundOpened:
		return *v
	case *RoundClosed:
		return *v
	case *ModelCommitted:
		return *v
	case *ModelEvaluated:
		return *v
	case *PrivacySpent:
		return *v
	case *BudgetRefused:
		return *v
	case *DeviceEnrolled:
		return *v
	case *DeviceRevoked:
		return *v
	case *OperatorAction:
		return *v
	case *PoolJob:
		return *v
	case *ParticipationRefused:
		return *v
	}
	return p
}

// check helpers: each returns the first problem.

type checks struct{ err error }

func (c *checks) field(name, v string, required bool) {
	if c.err == nil {
		c.err = checkField(name, v, required)
	}
}

func (c *checks) text(name, v string) {
	if c.err == nil {
		c.err = checkText(name, v)
	}
}

func (c *checks) hex(name, v string, required bool) {
	if c.err == nil {
		c.err = checkHexField(name, v, required)
	}
}

func (c *checks) round(r uint64) {
	if c.err == nil && r == 0 {
		c.err = fmt.Errorf("round must be at least 1: %w", ErrInvalidEvent)
	}
}

func (c *checks) finite(name string, v float64, nonNegative bool) {
	if c.err != nil {
		return
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		c.err = fmt.Errorf("%s is %v: %w", name, v, ErrInvalidEvent)
	} else if nonNegative && v < 0 {
		c.err = fmt.Errorf("%s is negative: %w", name, ErrInvalidEvent)
	}
}

func (c *checks) oneOf(name, v string, allowed ...string) {
	if c.err != nil {
		return
	}
	for _, a := range allowed {
		if v == a {
			return
		}
	}
	c.err = fmt.Errorf("%s %q is not one of %q: %w", name, v, allowed, ErrInvalidEvent)
}

func (c *checks) pseudonym(name, v string) {
	if c.err == nil && !isPseudonym(v) {
		c.err = fmt.Errorf("%s: %w", name, ErrNotPseudonym)
	}
}

func (c *checks) stringMap(name string, m map[string]string) {
	if len(m) > 256 && c.err == nil {
		c.err = fmt.Errorf("%s has %d entries: %w", name, len(m), ErrInvalidEvent)
	}
	for k, v := range m {
		c.field(name+" key", k, true)
		c.text(name+"["+k+"]", v)
	}
}

// TaskCreated records a new training task and its design choices (model,
// module, cohort, aggregation, privacy settings).
type TaskCreated struct {
	Task            string `json:"task"`
	Name            string `json:"name"`
	BaseModel       string `json:"base_model"` // model version the first round starts from
	Module          string `json:"module"`     // SHA-256 of the WASM module
	Rounds          uint64 `json:"rounds"`
	CohortTarget    uint64 `json:"cohort_target"`
	ReportGoal      uint64 `json:"report_goal"`
	AggregationRule string `json:"aggregation_rule"`
	SecAgg          bool   `json:"secagg"`
	DP              bool   `json:"dp"`
	// ConfigSHA256 is the SHA-256 of the full task configuration as
	// submitted, so the exact settings can be matched to a stored copy.
	ConfigSHA256 string `json:"config_sha256"`
	// Settings holds further design choices by name (learning rate, local
	// epochs, clipping norm, ...).
	Settings map[string]string `json:"settings"`
}

func (TaskCreated) EventType() EventType { return TypeTaskCreated }
func (p TaskCreated) subject() Subject {
	return Subject{Task: p.Task, Model: p.BaseModel, Module: p.Module}
}
func (p TaskCreated) validate() error {
	var c checks
	c.field("task", p.Task, true)
	c.field("name", p.Name, false)
	c.hex("base_model", p.BaseModel, true)
	c.hex("module", p.Module, true)
	c.field("aggregation_rule", p.AggregationRule, true)
	c.hex("config_sha256", p.ConfigSHA256, false)
	c.stringMap("settings", p.Settings)
	return c.err
}
func (p TaskCreated) encode(o *canon.Object) {
	o.String("task", p.Task)
	o.String("name", p.Name)
	o.String("base_model", p.BaseModel)
	o.String("module", p.Module)
	o.Uint("rounds", p.Rounds)
	o.Uint("cohort_target", p.CohortTarget)
	o.Uint("report_goal", p.ReportGoal)
	o.String("aggregation_rule", p.AggregationRule)
	o.Bool("secagg", p.SecAgg)
	o.Bool("dp", p.DP)
	o.String("config_sha256", p.ConfigSHA256)
	o.StringMap("settings", p.Settings)
}

// Change is one changed setting of a task.
type Change struct {
	Field string `json:"field"`
	Old   string `json:"old"`
	New   string `json:"new"`
}

// TaskChanged records a change to a task's settings.
type TaskChanged struct {
	Task         string   `json:"task"`
	Changes      []Change `json:"changes"`
	ConfigSHA256 string   `json:"config_sha256"` // of the configuration after the change
}

func (TaskChanged) EventType() EventType { return TypeTaskChanged }
func (p TaskChanged) subject() Subject   { return Subject{Task: p.Task} }
func (p TaskChanged) validate() error {
	var c checks
	c.field("task", p.Task, true)
	if c.err == nil && (len(p.Changes) == 0 || len(p.Changes) > 256) {
		c.err = fmt.Errorf("%d changes: %w", len(p.Changes), ErrInvalidEvent)
	}
	for _, ch := range p.Changes {
		c.field("changes.field", ch.Field, true)
		c.text("changes.old", ch.Old)
		c.text("changes.new", ch.New)
	}
	c.hex("config_sha256", p.ConfigSHA256, false)
	return c.err
}
func (p TaskChanged) encode(o *canon.Object) {
	o.String("task", p.Task)
	o.Objects("changes", len(p.Changes), func(i int, in *canon.Object) {
		in.String("field", p.Changes[i].Field)
		in.String("old", p.Changes[i].Old)
		in.String("new", p.Changes[i].New)
	})
	o.String("config_sha256", p.ConfigSHA256)
}

// Task end states for TaskStopped.
const (
	TaskCompleted = "completed"
	TaskStoppedBy = "stopped" // by an operator
	TaskFailed    = "failed"
)

// TaskStopped records the end of a task.
type TaskStopped struct {
	Task   string `json:"task"`
	State  string `json:"state"` // TaskCompleted, TaskStoppedBy or TaskFailed
	Reason string `json:"reason"`
	Rounds uint64 `json:"rounds"` // rounds committed
}

func (TaskStopped) EventType() EventType { return TypeTaskStopped }
func (p TaskStopped) subject() Subject   { return Subject{Task: p.Task} }
func (p TaskStopped) validate() error {
	var c checks
	c.field("task", p.Task, true)
	c.oneOf("state", p.State, TaskCompleted, TaskStoppedBy, TaskFailed)
	c.text("reason", p.Reason)
	return c.err
}
func (p TaskStopped) encode(o *canon.Object) {
	o.String("task", p.Task)
	o.String("state", p.State)
	o.String("reason", p.Reason)
	o.Uint("rounds", p.Rounds)
}

// ModuleRegistered records a WASM module accepted for training.
type ModuleRegistered struct {
	Module string `json:"module"` // SHA-256 of the WASM bytes
	Name   string `json:"name"`
	ABI    uint64 `json:"abi"`
	Size   uint64 `json:"size"`
	Signer string `json:"signer"` // id of the key whose signature was verified; "" if unsigned
}

func (ModuleRegistered) EventType() EventType { return TypeModuleRegistered }
func (p ModuleRegistered) subject() Subject   { return Subject{Module: p.Module} }
func (p ModuleRegistered) validate() error {
	var c checks
	c.hex("module", p.Module, true)
	c.field("name", p.Name, false)
	c.field("signer", p.Signer, false)
	return c.err
}
func (p ModuleRegistered) encode(o *canon.Object) {
	o.String("module", p.Module)
	o.String("name", p.Name)
	o.Uint("abi", p.ABI)
	o.Uint("size", p.Size)
	o.String("signer", p.Signer)
}

// ModelImported records a base model brought in from outside federated
// training, with the job that produced it.
type ModelImported struct {
	Model      string `json:"model"`  // version
	SHA256     string `json:"sha256"` // of the safetensors file
	Name       string `json:"name"`
	SourceJob  string `json:"source_job"` // pretraining pool job, "" if unknown
	Size       uint64 `json:"size"`
	Parameters uint64 `json:"parameters"`
}

func (ModelImported) EventType() EventType { return TypeModelImported }
func (p ModelImported) subject() Subject   { return Subject{Model: p.Model} }
func (p ModelImported) validate() error {
	var c checks
	c.hex("model", p.Model, true)
	c.hex("sha256", p.SHA256, true)
	c.field("name", p.Name, false)
	c.field("source_job", p.SourceJob, false)
	return c.err
}
func (p ModelImported) encode(o *canon.Object) {
	o.String("model", p.Model)
	o.String("sha256", p.SHA256)
	o.String("name", p.Name)
	o.String("source_job", p.SourceJob)
	o.Uint("size", p.Size)
	o.Uint("parameters", p.Parameters)
}

// RoundOpened records a round's start: which model, which module, how many
// devices, chosen how, under which secure-aggregation parameters.
type RoundOpened struct {
	Task        string `json:"task"`
	Round       uint64 `json:"round"`
	Model       string `json:"model"`  // version the round trains from
	Module      string `json:"module"` // SHA-256 of the module
	CohortSize  uint64 `json:"cohort_size"`
	Eligibility string `json:"eligibility"` // criteria devices had to meet
	// SecAggSHA256 is the SHA-256 of the round's SecAgg parameters
	// (threshold, cohort, key agreement) as the plans carry them, the
	// deterministic protobuf encoding of each group's in group order when
	// the cohort runs as groups; "" when SecAgg is off.
	SecAggSHA256 string `json:"secagg_sha256"`
}

func (RoundOpened) EventType() EventType { return TypeRoundOpened }
func (p RoundOpened) subject() Subject {
	return Subject{Task: p.Task, Round: p.Round, Model: p.Model, Module: p.Module}
}
func (p RoundOpened) validate() error {
	var c checks
	c.field("task", p.Task, true)
	c.round(p.Round)
	c.hex("model", p.Model, true)
	c.hex("module", p.Module, false)
	c.text("eligibility", p.Eligibility)
	c.hex("secagg_sha256", p.SecAggSHA256, false)
	return c.err
}
func (p RoundOpened) encode(o *canon.Object) {
	o.String("task", p.Task)
	o.Uint("round", p.Round)
	o.String("model", p.Model)
	o.String("module", p.Module)
	o.Uint("cohort_size", p.CohortSize)
	o.String("eligibility", p.Eligibility)
	o.String("secagg_sha256", p.SecAggSHA256)
}

// Round outcomes for RoundClosed.
const (
	RoundCommitted = "committed"
	RoundAbandoned = "abandoned"
)

// RoundClosed records a round's end: how many devices reported, how many
// dropped out, how the reports were combined.
type RoundClosed struct {
	Task            string `json:"task"`
	Round           uint64 `json:"round"`
	Outcome         string `json:"outcome"` // RoundCommitted or RoundAbandoned
	Reports         uint64 `json:"reports"`
	Dropouts        uint64 `json:"dropouts"`
	AggregationRule string `json:"aggregation_rule"`
	Reason          string `json:"reason"` // why a round was abandoned
}

func (RoundClosed) EventType() EventType { return TypeRoundClosed }
func (p RoundClosed) subject() Subject   { return Subject{Task: p.Task, Round: p.Round} }
func (p RoundClosed) validate() error {
	var c checks
	c.field("task", p.Task, true)
	c.round(p.Round)
	c.oneOf("outcome", p.Outcome, RoundCommitted, RoundAbandoned)
	c.field("aggregation_rule", p.AggregationRule, false)
	c.text("reason", p.Reason)
	return c.err
}
func (p RoundClosed) encode(o *canon.Object) {
	o.String("task", p.Task)
	o.Uint("round", p.Round)
	o.String("outcome", p.Outcome)
	o.Uint("reports", p.Reports)
	o.Uint("dropouts", p.Dropouts)
	o.String("aggregation_rule", p.AggregationRule)
	o.String("reason", p.Reason)
}

// ModelCommitted records a new model version produced by a round.
type ModelCommitted struct {
	Task   string `json:"task"`
	Round  uint64 `json:"round"`
	Model  string `json:"model"`  // the new version
	SHA256 string `json:"sha256"` // of its safetensors file
	Parent string `json:"parent"` // version it was derived from
}

func (ModelCommitted) EventType() EventType { return TypeModelCommitted }
func (p ModelCommitted) subject() Subject {
	return Subject{Task: p.Task, Round: p.Round, Model: p.Model}
}
func (p ModelCommitted) validate() error {
	var c checks
	c.field("task", p.Task, true)
	c.round(p.Round)
	c.hex("model", p.Model, true)
	c.hex("sha256", p.SHA256, true)
	c.hex("parent", p.Parent, true)
	return c.err
}
func (p ModelCommitted) encode(o *canon.Object) {
	o.String("task", p.Task)
	o.Uint("round", p.Round)
	o.String("model", p.Model)
	o.String("sha256", p.SHA256)
	o.String("parent", p.Parent)
}

// ModelEvaluated records validation metrics of a model version.
type ModelEvaluated struct {
	Task    string             `json:"task"`
	Round   uint64             `json:"round"` // 0 for an evaluation outside a round
	Model   string             `json:"model"`
	Dataset string             `json:"dataset"` // what it was evaluated on
	Samples uint64             `json:"samples"`
	Metrics map[string]float64 `json:"metrics"`
}

func (ModelEvaluated) EventType() EventType { return TypeModelEvaluated }
func (p ModelEvaluated) subject() Subject {
	return Subject{Task: p.Task, Round: p.Round, Model: p.Model}
}
func (p ModelEvaluated) validate() error {
	var c checks
	c.field("task", p.Task, false)
	c.hex("model", p.Model, true)
	c.field("dataset", p.Dataset, true) // what it was measured on is the point
	// No metrics is a fact worth recording too: an evaluation whose every
	// metric was refused as out of range still happened.
	if c.err == nil && len(p.Metrics) > 256 {
		c.err = fmt.Errorf("%d metrics: %w", len(p.Metrics), ErrInvalidEvent)
	}
	for k, v := range p.Metrics {
		c.field("metrics key", k, true)
		c.finite("metrics["+k+"]", v, false)
	}
	return c.err
}
func (p ModelEvaluated) encode(o *canon.Object) {
	o.String("task", p.Task)
	o.Uint("round", p.Round)
	o.String("model", p.Model)
	o.String("dataset", p.Dataset)
	o.Uint("samples", p.Samples)
	o.FloatMap("metrics", p.Metrics)
}

// PrivacySpent records the differential-privacy parameters of a round and
// the privacy loss spent, in that round and in total for the task.
type PrivacySpent struct {
	Task              string  `json:"task"`
	Round             uint64  `json:"round"`
	Mechanism         string  `json:"mechanism"` // e.g. "gaussian"
	Accountant        string  `json:"accountant"`
	ClipNorm          float64 `json:"clip_norm"`
	NoiseMultiplier   float64 `json:"noise_multiplier"`
	SamplingRate      float64 `json:"sampling_rate"`
	Delta             float64 `json:"delta"`
	Epsilon           float64 `json:"epsilon"`            // spent by this round
	CumulativeEpsilon float64 `json:"cumulative_epsilon"` // spent by the task so far
	EpsilonBudget     float64 `json:"epsilon_budget"`
	// Noise is "tree" or "blt" for noise correlated across rounds, and
	// NoiseStateSHA256 the digest of the noise stream's state after the
	// round as the server stored it: an auditor sees the stream advance
	// once a training round, never rewind. Both are omitted when empty, so
	// older events keep their encoding.
	Noise            string `json:"noise,omitempty"`
	NoiseStateSHA256 string `json:"noise_state_sha256,omitempty"`
	// With adaptive clipping, UnclippedFraction is the round's noised
	// fraction b̄ of updates that were within ClipNorm (a release of the
	// mechanism: it may fall outside [0, 1]) and NextClipNorm the bound it
	// sets for the next training round, ClipNorm·exp(−η·(b̄ − target)).
	// Both are omitted without adaptive clipping.
	UnclippedFraction *float64 `json:"unclipped_fraction,omitempty"`
	NextClipNorm      float64  `json:"next_clip_norm,omitempty"`
}

func (PrivacySpent) EventType() EventType { return TypePrivacySpent }
func (p PrivacySpent) subject() Subject   { return Subject{Task: p.Task, Round: p.Round} }
func (p PrivacySpent) validate() error {
	var c checks
	c.field("task", p.Task, true)
	c.round(p.Round)
	c.field("mechanism", p.Mechanism, true)
	c.field("accountant", p.Accountant, false)
	c.finite("clip_norm", p.ClipNorm, true)
	c.finite("noise_multiplier", p.NoiseMultiplier, true)
	c.finite("sampling_rate", p.SamplingRate, true)
	c.finite("delta", p.Delta, true)
	c.finite("epsilon", p.Epsilon, true)
	c.finite("cumulative_epsilon", p.CumulativeEpsilon, true)
	c.finite("epsilon_budget", p.EpsilonBudget, true)
	if p.Noise != "" {
		c.oneOf("noise", p.Noise, "tree", "blt")
	}
	c.hex("noise_state_sha256", p.NoiseStateSHA256, false)
	if p.UnclippedFraction != nil || p.NextClipNorm != 0 {
		if p.UnclippedFraction == nil || !(p.NextClipNorm > 0) {
			if c.err == nil {
				c.err = fmt.Errorf("unclipped_fraction and a positive next_clip_norm go together: %w", ErrInvalidEvent)
			}
		} else {
			c.finite("unclipped_fraction", *p.UnclippedFraction, false)
			c.finite("next_clip_norm", p.NextClipNorm, true)
		}
	}
	return c.err
}
func (p PrivacySpent) encode(o *canon.Object) {
	o.String("task", p.Task)
	o.Uint("round", p.Round)
	o.String("mechanism", p.Mechanism)
	o.String("accountant", p.Accountant)
	o.Float("clip_norm", p.ClipNorm)
	o.Float("noise_multiplier", p.NoiseMultiplier)
	o.Float("sampling_rate", p.SamplingRate)
	o.Float("delta", p.Delta)
	o.Float("epsilon", p.Epsilon)
	o.Float("cumulative_epsilon", p.CumulativeEpsilon)
	o.Float("epsilon_budget", p.EpsilonBudget)
	if p.Noise != "" {
		o.String("noise", p.Noise)
	}
	if p.NoiseStateSHA256 != "" {
		o.String("noise_state_sha256", p.NoiseStateSHA256)
	}
	if p.UnclippedFraction != nil {
		o.Float("unclipped_fraction", *p.UnclippedFraction)
		o.Float("next_clip_norm", p.NextClipNorm)
	}
}

// MaxRefusedListed bounds the devices one ParticipationRefused names; the
// rest are counted in More.
const MaxRefusedListed = 1000

// Participation rules (RefusedDevice.Rule).
const (
	RuleMaxRounds     = "max_rounds"
	RuleMinSeparation = "min_separation"
)

// ParticipationRefused records, when a round of a task with differential
// privacy's participation limits closes, the devices that checked in and
// were turned away by them: over the cap of MaxRounds rounds, or before
// MinSeparation training steps had passed since their last (LastStep;
// Step is the step the round's commit would be). An auditor checks each
// against the rule; devices appear as pseudonyms.
type ParticipationRefused struct {
	Task          string          `json:"task"`
	Round         uint64          `json:"round"`
	Step          uint64          `json:"step"`
	MaxRounds     uint64          `json:"max_rounds"`
	MinSeparation uint64          `json:"min_separation"`
	Devices       []RefusedDevice `json:"devices"`
	More          uint64          `json:"more"` // turned away beyond those listed
}

// RefusedDevice is one device a participation rule turned away.
type RefusedDevice struct {
	Device   string `json:"device"` // pseudonym
	Rule     string `json:"rule"`   // RuleMaxRounds or RuleMinSeparation
	LastStep uint64 `json:"last_step"`
}

func (ParticipationRefused) EventType() EventType { return TypeParticipationRefused }
func (p ParticipationRefused) subject() Subject   { return Subject{Task: p.Task, Round: p.Round} }
func (p ParticipationRefused) validate() error {
	var c checks
	c.field("task", p.Task, true)
	c.round(p.Round)
	if len(p.Devices) > MaxRefusedListed && c.err == nil {
		c.err = fmt.Errorf("devices: %d listed, at most %d: %w", len(p.Devices), MaxRefusedListed, ErrInvalidEvent)
	}
	for _, d := range p.Devices {
		c.pseudonym("devices.device", d.Device)
		c.oneOf("devices.rule", d.Rule, RuleMaxRounds, RuleMinSeparation)
	}
	return c.err
}
func (p ParticipationRefused) encode(o *canon.Object) {
	o.String("task", p.Task)
	o.Uint("round", p.Round)
	o.Uint("step", p.Step)
	o.Uint("max_rounds", p.MaxRounds)
	o.Uint("min_separation", p.MinSeparation)
	o.Objects("devices", len(p.Devices), func(i int, in *canon.Object) {
		in.String("device", p.Devices[i].Device)
		in.String("rule", p.Devices[i].Rule)
		in.Uint("last_step", p.Devices[i].LastStep)
	})
	o.Uint("more", p.More)
}

// BudgetRefused records a round not run, or a task stopped, because it
// would exceed the privacy budget.
type BudgetRefused struct {
	Task              string  `json:"task"`
	Round             uint64  `json:"round"` // the round that was refused
	CumulativeEpsilon float64 `json:"cumulative_epsilon"`
	RequestedEpsilon  float64 `json:"requested_epsilon"`
	EpsilonBudget     float64 `json:"epsilon_budget"`
	Delta             float64 `json:"delta"`
	Reason            string  `json:"reason"`
}

func (BudgetRefused) EventType() EventType { return TypeBudgetRefused }
func (p BudgetRefused) subject() Subject   { return Subject{Task: p.Task, Round: p.Round} }
func (p BudgetRefused) validate() error {
	var c checks
	c.field("task", p.Task, true)
	c.round(p.Round)
	c.finite("cumulative_epsilon", p.CumulativeEpsilon, true)
	c.finite("requested_epsilon", p.RequestedEpsilon, true)
	c.finite("epsilon_budget", p.EpsilonBudget, true)
	c.finite("delta", p.Delta, true)
	c.text("reason", p.Reason)
	return c.err
}
func (p BudgetRefused) encode(o *canon.Object) {
	o.String("task", p.Task)
	o.Uint("round", p.Round)
	o.Float("cumulative_epsilon", p.CumulativeEpsilon)
	o.Float("requested_epsilon", p.RequestedEpsilon)
	o.Float("epsilon_budget", p.EpsilonBudget)
	o.Float("delta", p.Delta)
	o.String("reason", p.Reason)
}

// DeviceEnrolled records a device admitted to the fleet, by pseudonym.
type DeviceEnrolled struct {
	Device     string `json:"device"`     // pseudonym from PseudonymizeDevice
	Credential string `json:"credential"` // fingerprint of the device's credential
}

func (DeviceEnrolled) EventType() EventType { return TypeDeviceEnrolled }
func (DeviceEnrolled) subject() Subject     { return Subject{} }
func (p DeviceEnrolled) validate() error {
	var c checks
	c.pseudonym("device", p.Device)
	c.field("credential", p.Credential, false)
	return c.err
}
func (p DeviceEnrolled) encode(o *canon.Object) {
	o.String("device", p.Device)
	o.String("credential", p.Credential)
}

// DeviceRevoked records a device removed from the fleet, by pseudonym.
type DeviceRevoked struct {
	Device string `json:"device"` // pseudonym from PseudonymizeDevice
	Reason string `json:"reason"`
}

func (DeviceRevoked) EventType() EventType { return TypeDeviceRevoked }
func (DeviceRevoked) subject() Subject     { return Subject{} }
func (p DeviceRevoked) validate() error {
	var c checks
	c.pseudonym("device", p.Device)
	c.text("reason", p.Reason)
	return c.err
}
func (p DeviceRevoked) encode(o *canon.Object) {
	o.String("device", p.Device)
	o.String("reason", p.Reason)
}

// Results of an operator action.
const (
	ResultOK     = "ok"
	ResultDenied = "denied" // refused by authorization
	ResultFailed = "failed" // accepted but failed
)

// OperatorAction records a call through the API that changes state: who
// (the event's actor), what (method and resource) and with what result.
type OperatorAction struct {
	Method   string `json:"method"`   // e.g. "fleetlearn.v1.TaskService/StopTask"
	Resource string `json:"resource"` // what it acted on, e.g. "tasks/t-1"
	Result   string `json:"result"`   // ResultOK, ResultDenied or ResultFailed
	Code     string `json:"code"`     // status code name, e.g. "OK", "PERMISSION_DENIED"
	// RequestSHA256 is the SHA-256 of the request message, so a stored
	// request can be matched; "" when not kept.
	RequestSHA256 string `json:"request_sha256"`
	Task          string `json:"task"`   // subject fields, when the action is about one
	Model         string `json:"model"`  // model version
	Module        string `json:"module"` // module SHA-256
}

func (OperatorAction) EventType() EventType { return TypeOperatorAction }
func (p OperatorAction) subject() Subject {
	return Subject{Task: p.Task, Model: p.Model, Module: p.Module}
}
func (p OperatorAction) validate() error {
	var c checks
	c.field("method", p.Method, true)
	c.field("resource", p.Resource, false)
	c.oneOf("result", p.Result, ResultOK, ResultDenied, ResultFailed)
	c.field("code", p.Code, false)
	c.hex("request_sha256", p.RequestSHA256, false)
	c.field("task", p.Task, false)
	c.hex("model", p.Model, false)
	c.hex("module", p.Module, false)
	return c.err
}
func (p OperatorAction) encode(o *canon.Object) {
	o.String("method", p.Method)
	o.String("resource", p.Resource)
	o.String("result", p.Result)
	o.String("code", p.Code)
	o.String("request_sha256", p.RequestSHA256)
	o.String("task", p.Task)
	o.String("model", p.Model)
	o.String("module", p.Module)
}

// States of a pool job.
const (
	JobSubmitted = "submitted"
	JobRunning   = "running"
	JobSucceeded = "succeeded"
	JobFailed    = "failed"
	JobCancelled = "cancelled"
)

// PoolJob records a state change of a job in the compute pool (pretraining,
// evaluation, export) that produces or consumes model versions.
type PoolJob struct {
	Job    string `json:"job"`
	Kind   string `json:"kind"` // e.g. "pretrain", "evaluate"
	State  string `json:"state"`
	Model  string `json:"model"` // version produced or used; "" if none yet
	Detail string `json:"detail"`
	// What the job used so far, over every attempt. Each is left out of
	// the encoding when zero, so entries written before usage was recorded
	// still verify.
	CPUSeconds float64 `json:"cpu_seconds,omitempty"`
	GPUSeconds float64 `json:"gpu_seconds,omitempty"`
	// GPUBusySeconds is the GPUs' measured busy time (utilization ×
	// seconds, machine-wide), where a worker measured it.
	GPUBusySeconds  float64 `json:"gpu_busy_seconds,omitempty"`
	PeakMemoryBytes uint64  `json:"peak_memory_bytes,omitempty"`
	EnergyJoules    float64 `json:"energy_joules,omitempty"`
	// Carbon-aware placement, each left out when empty or zero like the
	// usage above: Carbon is the plan (zone, start, expected gCO2e, the
	// planner's reason) on the submitted event, ForecastSHA256 the digest
	// of the forecast it used, GCO2e the run's emissions on the final
	// event.
	Carbon         string  `json:"carbon,omitempty"`
	ForecastSHA256 string  `json:"forecast_sha256,omitempty"`
	GCO2e          float64 `json:"gco2e,omitempty"`
}

func (PoolJob) EventType() EventType { return TypePoolJob }
func (p PoolJob) subject() Subject   { return Subject{Model: p.Model} }
func (p PoolJob) validate() error {
	var c checks
	c.field("job", p.Job, true)
	c.field("kind", p.Kind, true)
	c.oneOf("state", p.State, JobSubmitted, JobRunning, JobSucceeded, JobFailed, JobCancelled)
	c.hex("model", p.Model, false)
	c.text("detail", p.Detail)
	c.finite("cpu_seconds", p.CPUSeconds, true)
	c.finite("gpu_seconds", p.GPUSeconds, true)
	c.finite("gpu_busy_seconds", p.GPUBusySeconds, true)
	c.finite("energy_joules", p.EnergyJoules, true)
	c.text("carbon", p.Carbon)
	c.hex("forecast_sha256", p.ForecastSHA256, false)
	c.finite("gco2e", p.GCO2e, true)
	return c.err
}
func (p PoolJob) encode(o *canon.Object) {
	o.String("job", p.Job)
	o.String("kind", p.Kind)
	o.String("state", p.State)
	o.String("model", p.Model)
	o.String("detail", p.Detail)
	if p.CPUSeconds != 0 {
		o.Float("cpu_seconds", p.CPUSeconds)
	}
	if p.GPUSeconds != 0 {
		o.Float("gpu_seconds", p.GPUSeconds)
	}
	if p.GPUBusySeconds != 0 {
		o.Float("gpu_busy_seconds", p.GPUBusySeconds)
	}
	if p.PeakMemoryBytes != 0 {
		o.Uint("peak_memory_bytes", p.PeakMemoryBytes)
	}
	if p.EnergyJoules != 0 {
		o.Float("energy_joules", p.EnergyJoules)
	}
	if p.Carbon != "" {
		o.String("carbon", p.Carbon)
	}
	if p.ForecastSHA256 != "" {
		o.String("forecast_sha256", p.ForecastSHA256)
	}
	if p.GCO2e != 0 {
		o.Float("gco2e", p.GCO2e)
	}
}
