package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// TestLineageTree: what was made from a model is drawn under its parent, a
// task's rounds as one line, so a LoRA model imported from a pool model
// shows its task below it rather than beside it.
func TestLineageTree(t *testing.T) {
	at := func(s int64) *timestamppb.Timestamp { return timestamppb.New(time.Unix(s, 0)) }
	hex := func(c byte) string { return strings.Repeat(string(c), 64) }
	pool := &pb.Model{Ref: &pb.ModelRef{Version: hex('a')}, Name: "gocode", Source: pb.ModelSource_MODEL_SOURCE_POOL, CreateTime: at(1),
		Lineage: &pb.PoolLineage{JobId: "job-1", Steps: 200}}
	lora := &pb.Model{Ref: &pb.ModelRef{Version: hex('b'), ParentVersion: hex('a')}, Name: "gocode-lora", CreateTime: at(2),
		Source: pb.ModelSource_MODEL_SOURCE_IMPORTED}
	round := func(v, parent byte, task string, n uint64, s int64) *pb.Model {
		return &pb.Model{Ref: &pb.ModelRef{Version: hex(v), ParentVersion: hex(parent)}, Name: task, TaskId: "t-" + task, Round: n,
			CreateTime: at(s), Source: pb.ModelSource_MODEL_SOURCE_FEDERATED}
	}
	r1, r2, r3 := round('c', 'b', "ft-lora", 1, 3), round('d', 'c', "ft-lora", 2, 4), round('e', 'd', "ft-lora", 3, 5)
	full := round('f', 'a', "ft-full", 1, 6)
	merged := &pb.Model{Ref: &pb.ModelRef{Version: hex('g'), ParentVersion: hex('d')}, Name: "merged", CreateTime: at(7),
		Source: pb.ModelSource_MODEL_SOURCE_IMPORTED}
	all := []*pb.Model{merged, full, r3, r2, r1, lora, pool}
	labels := modelLabels(all)

	print := func(version string) string {
		t.Helper()
		l, err := lineageOf(version, all)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := l.print(&out, labels); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	want := "pool job job-1: 200 steps, spec -, data -, checkpoint -\n" +
		"  used 0.0 CPU-s, 0.0 GPU-s, peak 0 B, energy -\n" +
		"└─ model gocode@1 aaaaaaaaaaaa (pool)   ← this version\n" +
		"   └─ model gocode-lora@1 bbbbbbbbbbbb (imported, derived)\n" +
		"      └─ federated task t-ft-lora: 3 rounds (1–3), newest model ft-lora@3 eeeeeeeeeeee\n" +
		"         └─ model merged@1 gggggggggggg (imported, derived)\n" +
		"   └─ federated task t-ft-full: 1 rounds (1–1), newest model ft-full@1 ffffffffffff\n"
	if got := print(hex('a')); got != want {
		t.Errorf("lineage of the pool model:\n%s\nwant:\n%s", got, want)
	}
	// From the LoRA model: the chain up to the pool job, then its task.
	got := print(hex('b'))
	for _, s := range []string{"pool job job-1", "└─ model gocode@1 aaaaaaaaaaaa (pool)\n", "   └─ model gocode-lora@1 bbbbbbbbbbbb (imported)   ← this version\n",
		"      └─ federated task t-ft-lora: 3 rounds (1–3)"} {
		if !strings.Contains(got, s) {
			t.Errorf("lineage of the LoRA model lacks %q:\n%s", s, got)
		}
	}
	// From a task's first round: the rest of its rounds.
	if got := print(hex('c')); !strings.Contains(got, "└─ federated task t-ft-lora: 2 rounds (2–3), newest model ft-lora@3") {
		t.Errorf("lineage of round 1:\n%s", got)
	}
}
