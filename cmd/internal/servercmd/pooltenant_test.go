package servercmd

import (
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/pool"
)

func TestParsePoolTenants(t *testing.T) {
	got, err := parsePoolTenants([]string{"research=2,gpu-seconds=3600,window=24h,quota-gpus=8,quota-cpu=1.5,quota-memory=64GiB", "prod=1"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]pool.Tenant{
		"research": {Weight: 2, Quota: pool.Resources{MilliCPU: 1500, Memory: 64 << 30, GPUs: 8}, Budget: pool.Budget{GPUSeconds: 3600, Window: 24 * time.Hour}},
		"prod":     {Weight: 1},
	}
	if len(got) != len(want) || got["research"] != want["research"] || got["prod"] != want["prod"] {
		t.Fatalf("got %+v", got)
	}
	if got, err := parsePoolTenants(nil); got != nil || err != nil {
		t.Fatalf("no flags: %v %v", got, err)
	}
	for _, bad := range []string{"a", "=1", "a=0", "a=x", "a=1,cpu-seconds=5", "a=1,window=1h", "a=1,foo=2",
		"a=1,quota-gpus=-1", "a=1,quota-memory=1XB", "a=1,cpu-seconds=1,cpu-seconds=2,window=1h"} {
		if _, err := parsePoolTenants([]string{bad}); err == nil || !isUsage(err) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if _, err := parsePoolTenants([]string{"a=1", "a=2"}); err == nil {
		t.Error("duplicate tenant accepted")
	}
}
