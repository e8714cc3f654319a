package server_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/data/datatest"
	"github.com/fleetlearn/fleetlearn/internal/freeport"
	"github.com/fleetlearn/fleetlearn/internal/simfleet"
	"github.com/fleetlearn/fleetlearn/model"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/build"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// The round benchmarks measure the system around training: check-ins, plans,
// model downloads, report transport through JetStream, validation,
// aggregation and the commit, with a module (wasm/examples/noop) that does
// next to nothing, on a model of 100k float32 parameters.
//
//	go test -run '^$' -bench 'BenchmarkRound$' -benchtime 5x ./server/
//	FLEETLEARN_BENCH_PROCS=1 go test -run '^$' -bench BenchmarkRoundProcesses -benchtime 5x ./server/
//
// FLEETLEARN_BENCH_EDGE_ENV adds space-separated NAME=value pairs to the
// environment of BenchmarkRoundProcesses' agent processes (GOGC=50, say).
// FLEETLEARN_BENCH_PACE sets the server's pace window (default 20ms). A device
// that has reported is told to retry after about ten windows (or, if the
// server has not counted its report yet, waits 250-500 ms on its own); when the
// next round is announced it wakes at a random point of that wait, capped at
// a second. So the pace window and the agents' timing bound the round time
// from below, whatever the work costs.

const (
	noopModule   = "github.com/fleetlearn/fleetlearn/wasm/examples/noop"
	benchParams  = 100_000
	benchWarmup  = 2 // rounds not measured: connecting, first downloads, module compilation
	benchDefPace = 20 * time.Millisecond
)

// benchModel is one Linear weight of 100k parameters.
func benchModel() *model.Model {
	w := make([]float32, benchParams)
	for i := range w {
		w[i] = float32(i%97) / 97
	}
	m, err := model.New(model.Tensor{Name: "fc1.weight", Shape: []int{10, benchParams / 10}, Data: w})
	if err != nil {
		panic(err)
	}
	return m
}

func benchPace(tb testing.TB) time.Duration {
	s := os.Getenv("FLEETLEARN_BENCH_PACE")
	if s == "" {
		return benchDefPace
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		tb.Fatalf("FLEETLEARN_BENCH_PACE=%q: want a positive duration", s)
	}
	return d
}

// benchModuleCode is the module the agents run: by default the hand-assembled
// wasmtest.Trivial, which has no language runtime to instantiate;
// FLEETLEARN_BENCH_MODULE=noop selects the Go-built wasm/examples/noop.
func benchModuleCode(tb testing.TB) []byte {
	switch m := os.Getenv("FLEETLEARN_BENCH_MODULE"); m {
	case "", "trivial":
		return wasmtest.Trivial()
	case "noop":
		code, err := build.Module(context.Background(), "", noopModule)
		if err != nil {
			tb.Fatal(err)
		}
		return code
	default:
		tb.Fatalf("FLEETLEARN_BENCH_MODULE=%q: want trivial or noop", m)
		return nil
	}
}

func benchTask(version, module string, cohort int) *pb.Task {
	return &pb.Task{Name: "bench", Model: &pb.ModelRef{Version: version}, Module: &pb.ModuleRef{Sha256: module},
		CohortTarget: uint32(cohort), ReportGoal: uint32(cohort), OverSelection: 0.01, RoundsTotal: 1 << 20,
		SelectionTimeout: durationpb.New(time.Minute), ReportTimeout: durationpb.New(5 * time.Minute)}
}

