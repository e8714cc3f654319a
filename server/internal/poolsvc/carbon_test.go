package poolsvc

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/pool/carbon"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// writeForecast writes hourly Carbon Aware SDK forecasts from t0, one
// intensity per hour per zone.
func writeForecast(t *testing.T, zones map[string][]float64) string {
	t.Helper()
	type point struct {
		Location  string  `json:"location"`
		Timestamp string  `json:"timestamp"`
		Duration  int     `json:"duration"`
		Value     float64 `json:"value"`
	}
	type forecast struct {
		Location     string  `json:"location"`
		ForecastData []point `json:"forecastData"`
	}
	var out []forecast
	for z, vals := range zones {
		f := forecast{Location: z}
		for i, v := range vals {
			f.ForecastData = append(f.ForecastData, point{z, t0.Add(time.Duration(i) * time.Hour).Format(time.RFC3339), 60, v})
		}
		out = append(out, f)
	}
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "forecast.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *env) registerIn(subject, zone string, capacity *pb.PoolResources) *worker {
	e.t.Helper()
	// The token must outlive the hours the test advances the clock, and a
	// worker is bound to the token it registered with.
	tok, _, err := e.issuer.Mint(subject, []identity.Role{identity.RolePoolWorker}, 24*time.Hour)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hangFor)
	e.t.Cleanup(cancel)
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	w := &worker{e: e, ctx: ctx, c: e.workerClient()}
	res, err := w.c.RegisterWorker(w.ctx, &pb.RegisterWorkerRequest{Name: subject, Capacity: capacity, Zone: zone})
	if err != nil {
		e.t.Fatal(err)
	}
	w.id = res.GetWorkerId()
	return w
}

func carbonSpec(id string, deadline time.Time) *pb.PoolJobSpec {
	sp := spec(id, 1)
	sp.TotalSteps = 20
	sp.Deadline = timestamppb.New(deadline)
	sp.Carbon = &pb.PoolCarbon{ExpectedDuration: durationpb.New(2 * time.Hour), ExpectedPowerWatts: 300}
	return sp
}

