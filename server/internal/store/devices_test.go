package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/identity"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
	"github.com/fleetlearn/fleetlearn/server/internal/store"
)

func TestEnrolledDevices(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, path := open(t)
		a := &store.DeviceRow{ID: "d-a", KeyID: "UA", Fleet: "f", Group: "g", TokenID: "j1", Enrolled: now,
			Attrs: &pb.DeviceAttributes{DeviceClass: "gateway"}}
		if err := s.InsertDevice(ctx, a); err != nil {
			t.Fatal(err)
		}
		for name, r := range map[string]*store.DeviceRow{
			"same key": {ID: "d-b", KeyID: "UA", Fleet: "f", TokenID: "j2", Enrolled: now},
			"same id":  {ID: "d-a", KeyID: "UB", Fleet: "f", TokenID: "j2", Enrolled: now},
		} {
			if err := s.InsertDevice(ctx, r); !errors.Is(err, backend.ErrExists) {
				t.Errorf("%s: %v", name, err)
			}
		}
		if err := s.InsertDevice(ctx, &store.DeviceRow{ID: "d-b", KeyID: "UB", Fleet: "f", TokenID: "j2", Enrolled: now}); err != nil {
			t.Fatal(err)
		}
		got, err := s.DeviceByKey(ctx, "UA")
		if err != nil || got.ID != "d-a" || got.Group != "g" || got.Attrs.GetDeviceClass() != "gateway" || !got.Enrolled.Equal(now) {
			t.Fatalf("DeviceByKey = %+v, %v", got, err)
		}
		if _, err := s.Device(ctx, "nope"); !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("unknown device: %v", err)
		}

		later := now.Add(time.Hour)
		r, err := s.RevokeDevice(ctx, "d-a", "lost", later)
		if err != nil || !r.Revoked.Equal(later) || r.Reason != "lost" {
			t.Fatalf("revoke = %+v, %v", r, err)
		}
		if _, err := s.RevokeDevice(ctx, "d-a", "again", later.Add(time.Hour)); !errors.Is(err, backend.ErrPrecondition) {
			t.Errorf("revoke twice: %v", err)
		}
		if _, err := s.RevokeDevice(ctx, "nope", "x", later); !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("revoke unknown: %v", err)
		}
		revs, err := s.Revocations(ctx)
		if err != nil || len(revs) != 1 || revs[0] != (identity.Revocation{UserKey: "UA", At: later}) {
			t.Fatalf("revocations = %v, %v", revs, err)
		}

		active, last, err := s.Devices(ctx, false, 0, 10)
		if err != nil || len(active) != 1 || active[0].ID != "d-b" {
			t.Fatalf("active = %v, %v", active, err)
		}
		page, last, err := s.Devices(ctx, true, 0, 1)
		if err != nil || len(page) != 1 || page[0].ID != "d-a" {
			t.Fatalf("page 1 = %v, %v", page, err)
		}
		if page, _, err = s.Devices(ctx, true, last, 1); err != nil || len(page) != 1 || page[0].ID != "d-b" {
			t.Fatalf("page 2 = %v, %v", page, err)
		}

		// The registry outlives a reopen.
		s.Close()
		s2, err := store.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		if revs, err := s2.Revocations(ctx); err != nil || len(revs) != 1 {
			t.Fatalf("revocations after reopen = %v, %v", revs, err)
		}
	})
}

func TestUsedTokens(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		s, path := open(t)
		clock := now
		u := s.UsedTokens(func() time.Time { return clock }, time.Minute)
		if err := u.Claim(ctx, "j1", now.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if err := u.Claim(ctx, "j1", now.Add(time.Hour)); !errors.Is(err, identity.ErrTokenReused) {
			t.Fatalf("second claim: %v", err)
		}
		if err := u.Claim(ctx, "j2", now.Add(2*time.Hour)); err != nil {
			t.Fatal(err)
		}
		// Past j1's expiry plus leeway its record goes; j2's stays.
		clock = now.Add(time.Hour + 2*time.Minute)
		if err := u.Claim(ctx, "j3", clock.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if n, err := u.Len(ctx); err != nil || n != 2 {
			t.Fatalf("%d records after pruning, want 2: %v", n, err)
		}
		s.Close()
		s2, err := store.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		if err := s2.UsedTokens(func() time.Time { return clock }, time.Minute).Claim(ctx, "j2", now.Add(2*time.Hour)); !errors.Is(err, identity.ErrTokenReused) {
			t.Fatalf("claim after reopen: %v", err)
		}
	})
}
