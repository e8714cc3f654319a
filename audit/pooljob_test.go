package audit

import (
	"errors"
	"math"
	"testing"
)

// Usage fields are left out when zero, so a pool job entry written before
// they existed encodes, and so verifies, exactly as it did.
func TestPoolJobUsageEncoding(t *testing.T) {
	old := PoolJob{Job: "pool-job-7", Kind: "pretrain", State: JobSucceeded, Model: hexA, Detail: "42 epochs"}
	ev, err := NewEvent(Operator("a"), old)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"job":"pool-job-7","kind":"pretrain","state":"succeeded","model":"` + hexA + `","detail":"42 epochs"}`
	if string(ev.Payload) != want {
		t.Fatalf("payload without usage:\n%s\nwant\n%s", ev.Payload, want)
	}
	withUsage := old
	withUsage.CPUSeconds, withUsage.GPUSeconds, withUsage.PeakMemoryBytes, withUsage.EnergyJoules = 12.5, 3, 1<<30, 0
	ev, err = NewEvent(Operator("a"), withUsage)
	if err != nil {
		t.Fatal(err)
	}
	want = `{"job":"pool-job-7","kind":"pretrain","state":"succeeded","model":"` + hexA +
		`","detail":"42 epochs","cpu_seconds":12.5,"gpu_seconds":3,"peak_memory_bytes":1073741824}`
	if string(ev.Payload) != want {
		t.Fatalf("payload with usage:\n%s\nwant\n%s", ev.Payload, want)
	}
	back, err := ev.DecodePayload()
	if err != nil {
		t.Fatal(err)
	}
	if back != withUsage {
		t.Fatalf("decoded %+v, want %+v", back, withUsage)
	}
	withCarbon := withUsage
	withCarbon.Carbon, withCarbon.ForecastSHA256, withCarbon.GCO2e = "zone=westus start=2026-05-03T11:15:00Z", hexA, 2347.5
	ev, err = NewEvent(Operator("a"), withCarbon)
	if err != nil {
		t.Fatal(err)
	}
	want = want[:len(want)-1] + `,"carbon":"zone=westus start=2026-05-03T11:15:00Z","forecast_sha256":"` + hexA + `","gco2e":2347.5}`
	if string(ev.Payload) != want {
		t.Fatalf("payload with carbon:\n%s\nwant\n%s", ev.Payload, want)
	}
	if back, err := ev.DecodePayload(); err != nil || back != withCarbon {
		t.Fatalf("decoded %+v, %v; want %+v", back, err, withCarbon)
	}
}

func TestPoolJobUsageValidation(t *testing.T) {
	base := PoolJob{Job: "j", Kind: "pretrain", State: JobRunning}
	for _, mod := range []func(*PoolJob){
		func(p *PoolJob) { p.CPUSeconds = -1 },
		func(p *PoolJob) { p.GPUSeconds = math.NaN() },
		func(p *PoolJob) { p.EnergyJoules = math.Inf(1) },
		func(p *PoolJob) { p.GCO2e = -1 },
		func(p *PoolJob) { p.ForecastSHA256 = "not hex" },
	} {
		p := base
		mod(&p)
		if _, err := NewEvent(Operator("a"), p); !errors.Is(err, ErrInvalidEvent) {
			t.Errorf("%+v: %v", p, err)
		}
	}
}
