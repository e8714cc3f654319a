package poolsvc

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/pool"
	"github.com/fleetlearn/fleetlearn/pool/carbon"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// checkCarbon bounds a job's carbon request. Without a deadline any start
// the forecast covers would do, and a job could wait for days to save a
// gram; the deadline is the user's statement of how long waiting may take.
func checkCarbon(in *pb.PoolJobSpec) error {
	c := in.GetCarbon()
	if c == nil {
		return nil
	}
	if in.GetDeadline() == nil {
		return invalidf("spec.carbon: carbon-aware placement needs spec.deadline, the time the job must have ended by")
	}
	d := c.GetExpectedDuration()
	if d == nil || d.CheckValid() != nil || d.AsDuration() <= 0 || d.AsDuration() > carbon.MaxJobDuration {
		return invalidf("spec.carbon.expected_duration: want how long the job runs, in (0, %s]", carbon.MaxJobDuration)
	}
	if w := c.GetExpectedPowerWatts(); math.IsNaN(w) || w <= 0 || w > carbon.MaxPower {
		return invalidf("spec.carbon.expected_power_watts %v: want the job's average draw in watts, in (0, %g]", w, float64(carbon.MaxPower))
	}
	return nil
}

// carbonPlan is a submission's placement decision and the forecast it
// used.
type carbonPlan struct {
	choice   carbon.Choice
	forecast carbon.Forecast // of the chosen zone
}

// readForecasts reads the forecast for a carbon job's submission, off the
// loop: a file of up to 16 MiB must not stall heartbeats.
func (s *Service) readForecasts(ctx context.Context) ([]carbon.Forecast, error) {
	if s.d.Carbon == nil {
		return nil, errorf(codes.FailedPrecondition, "submit job: spec.carbon: this server has no carbon forecast (start it with --carbon-forecast FILE), so it cannot plan; submit without spec.carbon")
	}
	fs, _, err := s.d.Carbon.Forecasts(ctx)
	if err != nil {
		s.log.Error("reading the carbon forecast", "err", err)
		return nil, errorf(codes.Unavailable, "submit job: spec.carbon: the server's carbon forecast could not be read: %v", err)
	}
	return fs, nil
}

// planCarbon chooses the zone and start of a carbon job among the zones of
// the registered workers. It refuses rather than queue without the
// constraint when no worker is in a forecast zone: the client asked for
// carbon-aware placement, and a job run anywhere would carry no decision
// for the audit log to show. The loop calls it.
func (s *Service) planCarbon(in *pb.PoolJobSpec, sp pool.Spec, fs []carbon.Forecast, now time.Time) (carbonPlan, error) {
	var zones, workerZones []string
	for _, w := range s.workers {
		z := w.rec.GetZone()
		if w.lost || z == "" || slices.Contains(workerZones, z) {
			continue
		}
		workerZones = append(workerZones, z)
		if _, ok := carbon.Lookup(fs, z); ok {
			zones = append(zones, z)
		}
	}
	slices.Sort(zones)
	if len(zones) == 0 {
		slices.Sort(workerZones)
		fz := make([]string, 0, len(fs))
		for _, f := range fs {
			fz = append(fz, f.Zone)
		}
		slices.Sort(fz)
		return carbonPlan{}, errorf(codes.FailedPrecondition,
			"submit job: spec.carbon: no registered worker is in a zone the forecast covers (workers' zones %q, forecast zones %q); start workers with --zone ZONE or submit without spec.carbon",
			workerZones, clipList(fz, 16))
	}
	c := in.GetCarbon()
	ch, err := carbon.Plan(carbon.Request{Earliest: now, Deadline: sp.Deadline, Duration: c.GetExpectedDuration().AsDuration(),
		Power: c.GetExpectedPowerWatts(), Zones: zones}, fs)
	switch {
	case errors.Is(err, carbon.ErrInfeasible):
		return carbonPlan{}, invalidf("submit job: spec.carbon: %v; move spec.deadline later or shorten expected_duration", err)
	case errors.Is(err, carbon.ErrNoCoverage):
		return carbonPlan{}, errorf(codes.FailedPrecondition, "submit job: spec.carbon: %v", err)
	case err != nil:
		return carbonPlan{}, invalidf("submit job: spec.carbon: %v", err)
	}
	f, _ := carbon.Lookup(fs, ch.Zone)
	return carbonPlan{choice: ch, forecast: f}, nil
}

func clipList(v []string, n int) []string {
	if len(v) > n {
		return append(slices.Clip(v[:n]), "…")
	}
	return v
}

// applyCarbon puts a job's planned zone and start into the scheduler's
// spec, from the record (at submission and when restored).
func applyCarbon(sp *pool.Spec, rec *pb.PoolJob) {
	if rec.GetCarbonZone() == "" {
		return
	}
	sp.Zone = rec.GetCarbonZone()
	if rec.GetCarbonStart() != nil {
		sp.NotBefore = rec.GetCarbonStart().AsTime()
	}
}

func recordPlan(rec *pb.PoolJob, ch carbon.Choice) {
	rec.CarbonZone, rec.CarbonStart = ch.Zone, timestamppb.New(ch.Start)
	rec.ExpectedGco2E, rec.ForecastSha256 = ch.Expected, ch.Digest
}

// carbonDetail is the plan as the submitted audit event carries it.
func carbonDetail(ch carbon.Choice) string {
	return clip(fmt.Sprintf("zone=%s start=%s expected_gco2e=%s; %s", ch.Zone, ch.Start.UTC().Format(time.RFC3339),
		strconv.FormatFloat(ch.Expected, 'g', -1, 64), ch.Reason), 1024)
}

// settleCarbon prices an ended carbon job's run once: its metered energy
// when the worker measured any, else expected power × the time from its
// first placement to its end, at its zone's intensity over that time.
// The forecast is read again, so a file updated with actuals prices the
// run by them; if that fails, the forecast of the submission is used.
func (s *Service) settleCarbon(rt *jobRT) {
	rec := rt.rec
	if rec.GetCarbonZone() == "" || rec.GetGco2E() != 0 || rt.firstStart.IsZero() || rec.GetEndTime() == nil {
		return
	}
	start, end := rt.firstStart, rec.GetEndTime().AsTime()
	if !end.After(start) {
		return
	}
	energy := rec.GetUsage().GetEnergyJoules()
	if energy <= 0 {
		energy = rec.GetSpec().GetCarbon().GetExpectedPowerWatts() * end.Sub(start).Seconds()
	}
	var fs []carbon.Forecast
	if s.d.Carbon != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		fs, _, _ = s.d.Carbon.Forecasts(ctx)
		cancel()
	}
	f, ok := carbon.Lookup(fs, rec.GetCarbonZone())
	if !ok {
		f, ok = rt.forecast, rt.forecast.Zone != ""
	}
	if !ok {
		s.log.Warn("no forecast to price a carbon job's run", "job", rt.id(), "zone", rec.GetCarbonZone())
		return
	}
	g, err := carbon.RunEmissions(f, start, end, energy)
	if err != nil {
		s.log.Warn("pricing a carbon job's run", "job", rt.id(), "err", err)
		return
	}
	rec.Gco2E = g
}