// TestNoopModule: the benchmarks' module adds its step to every parameter,
// whatever the layout, and reports the whole dataset.
func TestNoopModule(t *testing.T) {
	sb := sharedSandbox(t)
	ctx := context.Background()
	code := wasmtest.Build(t, noopModule)
	mod, err := sb.Load(ctx, code, wasm.Hash(code))
	if err != nil {
		t.Fatal(err)
	}
	defer mod.Close(ctx)
	m, err := model.New(model.Tensor{Name: "w", Shape: []int{2, 3, 2}, Data: make([]float32, 12)},
		model.Tensor{Name: "b", Shape: []int{5}, Data: []float32{-1, 0, 1, 2, 3}})
	if err != nil {
		t.Fatal(err)
	}
	ds := datatest.Synthetic(7, 4, 2, 1)
	res, err := mod.Train(ctx, wasm.Call{Model: m, Data: ds})
	if err != nil {
		t.Fatal(err)
	}
	if res.NumExamples != 7 {
		t.Fatalf("num_examples %d, want 7", res.NumExamples)
	}
	before, after := m.Flatten(), res.Model.Flatten()
	for i := range after {
		if d := after[i] - before[i]; d < 0.9e-3 || d > 1.1e-3 {
			t.Fatalf("value %d moved by %v, want 1e-3", i, d)
		}
	}
	ev, err := mod.Evaluate(ctx, wasm.Call{Model: m, Data: ds})
	if err != nil {
		t.Fatal(err)
	}
	if acc, ok := ev.Metrics["accuracy"]; !ok || acc != 0 || ev.NumExamples != 7 {
		t.Fatalf("evaluate: %d examples, metrics %v", ev.NumExamples, ev.Metrics)
	}
}

// benchRoundTime is one committed round as the server's events timed it.
type benchRoundTime struct {
	round        uint64
	open, commit time.Time // zero open: the OPENED event was missed
	reported     uint32
	err          string // the round was abandoned, or the watch ended
}

// watchBenchRounds streams a task's committed rounds.
func watchBenchRounds(tb testing.TB, tasks apiv1.TaskServiceClient, id string) <-chan benchRoundTime {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	st, err := tasks.WatchTask(ctx, &pb.WatchTaskRequest{TaskId: id})
	if err != nil {
		tb.Fatal(err)
	}
	out := make(chan benchRoundTime, 1024)
	go func() {
		opened := map[uint64]time.Time{}
		for {
			resp, err := st.Recv()
			if err != nil {
				if ctx.Err() == nil {
					out <- benchRoundTime{err: "watch ended: " + err.Error()}
				}
				return
			}
			ev := resp.GetEvent()
			switch ev.GetType() {
			case pb.RoundEventType_ROUND_EVENT_TYPE_OPENED:
				opened[ev.Round] = ev.Time.AsTime()
			case pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED:
				out <- benchRoundTime{round: ev.Round, open: opened[ev.Round], commit: ev.Time.AsTime(), reported: ev.Reported}
			case pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED:
				out <- benchRoundTime{round: ev.Round, err: fmt.Sprintf("round %d abandoned: %s", ev.Round, ev.Reason)}
			}
		}
	}()
	return out
}

func nextBenchRound(tb testing.TB, rounds <-chan benchRoundTime, timeout time.Duration, diag func() string) benchRoundTime {
	tb.Helper()
	select {
	case r := <-rounds:
		if r.err != "" {
			tb.Fatalf("%s (%s)", r.err, diag())
		}
		return r
	case <-time.After(timeout):
		tb.Fatalf("no round committed within %v (%s)", timeout, diag())
	}
	panic("unreachable")
}

// BenchmarkRound runs one long task with in-process simulated devices
// (package internal/simfleet: one NATS connection each, no WASM; a selected device
// downloads the round's model and publishes a precomputed update) against a
// real server. Metrics per round, from the server's OPENED and COMMITTED
// events: s/round; of that, until the last device got its plan
// (s-select/round) and until the last report was stored (s-reports/round).
// MB-peak-rss is the process's peak resident memory, server and devices
// together. ns/op is the time from one commit to the next.
func BenchmarkRound(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("clients=%d", n), func(b *testing.B) { benchRound(b, n) })
	}
}

