package poolsvc

import (
	"strings"
	"testing"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// A job starting from a registered model, a language model in particular,
// need not describe an MLP; one starting from init_seed must.
func TestBuiltinArchOptionalWithInitModel(t *testing.T) {
	sp := &pb.PoolJobSpec{Ranks: 2, CheckpointInterval: 20, TotalSteps: 100,
		Program: &pb.PoolJobSpec_Builtin{Builtin: &pb.PoolBuiltinTrainer{BatchSize: 16, LearningRate: 1e-3, SyncEvery: 10,
			Dataset: &pb.PoolDataset{Source: "dir:public"}, InitModel: strings.Repeat("ab", 32)}}}
	if err := checkProgram(sp); err != nil {
		t.Fatalf("language model job without arch: %v", err)
	}
	sp.GetBuiltin().InitModel = ""
	if err := checkProgram(sp); err == nil || !strings.Contains(err.Error(), "spec.builtin.arch") {
		t.Fatalf("no arch and no init_model: %v, want an error naming spec.builtin.arch", err)
	}
	sp.GetBuiltin().InitModel, sp.GetBuiltin().Arch = strings.Repeat("ab", 32), []uint32{4, 0}
	if err := checkProgram(sp); err == nil || !strings.Contains(err.Error(), "spec.builtin.arch[1]") {
		t.Fatalf("a bad arch beside init_model: %v, want it checked", err)
	}
}
