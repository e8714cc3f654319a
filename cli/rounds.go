package cli

import (
	"fmt"
	"io"
	"strconv"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// printRounds prints one row per round, its metrics and why it was
// abandoned side by side; FAILURES counts the cohort's devices that said why
// they did not contribute, and withFailures lists those reasons below.
func printRounds(w io.Writer, rounds []*pb.RoundSummary, withFailures bool) error {
	t := newTable(w, "ROUND", "KIND", "STATE", "ASSIGNED", "REPORTED", "DROPPED", "FAILURES", "EPSILON", "METRICS", "REASON")
	failed := 0
	for _, r := range rounds {
		eps := "-"
		if r.GetEpsilonSpent() > 0 {
			eps = strconv.FormatFloat(r.GetEpsilonSpent(), 'g', 4, 64)
		}
		failed += len(r.GetFailures())
		t.row(fmt.Sprint(r.GetRound()), roundKind(r.GetKind()), roundState(r.GetState()),
			fmt.Sprint(r.GetAssigned()), fmt.Sprint(r.GetReported()), fmt.Sprint(r.GetDropped()),
			fmt.Sprint(len(r.GetFailures())), eps, metricsString(r.GetMetrics()), orDash(r.GetReason()))
	}
	if err := t.flush(); err != nil {
		return err
	}
	if !withFailures {
		return nil
	}
	if failed == 0 {
		_, err := fmt.Fprintln(w, "\nno device failures")
		return err
	}
	if _, err := fmt.Fprintln(w); err != nil {
		return err
	}
	ft := newTable(w, "ROUND", "DEVICE", "FAILURE")
	for _, r := range rounds {
		for _, f := range r.GetFailures() {
			ft.row(fmt.Sprint(r.GetRound()), f.GetDeviceId(), orDash(f.GetReason()))
		}
	}
	return ft.flush()
}
