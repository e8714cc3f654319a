package wasm

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/wasm/examples/embedded"
)

// withCompileBudget sets the rent after which EngineAuto compiles a module.
func withCompileBudget(d time.Duration) Option { return func(c *config) { c.compileBudget = d } }

func tieredSandbox(t *testing.T, opts ...Option) *Sandbox {
	t.Helper()
	if Engine() != EngineCompiler {
		t.Skipf("wazero does not compile on this machine: %s is the interpreter alone", EngineAuto)
	}
	s, err := New(append([]Option{WithEngine(EngineAuto)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

func loadExample(t *testing.T, s *Sandbox, name string) *Module {
	t.Helper()
	m, err := embedded.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	code, err := m.Code()
	if err != nil {
		t.Fatal(err)
	}
	mod, err := s.Load(context.Background(), code, m.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mod.Close(context.Background()) })
	return mod
}

// smallCall is an MLP training call on a few examples: cheap on either engine.
func smallCall(t *testing.T) Call {
	t.Helper()
	d := &data.Dataset{Dim: 6, NumClasses: 3, Features: make([]float32, 6*10), Labels: make([]uint8, 10)}
	for i := range d.Features {
		d.Features[i] = float32(i%7) / 7
	}
	for i := range d.Labels {
		d.Labels[i] = uint8(i % 3)
	}
	m, err := train.InitMLP([]int{6, 5, 3}, 1)
	if err != nil {
		t.Fatal(err)
	}
	return Call{Model: m, Data: d, Hyper: []byte(`{"batch_size": 4, "epochs": 2}`), Seed: 7}
}

func sameModel(t *testing.T, a, b *model.Model) {
	t.Helper()
	for i := range a.Tensors {
		x, y := a.Tensors[i].Data, b.Tensors[i].Data
		for j := range x {
			if x[j] != y[j] {
				t.Fatalf("%s[%d]: %v interpreted, %v compiled", a.Tensors[i].Name, j, x[j], y[j])
			}
		}
	}
}

// TestAutoCompilesOnceItPays: under EngineAuto a module starts on the
// interpreter; once its calls have spent the compile budget it moves to
// machine code, which trains to the same bits; and a sandbox that opens the
// same cache later starts it compiled.
func TestAutoCompilesOnceItPays(t *testing.T) {
	dir := t.TempDir()
	s := tieredSandbox(t, WithCacheDir(dir), withCompileBudget(time.Nanosecond))
	mod := loadExample(t, s, "mlp-go")
	if got := mod.Engine(); got != EngineInterpreter {
		t.Fatalf("a module the device never compiled starts on %s, want the interpreter", got)
	}
	c := smallCall(t)
	interpreted, err := mod.Train(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	started := mod.e.code == nil
	s.mu.Unlock()
	if !started {
		t.Fatal("a call that spent the budget did not start compiling the module")
	}
	<-mod.e.promoted
	if got := mod.Engine(); got != EngineCompiler {
		t.Fatalf("after its budget was spent the module runs on %s, want the compiler", got)
	}
	compiled, err := mod.Train(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	sameModel(t, interpreted.Model, compiled.Model)
	if interpreted.Metrics["loss"] != compiled.Metrics["loss"] {
		t.Errorf("loss %v interpreted, %v compiled", interpreted.Metrics["loss"], compiled.Metrics["loss"])
	}

	again := tieredSandbox(t, WithCacheDir(dir), withCompileBudget(time.Hour))
	if got := loadExample(t, again, "mlp-go").Engine(); got != EngineCompiler {
		t.Errorf("a module compiled into the cache before starts on %s, want the compiler", got)
	}
	// Another module in the same cache was never compiled.
	if got := loadExample(t, again, "softmax").Engine(); got != EngineInterpreter {
		t.Errorf("a module never compiled starts on %s, want the interpreter", got)
	}
}

// TestAutoRentsUntilBudget: calls that have not spent the budget leave the
// module on the interpreter, with their time in the module counted.
func TestAutoRentsUntilBudget(t *testing.T) {
	s := tieredSandbox(t, withCompileBudget(time.Hour))
	mod := loadExample(t, s, "mlp-go")
	for range 3 {
		if _, err := mod.Train(context.Background(), smallCall(t)); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	rent, waiting := mod.e.rent, mod.e.code != nil
	s.mu.Unlock()
	if got := mod.Engine(); got != EngineInterpreter || !waiting {
		t.Errorf("below budget the module runs on %s (compile pending %v), want the interpreter", got, waiting)
	}
	if rent <= 0 {
		t.Errorf("three interpreted calls charged %v", rent)
	}
}

// TestDefaultBudget: without an override the budget is the interpreter's
// preparation time scaled by compileFactor.
func TestDefaultBudget(t *testing.T) {
	s := tieredSandbox(t)
	tr := s.newTier("h", nil, 10*time.Millisecond)
	if tr.budget != compileFactor*10*time.Millisecond {
		t.Errorf("budget %v, want %v", tr.budget, compileFactor*10*time.Millisecond)
	}
}

// TestWithEngine: the engines this machine runs are accepted and reported,
// any other name is refused with what to use instead, and the fixed engines
// never switch.
func TestWithEngine(t *testing.T) {
	if _, err := New(WithEngine("jit")); !errors.Is(err, ErrEngine) {
		t.Errorf("engine jit: %v, want ErrEngine", err)
	}
	for _, e := range Engines() {
		s, err := New(WithEngine(e), withCompileBudget(time.Nanosecond))
		if err != nil {
			t.Fatalf("%s: %v", e, err)
		}
		if s.Engine() != e {
			t.Errorf("WithEngine(%s) runs %s", e, s.Engine())
		}
		s.Close(context.Background())
	}
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	want := EngineInterpreter
	if Engine() == EngineCompiler {
		want = EngineAuto
	}
	if s.Engine() != want {
		t.Errorf("default engine %s, want %s", s.Engine(), want)
	}
	for _, e := range []string{EngineCompiler, EngineInterpreter} {
		if Engine() != EngineCompiler && e == EngineCompiler {
			continue
		}
		s, err := New(WithEngine(e), withCompileBudget(time.Nanosecond))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(context.Background())
		mod := loadExample(t, s, "mlp-go")
		if _, err := mod.Train(context.Background(), smallCall(t)); err != nil {
			t.Fatal(err)
		}
		if mod.Engine() != e || mod.e.promoted != nil {
			t.Errorf("WithEngine(%s): the module runs on %s after a call (tiered: %v)", e, mod.Engine(), mod.e.promoted != nil)
		}
	}
}

// TestAutoCloseWhileCompiling: closing the sandbox waits for a background
// compilation, so the runtime it compiles in never closes under it.
func TestAutoCloseWhileCompiling(t *testing.T) {
	s := tieredSandbox(t, withCompileBudget(time.Nanosecond))
	mod := loadExample(t, s, "mlp-go")
	if _, err := mod.Train(context.Background(), smallCall(t)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-mod.e.promoted:
	default:
		t.Error("Close returned while the module was being compiled")
	}
}

// TestAutoConcurrentCalls: calls in flight while the module moves to the
// compiler finish on whichever code they started with, and every call
// trains to the same bits.
func TestAutoConcurrentCalls(t *testing.T) {
	s := tieredSandbox(t, withCompileBudget(time.Nanosecond))
	mod := loadExample(t, s, "mlp-go")
	c := smallCall(t)
	want, err := mod.Train(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	results := make([]*Result, 8)
	errs := make([]error, len(results))
	for i := range results {
		wg.Go(func() { results[i], errs[i] = mod.Train(context.Background(), c) })
	}
	wg.Wait()
	<-mod.e.promoted
	for i, r := range results {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		sameModel(t, want.Model, r.Model)
	}
	if mod.Engine() != EngineCompiler {
		t.Errorf("module on %s after its budget was spent", mod.Engine())
	}
}
