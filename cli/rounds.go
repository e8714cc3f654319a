package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// maxMetricColumns is how many metrics get a column of their own; past it
// the metrics share one METRICS column as name=value pairs, so the table
// stays readable.
const maxMetricColumns = 6

// roundPageSize asks for the server's largest page of rounds.
const roundPageSize = 1000

// listRounds fetches all of a task's rounds.
func listRounds(ctx context.Context, c apiv1.TaskServiceClient, id string) ([]*pb.RoundSummary, error) {
	return listAll(ctx, func(ctx context.Context, token string) ([]*pb.RoundSummary, string, error) {
		res, err := c.ListRounds(ctx, &pb.ListRoundsRequest{TaskId: id, PageSize: roundPageSize, PageToken: token})
		return res.GetRounds(), res.GetNextPageToken(), err
	})
}

// sortRounds orders rounds newest first, as task rounds prints them,
// whatever order the server sent.
func sortRounds(rounds []*pb.RoundSummary) {
	slices.SortStableFunc(rounds, func(a, b *pb.RoundSummary) int { return cmp.Compare(b.GetRound(), a.GetRound()) })
}

// printRounds prints one row per round, with its metrics and why it was
// abandoned side by side; FAILURES counts the cohort's devices that said why
// they did not contribute, and withFailures lists those reasons below.
//
// Each metric the rounds carry has a column, named as the server names it:
// train_* are the devices' training metrics, eval_* an evaluation round's,
// server_* the server's evaluation of the model a round committed.
func printRounds(w io.Writer, rounds []*pb.RoundSummary, withFailures bool) error {
	names := map[string]bool{}
	for _, r := range rounds {
		for k := range r.GetMetrics().GetValues() {
			names[k] = true
		}
	}
	metrics := slices.Sorted(maps.Keys(names))
	compact := len(metrics) > maxMetricColumns
	header := []string{"ROUND", "KIND", "STATE", "ASSIGNED", "REPORTED", "DROPPED", "FAILURES", "EPSILON"}
	switch {
	case compact || len(metrics) == 0:
		header = append(header, "METRICS")
	default:
		for _, m := range metrics {
			header = append(header, strings.ToUpper(m))
		}
	}
	header = append(header, "MODEL", "REASON")
	t := newTable(w, header...)
	failed := 0
	for _, r := range rounds {
		eps := "-"
		if r.GetEpsilonSpent() > 0 {
			eps = strconv.FormatFloat(r.GetEpsilonSpent(), 'g', 4, 64)
		}
		failed += len(r.GetFailures())
		row := []string{fmt.Sprint(r.GetRound()), roundKind(r.GetKind()), roundState(r.GetState()),
			fmt.Sprint(r.GetAssigned()), fmt.Sprint(r.GetReported()), fmt.Sprint(r.GetDropped()),
			fmt.Sprint(len(r.GetFailures())), eps}
		switch vals := r.GetMetrics().GetValues(); {
		case compact || len(metrics) == 0:
			row = append(row, metricsString(r.GetMetrics()))
		default:
			for _, m := range metrics {
				if v, ok := vals[m]; ok {
					row = append(row, formatFloat(v))
				} else {
					row = append(row, "-")
				}
			}
		}
		row = append(row, orDash(shortSHA(r.GetModel().GetVersion())), orDash(r.GetReason()))
		t.row(row...)
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
