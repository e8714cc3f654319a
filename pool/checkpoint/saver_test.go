package checkpoint

import (
	"errors"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetlearn/fleetlearn/model"
)

// gateStore is an in-memory Store whose commits wait for the test: each
// Commit hands its manifest to the test on commits and returns what the
// test answers (nil commits it). Blobs are kept by digest and size only.
// It records the stall each commit came with.
type gateStore struct {
	commits chan *Manifest
	answers chan error

	mu        sync.Mutex
	blobs     map[Digest]int
	manifests map[Digest]*Manifest
	committed []Digest // in commit order
	stalls    map[int64]time.Duration
}

func newGateStore() *gateStore {
	return &gateStore{commits: make(chan *Manifest), answers: make(chan error),
		blobs: map[Digest]int{}, manifests: map[Digest]*Manifest{}, stalls: map[int64]time.Duration{}}
}

func (g *gateStore) PutBlob(d Digest, data []byte) error {
	if Sum(data) != d {
		return ErrCorrupt
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.blobs[d] = len(data)
	return nil
}

func (g *gateStore) HasBlob(d Digest) (bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.blobs[d]
	return ok, nil
}

func (g *gateStore) GetBlob(Digest) ([]byte, error) { return nil, ErrNotFound }

func (g *gateStore) Commit(m *Manifest) (Digest, error) {
	_, id, err := m.Encode()
	if err != nil {
		return Digest{}, err
	}
	g.mu.Lock()
	for _, c := range m.Blobs() {
		if g.blobs[c.Digest] != int(c.Size) {
			g.mu.Unlock()
			return Digest{}, ErrNotFound
		}
	}
	g.mu.Unlock()
	g.commits <- m
	if err := <-g.answers; err != nil {
		return Digest{}, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.manifests[id] = m
	g.committed = append(g.committed, id)
	return id, nil
}

func (g *gateStore) CommitStall(m *Manifest, stall time.Duration) (Digest, error) {
	id, err := g.Commit(m)
	if err == nil {
		g.mu.Lock()
		g.stalls[m.Step] = stall
		g.mu.Unlock()
	}
	return id, err
}

func (g *gateStore) Manifest(id Digest) (*Manifest, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if m, ok := g.manifests[id]; ok {
		return m, nil
	}
	return nil, ErrNotFound
}

func (g *gateStore) Latest() (Digest, *Manifest, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.committed) == 0 {
		return Digest{}, nil, ErrNoCheckpoint
	}
	id := g.committed[len(g.committed)-1]
	return id, g.manifests[id], nil
}

func (g *gateStore) List() ([]Digest, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]Digest(nil), g.committed...), nil
}

// ids returns the ids committed so far, in order.
func (g *gateStore) ids() []Digest {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]Digest(nil), g.committed...)
}

// stall returns the stall step was committed with.
func (g *gateStore) stall(step int64) (time.Duration, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	d, ok := g.stalls[step]
	return d, ok
}

// next takes the commit the Saver is waiting on, which must be of step.
func (g *gateStore) next(t *testing.T, step int64) *Manifest {
	t.Helper()
	select {
	case m := <-g.commits:
		if m.Step != step {
			t.Fatalf("commit of step %d, want step %d", m.Step, step)
		}
		return m
	default:
		t.Fatalf("no commit waiting, want step %d", step)
	}
	return nil
}

// noCommit fails if a commit is waiting.
func (g *gateStore) noCommit(t *testing.T) {
	t.Helper()
	select {
	case m := <-g.commits:
		t.Fatalf("commit of step %d while the one before it is unanswered", m.Step)
	default:
	}
}

