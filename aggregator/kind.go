package aggregator

import (
	"fmt"
	"strings"
)

// Kind names an aggregation rule. Its values equal those of the wire enum
// fleetlearn.v1.AggregationRule, so Kind(cfg.GetRule()) converts a task's
// configuration.
type Kind int32

// The rules. KindUnspecified is the zero value and is refused by NewRule.
const (
	KindUnspecified Kind = 0
	FedAvg          Kind = 1 // example-weighted mean (McMahan et al. 2017)
	FedAvgM         Kind = 2 // FedAvg with server momentum (Hsu et al. 2019)
	FedAdam         Kind = 3 // server Adam (Reddi et al. 2021)
	FedYogi         Kind = 4 // server Yogi (Reddi et al. 2021)
	FedAdagrad      Kind = 5 // server Adagrad (Reddi et al. 2021)
	Median          Kind = 6 // coordinate-wise median (Yin et al. 2018)
	TrimmedMean     Kind = 7 // coordinate-wise trimmed mean (Yin et al. 2018)
)

var kindNames = [...]string{
	KindUnspecified: "UNSPECIFIED",
	FedAvg:          "FEDAVG",
	FedAvgM:         "FEDAVGM",
	FedAdam:         "FEDADAM",
	FedYogi:         "FEDYOGI",
	FedAdagrad:      "FEDADAGRAD",
	Median:          "MEDIAN",
	TrimmedMean:     "TRIMMED_MEAN",
}

// String returns the wire enum name without its AGGREGATION_RULE_ prefix.
func (k Kind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int32(k))
}

// ParseKind is the inverse of String. It ignores case and accepts the wire
// enum's AGGREGATION_RULE_ prefix.
func ParseKind(s string) (Kind, error) {
	name := strings.TrimPrefix(strings.ToUpper(s), "AGGREGATION_RULE_")
	for k := FedAvg; int(k) < len(kindNames); k++ {
		if kindNames[k] == name {
			return k, nil
		}
	}
	return KindUnspecified, fmt.Errorf("aggregator: parse kind %q: %w", s, ErrConfig)
}

// Streaming reports whether the rule aggregates in O(dim) memory, whatever
// the number of reports, and accepts pre-summed updates (Collector.AddSum),
// as secure aggregation requires: true for the FedAvg family, false for
// Median and TrimmedMean, which need every update.
func (k Kind) Streaming() bool {
	switch k {
	case FedAvg, FedAvgM, FedAdam, FedYogi, FedAdagrad:
		return true
	}
	return false
}

func (k Kind) valid() bool { return k >= FedAvg && k <= TrimmedMean }

func (k Kind) adaptive() bool { return k == FedAdam || k == FedYogi || k == FedAdagrad }

// StateVectors is the number of dim-long float32 vectors of optimizer
// state the rule keeps between rounds (0 for FedAvg and the robust rules).
func (k Kind) StateVectors() int { return k.vectors() }

// vectors is the number of dim-long optimizer state vectors the rule keeps.
func (k Kind) vectors() int {
	switch {
	case k == FedAvgM:
		return 1 // momentum
	case k.adaptive():
		return 2 // first and second moments
	}
	return 0
}

// MaxSampleBytes bounds what a rule that keeps every update (Median,
// TrimmedMean) may hold for one round: 4 bytes per parameter per report.
// The FedAvg family holds one float64 sum whatever the cohort.
const MaxSampleBytes = 2 << 30

// CheckSamples refuses a rule of kind that would keep more than
// MaxSampleBytes for reports updates of dim parameters.
func CheckSamples(kind Kind, dim, reports int) error {
	if kind.Streaming() || dim <= 0 || reports <= 0 {
		return nil
	}
	if need := 4 * int64(dim) * int64(reports); need > MaxSampleBytes {
		return fmt.Errorf("aggregator: %v keeps every update: %d reports of %d parameters need %d bytes, at most %d; "+
			"use a FedAvg-family rule (its sum does not grow with the cohort), a smaller cohort or fewer trained parameters: %w",
			kind, reports, dim, need, int64(MaxSampleBytes), ErrConfig)
	}
	return nil
}