func benchRound(b *testing.B, n int) {
	resetBenchRSS()
	h := servertest.New(b, servertest.WithPace(benchPace(b)))
	m := benchModel()
	version := h.ImportModel(b, "bench-100k", m)
	module := h.RegisterModule(b, "noop", benchModuleCode(b))
	task := h.CreateTask(b, benchTask(version, module, n))
	rounds := watchBenchRounds(b, h.Tasks, task.Id)

	delta := make([]float32, benchParams)
	for i := range delta {
		delta[i] = 1e-3
	}
	layout := []*pb.TensorSpec{{Name: "fc1.weight", Shape: []uint64{10, benchParams / 10}}}
	lg := simfleet.Config{NATSURL: h.NATSURL(), NATSOptions: h.ServiceNATSOptions(), Devices: n, Layout: layout, Delta: delta, FetchModel: true}
	lg.Keys = h.EnrollKeys(b, lg.DeviceIDs())
	fleet, err := simfleet.Start(lg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(fleet.Stop)
	diag := func() string { return fmt.Sprintf("fleet %+v, last failure %q", fleet.Stats(), fleet.LastFailure()) }
	for range benchWarmup {
		nextBenchRound(b, rounds, 3*time.Minute, diag)
	}

	var total, sel, rep time.Duration
	measured := 0
	for b.Loop() {
		r := nextBenchRound(b, rounds, 3*time.Minute, diag)
		if r.open.IsZero() {
			continue
		}
		if int(r.reported) < n {
			b.Fatalf("round %d committed with %d reports, want %d", r.round, r.reported, n)
		}
		tr, ok := fleet.Trace(task.Id, r.round)
		if !ok {
			b.Fatalf("round %d: the fleet saw no plan", r.round)
		}
		total += r.commit.Sub(r.open)
		sel += tr.LastPlan.Sub(r.open)
		rep += tr.LastReport.Sub(r.open)
		measured++
	}
	if measured == 0 {
		b.Fatal("no round measured")
	}
	if st := fleet.Stats(); st.Refused > 0 || st.Failures > 0 {
		b.Fatalf("fleet %+v: %s", st, fleet.LastFailure())
	}
	k := float64(measured)
	b.ReportMetric(total.Seconds()/k, "s/round")
	b.ReportMetric(sel.Seconds()/k, "s-select/round")
	b.ReportMetric(rep.Seconds()/k, "s-reports/round")
	if kb, err := benchHWM("self"); err == nil {
		b.ReportMetric(float64(kb)/1024, "MB-peak-rss")
	}
}

// resetBenchRSS returns freed memory to the OS and restarts the kernel's
// peak-RSS counter (Linux; elsewhere a no-op), so a sub-benchmark's peak is
// its own.
func resetBenchRSS() {
	debug.FreeOSMemory()
	os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// benchHWM is a process's peak resident set (VmHWM) in KiB, or of "self".
func benchHWM(pid string) (int64, error) {
	return benchProcStatus(pid, "status", "VmHWM:")
}

// benchPss is a process's proportional set size in KiB: shared pages divided
// among the processes that map them.
func benchPss(pid string) (int64, error) {
	return benchProcStatus(pid, "smaps_rollup", "Pss:")
}

func benchProcStatus(pid, file, key string) (int64, error) {
	f, err := os.Open(filepath.Join("/proc", pid, file))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), key); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%s/%s: no %s", pid, file, key)
}