// async runs f and returns a channel that gets its result.
func async(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

// returned reports whether ch has a result, and what it is.
func returned(ch <-chan error) (bool, error) {
	select {
	case err := <-ch:
		return true, err
	default:
		return false, nil
	}
}

func stepped(ck *Checkpoint, step int64) *Checkpoint {
	ck.Step = step
	ck.Params.Tensors[0].Data[0] = float32(step)
	return ck
}

// TestSaverSeveralInFlight: with three buffers, three saves return while
// the store holds the first commit; they commit one at a time, in order,
// each naming the one before as parent. A fourth Save waits for a buffer
// (never more than three snapshots held), the wait is its stall, and the
// stall reaches the store with its commit.
func TestSaverSeveralInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGateStore()
		sv, err := NewSaver(g, SaverOptions{Options: Options{ChunkSize: 64}, Buffers: 3, Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		ck := testCheckpoint(0, 256)
		for step := int64(1); step <= 3; step++ {
			if err := sv.Save(stepped(ck, step)); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		m1 := g.next(t, 1)
		g.noCommit(t)
		fourth := async(func() error { return sv.Save(stepped(ck, 4)) })
		synctest.Wait()
		if done, err := returned(fourth); done {
			t.Fatalf("a fourth Save returned (%v) while three snapshots wait to be written", err)
		}
		// The store is slow: three seconds of the bubble's clock.
		time.Sleep(3 * time.Second)
		g.answers <- nil
		synctest.Wait()
		if done, err := returned(fourth); !done || err != nil {
			t.Fatalf("fourth Save: returned %v, %v after a buffer was freed", done, err)
		}
		if !m1.Parent.IsZero() {
			t.Fatalf("first checkpoint names parent %s", m1.Parent)
		}
		for step := int64(2); step <= 4; step++ {
			m := g.next(t, step)
			g.noCommit(t)
			if ids := g.ids(); m.Parent != ids[len(ids)-1] {
				t.Fatalf("step %d names parent %s, want the previous commit %s", step, m.Parent, ids[len(ids)-1])
			}
			g.answers <- nil
			synctest.Wait()
		}
		id, err := sv.Wait()
		if ids := g.ids(); err != nil || len(ids) != 4 || id != ids[3] {
			t.Fatalf("Wait = %s, %v; want the last of %v", id, err, ids)
		}
		want := map[int64]time.Duration{1: 0, 2: 0, 3: 0, 4: 3 * time.Second}
		for step, d := range want {
			if got, ok := g.stall(step); !ok || got != d {
				t.Errorf("step %d committed with stall %v (recorded %v), want %v", step, got, ok, d)
			}
		}
		if st := sv.Stats(); st != (SaverStats{Saves: 4, Waits: 1, Stall: 3 * time.Second, MaxStall: 3 * time.Second}) {
			t.Errorf("stats %+v, want 4 saves, 1 wait of 3s", st)
		}
		if err := sv.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestSaverErrorsOnce: a failed background save is reported once, by the
// next call, joined with any other failure since; the save after it still
// commits, naming the last checkpoint that committed as its parent, and a
// Save that finds an unreported failure snapshots nothing.
func TestSaverErrorsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGateStore()
		sv, err := NewSaver(g, SaverOptions{Options: Options{ChunkSize: 64}, Buffers: 4})
		if err != nil {
			t.Fatal(err)
		}
		ck := testCheckpoint(0, 64)
		errA, errB := errors.New("disk full"), errors.New("link down")
		for step := int64(1); step <= 4; step++ {
			if err := sv.Save(stepped(ck, step)); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		g.next(t, 1)
		g.answers <- nil
		synctest.Wait()
		first := g.ids()[0]
		g.next(t, 2)
		g.answers <- errA
		synctest.Wait()
		if m := g.next(t, 3); m.Parent != first {
			t.Fatalf("step 3 after a failed step 2 names %s, want the last commit %s", m.Parent, first)
		}
		g.answers <- errB
		synctest.Wait()
		if m := g.next(t, 4); m.Parent != first {
			t.Fatalf("step 4 names %s, want %s", m.Parent, first)
		}
		g.answers <- nil
		synctest.Wait()

		// Both failures, once, and nothing taken past them.
		if err := sv.Save(stepped(ck, 5)); !errors.Is(err, errA) || !errors.Is(err, errB) {
			t.Fatalf("Save after two failures: %v, want both", err)
		}
		synctest.Wait()
		g.noCommit(t)
		if st := sv.Stats(); st.Saves != 4 {
			t.Fatalf("%d snapshots taken, want 4: a Save that reports a failure takes none", st.Saves)
		}
		id, err := sv.Wait()
		if ids := g.ids(); err != nil || len(ids) != 2 || id != ids[1] {
			t.Fatalf("Wait = %s, %v; want the last of %v and the errors already reported", id, err, ids)
		}

		// A failure that Wait reports is not reported again by Close.
		if err := sv.Save(stepped(ck, 6)); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		g.next(t, 6)
		g.answers <- errA
		if _, err := sv.Wait(); !errors.Is(err, errA) {
			t.Fatalf("Wait: %v, want %v", err, errA)
		}
		if err := sv.Close(); err != nil {
			t.Fatalf("Close: %v, want the error already reported", err)
		}
	})
}

// TestSaverCloseDrains: Close returns only once every save taken has been
// written, and its error is theirs; Wait likewise.
func TestSaverCloseDrains(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGateStore()
		sv, err := NewSaver(g, SaverOptions{Options: Options{ChunkSize: 64}, Buffers: 2})
		if err != nil {
			t.Fatal(err)
		}
		ck := testCheckpoint(0, 64)
		for step := int64(1); step <= 2; step++ {
			if err := sv.Save(stepped(ck, step)); err != nil {
				t.Fatal(err)
			}
		}
		closed := async(sv.Close)
		synctest.Wait()
		g.next(t, 1)
		g.answers <- nil
		synctest.Wait()
		if done, _ := returned(closed); done {
			t.Fatal("Close returned with a save still waiting to be written")
		}
		g.next(t, 2)
		errLast := errors.New("refused")
		g.answers <- errLast
		synctest.Wait()
		if done, err := returned(closed); !done || !errors.Is(err, errLast) {
			t.Fatalf("Close: returned %v, %v; want the last save's error", done, err)
		}
		if ids := g.ids(); len(ids) != 1 {
			t.Fatalf("%d commits, want 1", len(ids))
		}
		if err := sv.Save(ck); !errors.Is(err, ErrClosed) {
			t.Fatalf("Save after Close: %v", err)
		}
		if err := sv.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	})
}