// A carbon job with a deadline waits for the planned window and runs on a
// worker of the cheaper zone; the plan is carbon.Plan's on the same input,
// recorded in the job and the audit log, and the run is priced at its end.
func TestCarbonJobRunsInPlannedWindowAndZone(t *testing.T) {
	path := writeForecast(t, map[string][]float64{
		"eastus": {400, 400, 400, 400, 400, 400},
		"westus": {500, 500, 100, 100, 500, 500},
	})
	e := newEnv(t, func(d *Deps) {
		d.Carbon = carbon.FileSource{Path: path}
		// Long enough that hours on the fake clock lose no worker.
		d.HeartbeatInterval, d.HeartbeatsToLoss = time.Hour, 10
	})
	c, ctx := e.ops()
	deadline := t0.Add(6 * time.Hour)

	_, err := c.SubmitJob(ctx, &pb.SubmitJobRequest{Spec: carbonSpec("early", deadline)})
	wantCode(t, "carbon job with no worker in a forecast zone", err, codes.FailedPrecondition)
	noDeadline := carbonSpec("nodl", deadline)
	noDeadline.Deadline = nil
	_, err = c.SubmitJob(ctx, &pb.SubmitJobRequest{Spec: noDeadline})
	wantCode(t, "carbon job without a deadline", err, codes.InvalidArgument)
	badPower := carbonSpec("watts", deadline)
	badPower.Carbon.ExpectedPowerWatts = -3
	_, err = c.SubmitJob(ctx, &pb.SubmitJobRequest{Spec: badPower})
	wantCode(t, "carbon job with negative power", err, codes.InvalidArgument)

	east := e.registerIn("host-east", "eastus", oneRank)
	west := e.registerIn("host-west", "westus", oneRank)
	job := e.submit(carbonSpec("green", deadline), nil)

	fs, _, err := carbon.FileSource{Path: path}.Forecasts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want, err := carbon.Plan(carbon.Request{Earliest: t0, Deadline: deadline, Duration: 2 * time.Hour, Power: 300,
		Zones: []string{"eastus", "westus"}}, fs)
	if err != nil {
		t.Fatal(err)
	}
	if want.Zone != "westus" || !want.Start.Equal(t0.Add(2*time.Hour)) {
		t.Fatalf("plan %+v: the test's forecast should favour westus at +2h", want)
	}
	if job.GetCarbonZone() != want.Zone || !job.GetCarbonStart().AsTime().Equal(want.Start) ||
		job.GetForecastSha256() != want.Digest || job.GetExpectedGco2E() != want.Expected {
		t.Fatalf("job's plan %s %v %s %v, want %+v", job.GetCarbonZone(), job.GetCarbonStart().AsTime(),
			job.GetForecastSha256(), job.GetExpectedGco2E(), want)
	}
	var sub *struct{ carbon, digest string }
	for _, ev := range e.poolEvents() {
		if ev.Job == "green" && ev.State == "submitted" {
			sub = &struct{ carbon, digest string }{ev.Carbon, ev.ForecastSHA256}
		}
	}
	if sub == nil || sub.digest != want.Digest ||
		!strings.HasPrefix(sub.carbon, "zone=westus start="+want.Start.Format(time.RFC3339)+" expected_gco2e=") ||
		!strings.Contains(sub.carbon, want.Reason) {
		t.Fatalf("submitted event carbon %+v, want zone, start, digest and %q", sub, want.Reason)
	}

	j := e.job("green")
	if j.GetState() != queued || !strings.HasPrefix(j.GetStateReason(),
		"waiting for the low-carbon window at "+want.Start.Format(time.RFC3339)+" in zone westus (2h0m0s from now)") {
		t.Fatalf("before the window: %s %q", j.GetState(), j.GetStateReason())
	}
	e.clk.Advance(2*time.Hour - time.Second)
	if j := e.job("green"); j.GetState() != queued {
		t.Fatalf("placed a second early: %v", j)
	}
	e.clk.Advance(time.Second)
	j = e.waitJob("green", func(j *pb.PoolJob) bool { return j.GetState() != queued })
	if j.GetState() != running || len(j.GetPlacement()) != 1 || j.GetPlacement()[0].GetWorker() != west.id {
		t.Fatalf("at the window: %v, want running on %s", j, west.id)
	}
	r, err := west.heartbeat()
	if err != nil || len(r.GetStart()) != 1 {
		t.Fatalf("west worker: %v %v", r, err)
	}
	l := r.GetStart()[0]
	if ch := east.poll(); len(ch) != 0 {
		t.Fatalf("east worker answered at once: %v", (<-ch).res)
	}

	e.clk.Advance(2 * time.Hour)
	if _, err := west.commit(ref(west, l), "green", 10, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := west.commit(ref(west, l), "green", 20, 2); err != nil {
		t.Fatal(err)
	}
	const energy = 2.16e6 // 0.6 kWh
	if _, err := west.c.RankExited(west.ctx, &pb.RankExitedRequest{WorkerId: west.id, JobId: "green", Attempt: 1, Completed: true,
		Usage: &pb.PoolUsage{CpuSeconds: 5, EnergyJoules: energy}}); err != nil {
		t.Fatal(err)
	}
	j = e.waitJob("green", func(j *pb.PoolJob) bool { return j.GetState() == succeeded })
	wf, _ := carbon.Lookup(fs, "westus")
	g, err := carbon.RunEmissions(wf, t0.Add(2*time.Hour), t0.Add(4*time.Hour), energy)
	if err != nil {
		t.Fatal(err)
	}
	if j.GetGco2E() != g || g != 60 {
		t.Fatalf("job gCO2e %v, want %v (0.6 kWh at 100 g/kWh = 60)", j.GetGco2E(), g)
	}
	var final float64
	for _, ev := range e.poolEvents() {
		if ev.Job == "green" && ev.State == "succeeded" {
			final = ev.GCO2e
		}
	}
	if final != g {
		t.Fatalf("succeeded event gco2e %v, want %v", final, g)
	}
}

// Without metered energy a run is priced at its expected power over its
// run time; a server without a forecast refuses carbon jobs.
func TestCarbonJobWithoutMeterAndWithoutForecast(t *testing.T) {
	path := writeForecast(t, map[string][]float64{"westus": {200, 200, 200, 200}})
	e := newEnv(t, func(d *Deps) {
		d.Carbon = carbon.FileSource{Path: path}
		d.HeartbeatInterval, d.HeartbeatsToLoss = time.Hour, 10
	})
	e.registerIn("host-west", "westus", oneRank)
	e.submit(carbonSpec("now", t0.Add(3*time.Hour)), nil)
	if j := e.waitJob("now", func(j *pb.PoolJob) bool { return j.GetState() == running }); !j.GetCarbonStart().AsTime().Equal(t0) {
		t.Fatalf("flat forecast: start %v, want now", j.GetCarbonStart().AsTime())
	}
	e.clk.Advance(90 * time.Minute)
	c, ctx := e.ops()
	if _, err := c.CancelJob(ctx, &pb.CancelJobRequest{JobId: "now"}); err != nil {
		t.Fatal(err)
	}
	// 300 W for 1.5 h is 0.45 kWh; at 200 g/kWh, 90 g.
	j := e.job("now")
	if j.GetGco2E() < 90-1e-9 || j.GetGco2E() > 90+1e-9 {
		t.Fatalf("cancelled job gCO2e %v, want 90", j.GetGco2E())
	}

	bare := newEnv(t, nil)
	bare.registerIn("host-west", "westus", oneRank)
	bc, bctx := bare.ops()
	_, err := bc.SubmitJob(bctx, &pb.SubmitJobRequest{Spec: carbonSpec("x", t0.Add(3*time.Hour))})
	wantCode(t, "carbon job on a server without a forecast", err, codes.FailedPrecondition)
	_, err = bare.registerInErr("bad", "west us")
	wantCode(t, "worker zone with a space", err, codes.InvalidArgument)
}

func (e *env) workerClient() apiv1.PoolWorkerServiceClient {
	return apiv1.NewPoolWorkerServiceClient(e.conn)
}

func (e *env) registerInErr(subject, zone string) (*pb.RegisterWorkerResponse, error) {
	return e.workerClient().RegisterWorker(e.as(subject, identity.RolePoolWorker),
		&pb.RegisterWorkerRequest{Name: subject, Capacity: oneRank, Zone: zone})
}
