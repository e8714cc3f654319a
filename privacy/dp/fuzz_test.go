package dp_test

import (
	"encoding/json"
	"testing"

	"github.com/fleetlearn/fleetlearn/privacy/dp"
)

// A persisted budget decodes only into a valid budget, and re-encodes to
// something that decodes to the same state.
func FuzzBudgetUnmarshal(f *testing.F) {
	f.Add([]byte(`{"version":1,"target_epsilon":2,"delta":1e-5,"accountant":"rdp","orders":[1.5,2,8,64],"discretization":0.0001,"events":[{"q":0.01,"noise_multiplier":1.1,"steps":10}]}`))
	f.Add([]byte(`{"version":1,"target_epsilon":2,"delta":1e-5,"accountant":"pld","orders":[2],"discretization":0.001,"events":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var b dp.Budget
		if err := json.Unmarshal(data, &b); err != nil {
			return
		}
		again, err := json.Marshal(&b)
		if err != nil {
			t.Fatal(err)
		}
		var c dp.Budget
		if err := json.Unmarshal(again, &c); err != nil {
			t.Fatalf("re-encoded budget does not decode: %v\n%s", err, again)
		}
		third, _ := json.Marshal(&c)
		if string(third) != string(again) {
			t.Fatalf("round trip changed the state:\n%s\n%s", again, third)
		}
		if b.Rounds() != c.Rounds() {
			t.Fatalf("rounds %d vs %d", b.Rounds(), c.Rounds())
		}
	})
}