// TestSaverOrderOnDisk: twenty saves back to back through four buffers and
// three workers end as a chain of twenty checkpoints on disk, the latest
// the last one taken, each the state it was taken with.
func TestSaverOrderOnDisk(t *testing.T) {
	s, _ := openTest(t)
	sv, err := NewSaver(s, SaverOptions{Options: Options{ChunkSize: 512}, Buffers: 4, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	ck := testCheckpoint(0, 4096)
	var want []*Checkpoint
	for step := int64(1); step <= 20; step++ {
		ck.Params.Tensors[0].Data[int(step)*200] = float32(step)
		if err := sv.Save(stepped(ck, step)); err != nil {
			t.Fatal(err)
		}
		want = append(want, cloneCheckpoint(ck))
	}
	last, err := sv.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if err := sv.Close(); err != nil {
		t.Fatal(err)
	}
	if id, _, err := s.Latest(); err != nil || id != last {
		t.Fatalf("LATEST %s, %v; the Saver's last commit %s", id, err, last)
	}
	id := last
	for i := 19; i >= 0; i-- {
		got, err := Load(s, id)
		if err != nil {
			t.Fatal(err)
		}
		assertSame(t, got, want[i])
		id = got.Parent
	}
	if !id.IsZero() {
		t.Fatalf("the chain goes on past step 1, to %s", id)
	}
}

// discardStore commits at once and keeps only the blobs' sizes. It is a
// plain Store: embedding the interface hides gateStore's CommitStall.
type discardStore struct {
	Store
}

func (d *discardStore) Commit(m *Manifest) (Digest, error) {
	_, id, err := m.Encode()
	return id, err
}

// TestSaverReusesBuffers: once its buffers are allocated, a Saver copies
// each checkpoint into them; it allocates nothing of the model's size per
// save, so its memory stays Buffers snapshots however many it takes.
func TestSaverReusesBuffers(t *testing.T) {
	const values = 1 << 20 // 4 MiB of float32
	d := &discardStore{Store: newGateStore()}
	sv, err := NewSaver(d, SaverOptions{Buffers: 2, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.New(model.Tensor{Name: "w", Shape: []int{values}, Data: make([]float32, values)})
	if err != nil {
		t.Fatal(err)
	}
	ck := &Checkpoint{Job: "j", Params: m}
	save := func(step int64) {
		if err := sv.Save(stepped(ck, step)); err != nil {
			t.Fatal(err)
		}
	}
	for step := int64(1); step <= 2; step++ { // both buffers, and the workers' chunks
		save(step)
	}
	if _, err := sv.Wait(); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const saves = 20
	for step := int64(3); step < 3+saves; step++ {
		save(step)
	}
	if _, err := sv.Wait(); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / saves; per > 4*values/8 {
		t.Fatalf("%d bytes allocated per save of a %d-byte model: the snapshot buffers are not reused", per, 4*values)
	}
	if err := sv.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSaverPrepare: Prepare allocates every buffer for the checkpoint's
// shape, so that Saves copy into it and allocate no snapshot memory.
func TestSaverPrepare(t *testing.T) {
	const values = 1 << 16
	d := &discardStore{Store: newGateStore()}
	sv, err := NewSaver(d, SaverOptions{Buffers: 3})
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.New(model.Tensor{Name: "w", Shape: []int{values}, Data: make([]float32, values)})
	if err != nil {
		t.Fatal(err)
	}
	ck := &Checkpoint{Job: "j", Params: m}
	if err := sv.Prepare(ck); err != nil {
		t.Fatal(err)
	}
	buffers := func() map[*float32]bool {
		seen := map[*float32]bool{}
		var bs []*snapshot
		for range cap(sv.free) {
			b := <-sv.free
			if ts := b.params.Tensors; len(ts) != 1 || cap(ts[0].Data) < values {
				t.Fatalf("a buffer holds %d tensors after Prepare, want one of %d values", len(ts), values)
			}
			seen[&b.params.Tensors[0].Data[0]] = true
			bs = append(bs, b)
		}
		for _, b := range bs {
			sv.free <- b
		}
		return seen
	}
	before := buffers()
	for step := int64(1); step <= 6; step++ {
		if err := sv.Save(stepped(ck, step)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := sv.Wait(); err != nil {
		t.Fatal(err)
	}
	after := buffers()
	for p := range after {
		if !before[p] {
			t.Fatal("a Save after Prepare allocated a new snapshot buffer")
		}
	}
	if err := sv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sv.Prepare(ck); !errors.Is(err, ErrClosed) {
		t.Fatalf("Prepare after Close: %v", err)
	}
}

func TestSaverOptionsBounded(t *testing.T) {
	s, _ := openTest(t)
	for _, o := range []SaverOptions{{Buffers: -1}, {Buffers: MaxBuffers + 1}, {Workers: -1}, {Workers: MaxWorkers + 1}} {
		if _, err := NewSaver(s, o); !errors.Is(err, ErrInvalidCheckpoint) {
			t.Errorf("NewSaver(%+v): %v, want ErrInvalidCheckpoint", o, err)
		}
	}
}
