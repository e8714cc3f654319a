package sandboxlimits_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/internal/sandboxlimits"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/wasm"
)

func TestFromProto(t *testing.T) {
	for _, c := range []struct {
		name    string
		in      *pb.Limits
		want    wasm.Limits
		mention string // empty: valid
	}{
		{name: "nil takes every default", in: nil},
		{name: "zero takes every default", in: &pb.Limits{}},
		{name: "all set", in: &pb.Limits{MemoryPages: 4096, Timeout: durationpb.New(90 * time.Second), MaxFlops: 1e9, MaxTensorBytes: 1 << 20},
			want: wasm.Limits{MemoryPages: 4096, Timeout: 90 * time.Second, MaxWork: 1e9, MaxTensorBytes: 1 << 20}},
		{name: "wasm32 maximum", in: &pb.Limits{MemoryPages: wasm.MaxMemoryPages}, want: wasm.Limits{MemoryPages: wasm.MaxMemoryPages}},
		{name: "one page past wasm32", in: &pb.Limits{MemoryPages: wasm.MaxMemoryPages + 1}, mention: "memory pages 65537 above the wasm32 maximum 65536"},
		{name: "uint32 maximum pages", in: &pb.Limits{MemoryPages: math.MaxUint32}, mention: "memory pages"},
		{name: "longest timeout", in: &pb.Limits{Timeout: durationpb.New(wasm.MaxTimeout)}, want: wasm.Limits{Timeout: wasm.MaxTimeout}},
		{name: "timeout past the maximum", in: &pb.Limits{Timeout: durationpb.New(wasm.MaxTimeout + time.Nanosecond)}, mention: "timeout 24h0m0.000000001s not in [0, 24h0m0s]"},
		{name: "negative timeout", in: &pb.Limits{Timeout: durationpb.New(-time.Second)}, mention: "timeout -1s"},
		// Beyond time.Duration: AsDuration saturates, which must still be refused.
		{name: "timeout of ten thousand years", in: &pb.Limits{Timeout: &durationpb.Duration{Seconds: 315576000000}}, mention: "timeout"},
		{name: "malformed timeout", in: &pb.Limits{Timeout: &durationpb.Duration{Seconds: 1, Nanos: -5}}, mention: "timeout"},
		{name: "int64 maximum flops", in: &pb.Limits{MaxFlops: math.MaxInt64, MaxTensorBytes: math.MaxInt64},
			want: wasm.Limits{MaxWork: math.MaxInt64, MaxTensorBytes: math.MaxInt64}},
		{name: "flops past int64", in: &pb.Limits{MaxFlops: math.MaxInt64 + 1}, mention: "max_flops 9223372036854775808 above 9223372036854775807"},
		{name: "tensor bytes past int64", in: &pb.Limits{MaxTensorBytes: math.MaxUint64}, mention: "max_tensor_bytes 18446744073709551615"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := sandboxlimits.FromProto(c.in)
			if c.mention == "" {
				if err != nil || got != c.want {
					t.Fatalf("FromProto = %+v, %v; want %+v", got, err, c.want)
				}
				if err := got.Validate(); err != nil {
					t.Fatalf("converted limits do not validate: %v", err)
				}
				return
			}
			if !errors.Is(err, wasm.ErrLimits) || !strings.Contains(err.Error(), c.mention) {
				t.Fatalf("FromProto error %v, want wasm.ErrLimits mentioning %q", err, c.mention)
			}
			if got != (wasm.Limits{}) {
				t.Errorf("FromProto returned %+v with its error", got)
			}
		})
	}
}

func TestValidateNegative(t *testing.T) {
	// Not reachable from protobuf (unsigned fields), but a sandbox's own options can be.
	for _, l := range []wasm.Limits{{MaxWork: -1}, {MaxTensorBytes: -1}, {Timeout: -time.Nanosecond}} {
		if err := l.Validate(); !errors.Is(err, wasm.ErrLimits) {
			t.Errorf("%+v: Validate = %v, want wasm.ErrLimits", l, err)
		}
	}
	err := wasm.Limits{MemoryPages: 1 << 20, MaxWork: -1}.Validate()
	if err == nil || !strings.Contains(err.Error(), "memory pages") || !strings.Contains(err.Error(), "max work") {
		t.Errorf("Validate with two bad fields = %v, want both named", err)
	}
}
