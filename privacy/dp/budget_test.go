package dp_test

import (
	"encoding/json"
	"errors"
	"math"
	"testing"

	"github.com/fleetlearn/fleetlearn/privacy/dp"
)

func TestBudgetRefusesTheRoundThatWouldExceed(t *testing.T) {
	for _, acc := range []dp.Accountant{dp.RDP, dp.PLD} {
		t.Run(acc.String(), func(t *testing.T) {
			b, err := dp.NewBudget(1, 1e-5, dp.WithAccountant(acc))
			if err != nil {
				t.Fatal(err)
			}
			if e, _ := b.Spent(); e != 0 {
				t.Errorf("empty budget spent %v", e)
			}
			prev := 0.0
			for {
				preview, err := b.Preview(1, 8)
				if err != nil {
					t.Fatal(err)
				}
				got, err := b.Spend(1, 8)
				if errors.Is(err, dp.ErrBudgetExceeded) {
					if preview <= 1 {
						t.Errorf("refused a round previewed at ε %v", preview)
					}
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if got != preview || got <= prev || got > 1 {
					t.Fatalf("round %d: ε %v (preview %v, before %v)", b.Rounds(), got, preview, prev)
				}
				prev = got
			}
			if spent, _ := b.Spent(); spent != prev {
				t.Errorf("refused round changed the budget: %v → %v", prev, spent)
			}
			want, _ := dp.Epsilon([]dp.Event{{Q: 1, NoiseMultiplier: 8, Steps: b.Rounds()}}, 1e-5, dp.WithAccountant(acc))
			if math.Abs(prev-want) > 1e-9 {
				t.Errorf("budget ε %v after %d rounds, Epsilon says %v", prev, b.Rounds(), want)
			}
			if b.Rounds() < 2 {
				t.Errorf("only %d rounds fit", b.Rounds())
			}
		})
	}
}

func TestBudgetPersists(t *testing.T) {
	b, err := dp.NewBudget(5, 1e-6, dp.WithOrders(dp.OrdersOpacus()))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		q := 0.01
		if i%10 == 0 {
			q = 0.02
		}
		if _, err := b.Spend(q, 1.1); err != nil {
			t.Fatal(err)
		}
	}
	data, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	var r dp.Budget
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	e1, _ := b.Spent()
	e2, _ := r.Spent()
	p1, _ := b.Preview(0.5, 2)
	p2, _ := r.Preview(0.5, 2)
	if e1 != e2 || p1 != p2 || r.Rounds() != 30 {
		t.Errorf("restored budget: ε %v vs %v, preview %v vs %v, %d rounds", e1, e2, p1, p2, r.Rounds())
	}
	for _, bad := range []string{
		`{}`,
		`{"version":1,"target_epsilon":1,"delta":1e-5,"accountant":"rdp","orders":[2],"discretization":1e-4,"events":[{"q":2,"noise_multiplier":1,"steps":1}]}`,
		`{"version":1,"target_epsilon":1,"delta":0,"accountant":"rdp","orders":[2],"discretization":1e-4,"events":[]}`,
		`{"version":1,"target_epsilon":1,"delta":1e-5,"accountant":"moments","orders":[2],"discretization":1e-4,"events":[]}`,
		`{"version":1,"target_epsilon":1,"delta":1e-5,"accountant":"rdp","orders":[2],"discretization":1e-4,"events":[],"extra":1}`,
		`{"version":2,"target_epsilon":1,"delta":1e-5,"accountant":"rdp","orders":[2],"discretization":1e-4,"events":[]}`,
		`not json`,
	} {
		if err := r.UnmarshalJSON([]byte(bad)); !errors.Is(err, dp.ErrMalformed) {
			t.Errorf("%s: %v", bad, err)
		}
	}
	if r.Rounds() != 30 {
		t.Errorf("failed decode changed the budget")
	}
}

func TestBudgetRejectsBadInput(t *testing.T) {
	for _, c := range [][2]float64{{0, 1e-5}, {math.NaN(), 1e-5}, {1, 0}, {1, 1}} {
		if _, err := dp.NewBudget(c[0], c[1]); !errors.Is(err, dp.ErrInvalid) {
			t.Errorf("NewBudget%v: %v", c, err)
		}
	}
	b, _ := dp.NewBudget(1, 1e-5)
	for _, c := range [][2]float64{{0, 1}, {1.1, 1}, {0.5, 0}, {0.5, math.Inf(1)}} {
		if _, err := b.Spend(c[0], c[1]); !errors.Is(err, dp.ErrInvalid) {
			t.Errorf("Spend%v: %v", c, err)
		}
	}
}
