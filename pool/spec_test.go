package pool

import (
	"errors"
	"strings"
	"testing"
	"time"
)

var epoch = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

func goodSpec(id string) Spec {
	return Spec{
		ID: id, Tenant: "acme", Priority: 0, Ranks: 4,
		PerRank:     Resources{MilliCPU: 4000, Memory: 16 << 30, GPUs: 1},
		MaxRestarts: 3, CheckpointInterval: 100, TotalSteps: 1000,
		OutputModel: "llm-small", Deadline: epoch.Add(24 * time.Hour),
	}
}

func TestSpecValidateAttacks(t *testing.T) {
	if err := goodSpec("j-1").Validate(epoch); err != nil {
		t.Fatalf("good spec: %v", err)
	}
	cases := map[string]func(*Spec){
		"empty id":            func(s *Spec) { s.ID = "" },
		"long id":             func(s *Spec) { s.ID = strings.Repeat("a", 64) },
		"upper id":            func(s *Spec) { s.ID = "Job" },
		"path id":             func(s *Spec) { s.ID = "../etc" },
		"leading dash":        func(s *Spec) { s.ID = "-x" },
		"trailing dash":       func(s *Spec) { s.ID = "x-" },
		"nul tenant":          func(s *Spec) { s.Tenant = "a\x00b" },
		"unicode model":       func(s *Spec) { s.OutputModel = "modèle" },
		"space model":         func(s *Spec) { s.OutputModel = "a b" },
		"empty model":         func(s *Spec) { s.OutputModel = "" },
		"zero ranks":          func(s *Spec) { s.Ranks = 0 },
		"negative ranks":      func(s *Spec) { s.Ranks = -1 },
		"huge ranks":          func(s *Spec) { s.Ranks = MaxRanks + 1 },
		"zero cpu":            func(s *Spec) { s.PerRank.MilliCPU = 0 },
		"huge cpu":            func(s *Spec) { s.PerRank.MilliCPU = 1 << 62 },
		"tiny memory":         func(s *Spec) { s.PerRank.Memory = 1 },
		"huge memory":         func(s *Spec) { s.PerRank.Memory = 1 << 62 },
		"negative gpus":       func(s *Spec) { s.PerRank.GPUs = -1 },
		"huge gpus":           func(s *Spec) { s.PerRank.GPUs = 17 },
		"negative restarts":   func(s *Spec) { s.MaxRestarts = -1 },
		"huge restarts":       func(s *Spec) { s.MaxRestarts = 1 << 30 },
		"zero steps":          func(s *Spec) { s.TotalSteps = 0 },
		"huge steps":          func(s *Spec) { s.TotalSteps = 1 << 62 },
		"zero interval":       func(s *Spec) { s.CheckpointInterval = 0 },
		"interval > total":    func(s *Spec) { s.CheckpointInterval = s.TotalSteps + 1 },
		"priority too high":   func(s *Spec) { s.Priority = MaxPriority + 1 },
		"priority too low":    func(s *Spec) { s.Priority = MinPriority - 1 },
		"deadline past":       func(s *Spec) { s.Deadline = epoch.Add(-time.Second) },
		"deadline at submit":  func(s *Spec) { s.Deadline = epoch },
		"deadline far future": func(s *Spec) { s.Deadline = epoch.Add(MaxDeadlineHorizon + time.Second) },
	}
	for name, mut := range cases {
		s := goodSpec("j-1")
		mut(&s)
		if err := s.Validate(epoch); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("%s: Validate = %v, want ErrInvalidSpec", name, err)
		}
	}
	s := goodSpec("j-1")
	s.Deadline = time.Time{}
	if err := s.Validate(epoch); err != nil {
		t.Errorf("no deadline: %v", err)
	}
	// The largest spec allowed must not overflow when the scheduler
	// multiplies it out.
	s = goodSpec("j-1")
	s.Ranks, s.PerRank = MaxRanks, Resources{MaxMilliCPUPerRank, MaxMemoryPerRank, MaxGPUsPerRank}
	if err := s.Validate(epoch); err != nil {
		t.Fatal(err)
	}
	if tot := s.total(); tot.Memory <= 0 || tot.Memory/int64(MaxRanks) != MaxMemoryPerRank {
		t.Fatalf("total memory overflowed: %d", tot.Memory)
	}
}

func TestSpecDigest(t *testing.T) {
	a := goodSpec("j-1")
	if a.Digest() != goodSpec("j-1").Digest() || len(a.Digest()) != 64 {
		t.Fatalf("digest not stable: %s", a.Digest())
	}
	// The same deadline in another zone is the same instant and the same work.
	b := a
	b.Deadline = a.Deadline.In(time.FixedZone("x", 3600))
	if a.Digest() != b.Digest() {
		t.Fatal("digest depends on the deadline's zone")
	}
	seen := map[string]string{a.Digest(): "base"}
	muts := map[string]func(*Spec){
		"id": func(s *Spec) { s.ID = "j-2" }, "tenant": func(s *Spec) { s.Tenant = "acm" },
		"priority": func(s *Spec) { s.Priority = 1 }, "ranks": func(s *Spec) { s.Ranks = 5 },
		"cpu": func(s *Spec) { s.PerRank.MilliCPU++ }, "mem": func(s *Spec) { s.PerRank.Memory++ },
		"gpu": func(s *Spec) { s.PerRank.GPUs++ }, "restarts": func(s *Spec) { s.MaxRestarts++ },
		"interval": func(s *Spec) { s.CheckpointInterval++ }, "steps": func(s *Spec) { s.TotalSteps++ },
		"model": func(s *Spec) { s.OutputModel = "llm-smal" }, "deadline": func(s *Spec) { s.Deadline = time.Time{} },
		// Length prefixes keep field boundaries: moving a byte from one
		// string to the next must change the digest.
		"shift": func(s *Spec) { s.ID, s.Tenant = "j-1a", "cme" },
	}
	for name, m := range muts {
		s := goodSpec("j-1")
		m(&s)
		d := s.Digest()
		if prev, ok := seen[d]; ok {
			t.Errorf("%s digests like %s", name, prev)
		}
		seen[d] = name
	}
}
