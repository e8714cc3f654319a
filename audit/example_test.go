package audit_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/fleetlearn/fleetlearn/audit"
)

// The flow of the server and of an auditor: record events, sign a
// checkpoint from a ticker, prove an entry's inclusion, query, export, and
// verify the export offline with keys published out of band.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "audit-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// Server side. The clock is injected; this one ticks a second per read.
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { now = now.Add(time.Second); return now }
	lg, err := audit.Open(ctx, dir, audit.WithOrigin("fleetlearn.example.com/audit"), audit.WithClock(clock))
	if err != nil {
		log.Fatal(err)
	}
	defer lg.Close()
	published := lg.PublicKeys() // publish these where the operator cannot change them

	// Model versions and modules are named by SHA-256 digests.
	base := fmt.Sprintf("%x", sha256.Sum256([]byte("base model safetensors bytes")))
	module := fmt.Sprintf("%x", sha256.Sum256([]byte("training module wasm bytes")))
	next := fmt.Sprintf("%x", sha256.Sum256([]byte("round 1 model safetensors bytes")))
	device, _ := lg.PseudonymizeDevice("edge-0042") // raw device ids never enter the log
	events := []struct {
		actor audit.Actor
		p     audit.Payload
	}{
		{audit.Operator("alice"), audit.TaskCreated{Task: "t-1", Name: "mnist-ft", BaseModel: base, Module: module,
			Rounds: 50, CohortTarget: 20, ReportGoal: 15, AggregationRule: "fedavg", SecAgg: true, DP: true}},
		{audit.Device(device), audit.DeviceEnrolled{Device: device}},
		{audit.Service("coordinator"), audit.RoundOpened{Task: "t-1", Round: 1, Model: base, Module: module, CohortSize: 26}},
		{audit.Service("coordinator"), audit.RoundClosed{Task: "t-1", Round: 1, Outcome: audit.RoundCommitted,
			Reports: 19, Dropouts: 7, AggregationRule: "fedavg"}},
		// A committed round's record: the model it made and, with DP on,
		// what it spent. The verifier fails on a round that lacks either.
		{audit.Service("coordinator"), audit.ModelCommitted{Task: "t-1", Round: 1, Model: next, SHA256: next, Parent: base}},
		{audit.Service("coordinator"), audit.PrivacySpent{Task: "t-1", Round: 1, Mechanism: "gaussian", Accountant: "rdp",
			ClipNorm: 1, NoiseMultiplier: 1.1, SamplingRate: 0.01, Delta: 1e-5, Epsilon: 0.2, CumulativeEpsilon: 0.2, EpsilonBudget: 8}},
	}
	for _, e := range events {
		if _, err := lg.Record(ctx, e.actor, e.p); err != nil {
			log.Fatal(err)
		}
	}
	cp, err := lg.Checkpoint(ctx) // the server calls this every second
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("checkpoint: %d entries\n", cp.Size)

	// A client proves that entry 2 is in the checkpointed tree.
	entry, _ := lg.Entry(ctx, 2)
	proof, _ := lg.InclusionProof(ctx, 2, cp.Size)
	leaf := entry.LeafHash()
	fmt.Println("entry 2 included:", audit.VerifyInclusion(2, cp.Size, leaf[:], proof, cp.Root[:]) == nil)

	// The CLI's query.
	filter, _ := audit.ParseFilter("task=t-1 type=round.closed")
	page, _ := lg.Query(ctx, filter, 10, "")
	for _, e := range page.Entries {
		ev, _ := audit.VerifyEntry(e, published.Entry)
		fmt.Println("found:", e.Index, ev.Type, ev.Time.Format(time.RFC3339))
	}

	// Auditor side: an export file, verified offline with the published keys.
	var export bytes.Buffer
	if err := lg.Export(ctx, &export); err != nil {
		log.Fatal(err)
	}
	report, err := audit.VerifyExport(&export,
		audit.WithEntryKey(published.Entry), audit.WithVerifierKey(published.VerifierKey))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("verified %d entries against checkpoint %d; keys pinned: %v; complete rounds: %d\n",
		report.Entries, report.Checkpoint.Size, report.KeysPinned, len(report.Rounds))
	// Output:
	// checkpoint: 6 entries
	// entry 2 included: true
	// found: 3 round.closed 2026-03-01T12:00:04Z
	// verified 6 entries against checkpoint 6; keys pinned: true; complete rounds: 1
}