// benchCPU is the CPU time a process has used, user and system, from
// /proc/<pid>/stat (in clock ticks of 1/100 s, Linux's USER_HZ).
func benchCPU(pid string) (time.Duration, error) {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces; the fields that follow it do not.
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 13 {
		return 0, fmt.Errorf("/proc/%s/stat: unexpected format", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%s/stat: unexpected format", pid)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// benchProc is a child process whose output goes to a log file.
type benchProc struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func startBenchProc(tb testing.TB, name, logPath, bin string, args ...string) *benchProc {
	tb.Helper()
	lf, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	p := &benchProc{name: name, log: logPath, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = lf, lf
	if env := os.Getenv("FLEETLEARN_BENCH_EDGE_ENV"); env != "" && strings.HasPrefix(name, "dev-") {
		p.cmd.Env = append(os.Environ(), strings.Fields(env)...)
	}
	if err := p.cmd.Start(); err != nil {
		lf.Close()
		tb.Fatalf("start %s: %v", name, err)
	}
	go func() { p.err = p.cmd.Wait(); lf.Close(); close(p.done) }()
	return p
}

func (p *benchProc) pid() string { return strconv.Itoa(p.cmd.Process.Pid) }

func (p *benchProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *benchProc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// stopBenchProcs sends SIGTERM to every process, then waits for each, killing
// those still running after the grace period.
func stopBenchProcs(tb testing.TB, grace time.Duration, ps ...*benchProc) {
	for _, p := range ps {
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
	end := time.After(grace)
	for _, p := range ps {
		select {
		case <-p.done:
		case <-end:
			tb.Logf("%s did not stop within %v; killing it", p.name, grace)
			p.cmd.Process.Kill()
			<-p.done
		}
	}
}

func benchAddr(tb testing.TB) string {
	tb.Helper()
	return freeport.Addr(tb)
}

func benchGoTool() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); benchFileExists(p) {
		return p
	}
	return "go"
}

func benchFileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// BenchmarkRoundProcesses runs the aggregator binary and 100 edge-agent
// binaries as separate processes over loopback TCP, each agent with its own
// dataset and caches and running the noop module in its sandbox. It reports
// s/round and three sums over all 101 processes: of their peak resident
// memory over the whole run, which includes every agent compiling the module
// once (MB-peak-rss-sum); of their peaks over the measured rounds only
// (MB-rounds-rss-sum); and of their proportional set sizes at the end, which
// count shared pages once (MB-pss-sum). Set FLEETLEARN_BENCH_PROCS=1 to run
// it: it builds both commands and starts 101 processes.
// FLEETLEARN_BENCH_PPROF=DIR builds the server with net/http/pprof and keeps
// in DIR a CPU profile of the server over the measured rounds' first
// FLEETLEARN_BENCH_CPU_SECONDS seconds (default 30).
// FLEETLEARN_BENCH_NATS=external runs nats-server (built from the module) as
// its own process, as BenchmarkLargeModelRound does: the server's CPU is
// then the aggregator's alone, and the log names nats-server's apart.
func BenchmarkRoundProcesses(b *testing.B) {
	if os.Getenv("FLEETLEARN_BENCH_PROCS") != "1" {
		b.Skip("set FLEETLEARN_BENCH_PROCS=1 to start 101 processes")
	}
	if testing.Short() {
		b.Skip("starts 101 processes")
	}
	const devices = 100
	ctx := context.Background()
	dir := b.TempDir()
	bin := filepath.Join(dir, "bin")
	args := []string{"build", "-o", bin + string(filepath.Separator)}
	profiles := os.Getenv("FLEETLEARN_BENCH_PPROF")
	var pprofAddr string
	if profiles != "" {
		args = append(args, "-overlay", benchPprofOverlay(b, dir))
		pprofAddr = benchAddr(b)
	}
	cmd := exec.Command(benchGoTool(), append(args,
		"github.com/fleetlearn/fleetlearn/cmd/fleetlearn-server", "github.com/fleetlearn/fleetlearn/cmd/fleetlearn-edge")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build: %v\n%s", err, out)
	}
	code := benchModuleCode(b)
	if pprofAddr != "" {
		b.Setenv("FLEETLEARN_BENCH_PPROF_ADDR", pprofAddr) // the server inherits it; edges ignore it
	}

	publisher, jwks := servertest.NewPublisher(b)
	jwksPath := filepath.Join(dir, "publishers.jwks")
	if err := os.WriteFile(jwksPath, jwks, 0o600); err != nil {
		b.Fatal(err)
	}
	natsAddr, grpcAddr, serverDir := benchAddr(b), benchAddr(b), filepath.Join(dir, "server")
	natsArgs := []string{"--nats-listen", natsAddr}
	var natsProc *benchProc
	if os.Getenv("FLEETLEARN_BENCH_NATS") == "external" {
		natsProc = startBenchNATS(b, bin, dir, serverDir, natsAddr, server.DefaultReportStoreBytes+1<<30)
		natsArgs = []string{"--nats-url", "nats://" + natsAddr}
	}
	srv := startBenchProc(b, "fleetlearn-server", filepath.Join(dir, "server.log"), filepath.Join(bin, "fleetlearn-server"),
		append([]string{"--data-dir", serverDir, "--grpc-addr", grpcAddr, "--metrics-addr", "off",
			"--pace-window", benchPace(b).String(), "--log-level", "warn", "--module-publishers", jwksPath}, natsArgs...)...)
	b.Cleanup(func() { stopBenchProcs(b, 30*time.Second, srv) })
	var conn *grpc.ClientConn
	for start := time.Now(); conn == nil; time.Sleep(100 * time.Millisecond) {
		ca, err := os.ReadFile(server.CAFile(serverDir))
		tok, terr := client.ReadToken(server.AdminTokenPath(serverDir))
		if err == nil && terr == nil {
			if conn, err = client.Dial(grpcAddr, client.WithCA(ca), client.WithToken(tok)); err != nil {
				b.Fatal(err)
			}
		} else if srv.exited() || time.Since(start) > time.Minute {
			b.Fatalf("server wrote no CA and admin token: %v, %v\n%s", err, terr, srv.tail())
		}
	}
	b.Cleanup(func() { conn.Close() })
	tasks, models, modules := apiv1.NewTaskServiceClient(conn), apiv1.NewModelServiceClient(conn), apiv1.NewModuleServiceClient(conn)
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		if _, err := tasks.ListTasks(ctx, &pb.ListTasksRequest{}); err == nil {
			break
		} else if srv.exited() || time.Since(start) > time.Minute {
			b.Fatalf("server not ready: %v\n%s", err, srv.tail())
		}
	}
	sig, err := publisher.SignModule("noop", code)
	if err != nil {
		b.Fatal(err)
	}
	mod, err := client.RegisterModule(ctx, modules, &pb.RegisterModuleHeader{Name: "noop", SizeBytes: uint64(len(code)),
		Signature: []byte(sig)}, bytes.NewReader(code))
	if err != nil {
		b.Fatal(err)
	}
	var st bytes.Buffer
	if err := model.WriteSafetensors(&st, benchModel()); err != nil {
		b.Fatal(err)
	}
	mdl, err := client.ImportModel(ctx, models, &pb.ImportModelHeader{Name: "bench-100k", SizeBytes: uint64(st.Len())}, &st)
	if err != nil {
		b.Fatal(err)
	}

	edges := make([]*benchProc, devices)
	for i := range edges {
		ds := filepath.Join(dir, "data", strconv.Itoa(i))
		if err := data.WriteDir(ds, datatest.Synthetic(8, 4, 2, uint64(i+1)), "bench"); err != nil {
			b.Fatal(err)
		}
		id := fmt.Sprintf("dev-%03d", i)
		// Enrolled as an operator would: a single-use token, then the agent's
		// enroll command with the server's CA.
		tok, err := apiv1.NewDeviceServiceClient(conn).CreateEnrollmentToken(ctx, &pb.CreateEnrollmentTokenRequest{})
		if err != nil {
			b.Fatal(err)
		}
		if out, err := exec.Command(filepath.Join(bin, "fleetlearn-edge"), "enroll", "--api", grpcAddr, "--ca", server.CAFile(serverDir),
			"--token", tok.GetToken(), "--data-dir", filepath.Join(dir, "edge", strconv.Itoa(i)), "--device-id", id).CombinedOutput(); err != nil {
			b.Fatalf("enroll %s: %v\n%s", id, err, out)
		}
		edges[i] = startBenchProc(b, id, filepath.Join(dir, id+".log"), filepath.Join(bin, "fleetlearn-edge"),
			"--nats-url", "nats://"+natsAddr, "--data-dir", filepath.Join(dir, "edge", strconv.Itoa(i)),
			"--dataset", ds, "--device-id", id, "--log-level", "warn")
	}
	b.Cleanup(func() { stopBenchProcs(b, 30*time.Second, edges...) })

	task, err := tasks.CreateTask(ctx, &pb.CreateTaskRequest{Task: benchTask(mdl.GetRef().GetVersion(), mod.GetRef().GetSha256(), devices)})
	if err != nil {
		b.Fatal(err)
	}
	rounds := watchBenchRounds(b, tasks, task.GetTask().GetId())
	all := append([]*benchProc{srv}, edges...)
	if natsProc != nil {
		all = append(all, natsProc)
	}
	diag := func() string {
		for _, p := range all {
			if p.exited() {
				return fmt.Sprintf("%s exited (%v):\n%s", p.name, p.err, p.tail())
			}
		}
		return "all processes running; server log:\n" + srv.tail()
	}
	for range benchWarmup {
		nextBenchRound(b, rounds, 5*time.Minute, diag)
	}
	// Lifetime peaks include each agent's one-time module compilation; the
	// counters then restart so that the rounds' own peak shows too.
	warmHWM := make([]int64, len(all))
	warmCPU := make([]time.Duration, len(all))
	for i, p := range all {
		kb, err := benchHWM(p.pid())
		if err != nil {
			b.Fatalf("%s: %v (%s)", p.name, err, diag())
		}
		warmHWM[i] = kb
		warmCPU[i], _ = benchCPU(p.pid())
		os.WriteFile(filepath.Join("/proc", p.pid(), "clear_refs"), []byte("5"), 0)
	}

	var cpuProf <-chan []byte
	if pprofAddr != "" {
		cpuProf = benchCPUProfile(pprofAddr, cmp.Or(os.Getenv("FLEETLEARN_BENCH_CPU_SECONDS"), "30"))
	}
	var total time.Duration
	measured := 0
	for b.Loop() {
		r := nextBenchRound(b, rounds, 3*time.Minute, diag)
		if r.open.IsZero() {
			continue
		}
		if r.reported < devices {
			b.Fatalf("round %d committed with %d reports, want %d", r.round, r.reported, devices)
		}
		total += r.commit.Sub(r.open)
		measured++
	}
	b.StopTimer()
	if measured == 0 {
		b.Fatal("no round measured")
	}
	if cpuProf != nil {
		path := filepath.Join(profiles, "round-processes-server-cpu.pprof")
		if err := os.WriteFile(path, <-cpuProf, 0o644); err != nil {
			b.Fatal(err)
		}
		b.Logf("server CPU profile of the measured rounds' first %ss: %s", cmp.Or(os.Getenv("FLEETLEARN_BENCH_CPU_SECONDS"), "30"), path)
	}
	var life, hwm, pss, edgeMax, srvHWM, natsHWM int64
	var cpu, srvCPU, natsCPU time.Duration
	for i, p := range all {
		if c, err := benchCPU(p.pid()); err == nil {
			cpu += c - warmCPU[i]
			switch p {
			case srv:
				srvCPU = c - warmCPU[i]
			case natsProc:
				natsCPU = c - warmCPU[i]
			}
		}
		kb, err := benchHWM(p.pid())
		if err != nil {
			b.Fatalf("%s: %v (%s)", p.name, err, diag())
		}
		life += max(kb, warmHWM[i])
		hwm += kb
		switch p {
		case srv:
			srvHWM = kb
		case natsProc:
			natsHWM = kb
		default:
			edgeMax = max(edgeMax, kb)
		}
		if kb, err := benchPss(p.pid()); err == nil {
			pss += kb
		}
	}
	perRound := total.Seconds() / float64(measured)
	b.ReportMetric(perRound, "s/round")
	b.ReportMetric(float64(life)/1024, "MB-peak-rss-sum")
	b.ReportMetric(float64(hwm)/1024, "MB-rounds-rss-sum")
	b.ReportMetric(float64(pss)/1024, "MB-pss-sum")
	b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/round")
	b.ReportMetric(srvCPU.Seconds()/float64(b.N), "server-cpu-s/round")
	if natsProc != nil {
		b.ReportMetric(natsCPU.Seconds()/float64(b.N), "nats-cpu-s/round")
		b.Logf("nats-server apart: %.2f CPU-s/round, peak RSS %.0f MB", natsCPU.Seconds()/float64(b.N), float64(natsHWM)/1024)
	}
	b.Logf("%d edge processes + server, %d params, %d rounds: %.3f s/round, CPU %.2f s/round in all (server %.2f s); peak RSS summed over all processes %.0f MB "+
		"(over the measured rounds %.0f MB: server %.0f MB, edge mean %.1f MB, max %.1f MB); PSS at the end %.0f MB",
		devices, benchParams, measured, perRound, cpu.Seconds()/float64(b.N), srvCPU.Seconds()/float64(b.N), float64(life)/1024, float64(hwm)/1024, float64(srvHWM)/1024,
		float64(hwm-srvHWM-natsHWM)/1024/devices, float64(edgeMax)/1024, float64(pss)/1024)
}
