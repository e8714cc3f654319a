package server_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/simfleet"
	"github.com/fleetlearn/fleetlearn/model"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/internal/coord"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

const (
	scaleDevices = 10_000
	scaleCohort  = 1_000
)

// BenchmarkFleetScale measures the aggregator with a fleet ten times its
// cohort: the fleetlearn-server binary runs as a process of its own (as in
// BenchmarkRoundProcesses), 10,000 devices are enrolled through the API,
// and all of them run as simulated devices (internal/simfleet, in this
// process: the edge protocol code over NATS, one connection each, no
// module) against a task of 1,000 reports per round on the 100k-parameter
// model of BenchmarkRound. Every device checks in between rounds and when
// a round is announced; a selected one downloads the round's model and
// publishes a signed update report, over one of 1,000 upload connections
// (simfleet.Config.Uploads: a connection that has sent a report keeps a
// report-sized write buffer, which on 10,000 device connections would be 4
// GB of the devices' memory that real devices keep one each of). After two
// warm-up rounds, each measured round reports
//
//	s/round             OPENED to COMMITTED, by the server's events
//	s-select/round      OPENED to the last plan a device worked on
//	s-reports/round     OPENED to the last report JetStream stored
//	checkins/round      check-ins the fleet made, answered
//	overloaded/round    of those, the ones the server turned away with
//	                    OVERLOADED, its check-in queue full (by its
//	                    fleetlearn_checkins_total metric)
//	server-peak-MB      the server process's peak resident memory during a
//	                    round (VmHWM, restarted with clear_refs before it;
//	                    the largest over the measured rounds), its embedded
//	                    NATS server and JetStream included
//	server-cpu-s/round  the server's user+system CPU per round
//	devices-peak-MB     this process's peak resident memory over the
//	                    measured rounds: the 10,000 simulated devices (and
//	                    the benchmark around them)
//
// It runs only with FLEETLEARN_BENCH_SCALE=1:
//
//	FLEETLEARN_BENCH_SCALE=1 go test -run '^$' -bench 'BenchmarkFleetScale$' -benchtime 5x -timeout 30m ./server/
//
// The server keeps its default pace window (2 s) unless
// FLEETLEARN_BENCH_PACE sets one: with the round benchmarks' 20 ms, the
// 9,000 devices left out of a round would check in again every 200 ms or
// so. FLEETLEARN_BENCH_CONNS sets how many NATS connections the devices
// share (default: one each, as a real fleet holds), and
// FLEETLEARN_BENCH_UPLOADS how many carry their reports (default 1,000; 0
// for the devices' own). FLEETLEARN_BENCH_DEVICES enrolls and runs another
// number of devices (1,100 to 100,000), for the cost of the registered
// devices that are not selected.
// FLEETLEARN_BENCH_SHARD=N starts the server with --shard-aggregation and
// N aggregation workers of its own, and reports worker-reads/round (the
// reports a worker read, checked and summed; the rest the leader read).
// FLEETLEARN_BENCH_SHARD_APART=N runs N aggregation workers in the
// benchmark's process instead, so that server-cpu-s/round is the leader's
// alone. FLEETLEARN_BENCH_NATS=external runs nats-server as its own process
// (as BenchmarkLargeModelRound does) and reports its CPU as
// nats-cpu-s/round.
// FLEETLEARN_BENCH_ASYNC=K runs the task in async mode instead: 1,000
// devices training at once (the concurrency), a version every K reports;
// each "round" is then a buffer of K reports, and reports-s/1k-reports and
// server-cpu-s/1k-reports put both modes on the same scale.
// FLEETLEARN_BENCH_PPROF=DIR builds the server with net/http/pprof and keeps
// in DIR its heap profile at its largest heap in use over the measured
// rounds, and a CPU profile of their first FLEETLEARN_BENCH_CPU_SECONDS
// seconds (default 20); the heap profile is polled every half second, which
// costs the server CPU of its own (about 7% of it), so figures to compare
// come from runs without it.
func BenchmarkFleetScale(b *testing.B) {
	if os.Getenv("FLEETLEARN_BENCH_SCALE") != "1" {
		b.Skip("set FLEETLEARN_BENCH_SCALE=1 to enroll and run 10,000 simulated devices and a server")
	}
	if testing.Short() {
		b.Skip("enrolls and runs 10,000 simulated devices")
	}
	devices := scaleEnvInt(b, "FLEETLEARN_BENCH_DEVICES", scaleDevices, scaleCohort+scaleCohort/10, 100_000)
	conns := scaleEnvInt(b, "FLEETLEARN_BENCH_CONNS", devices, 1, devices)
	uploads := scaleEnvInt(b, "FLEETLEARN_BENCH_UPLOADS", scaleCohort, 0, devices)
	ctx := context.Background()
	dir := b.TempDir()
	bin := filepath.Join(dir, "bin")
	args := []string{"build", "-o", bin + string(filepath.Separator)}
	profiles := os.Getenv("FLEETLEARN_BENCH_PPROF")
	pprofAddr := ""
	if profiles != "" {
		args = append(args, "-overlay", benchPprofOverlay(b, dir))
		pprofAddr = benchAddr(b)
		b.Setenv("FLEETLEARN_BENCH_PPROF_ADDR", pprofAddr)
	}
	if out, err := exec.Command(benchGoTool(), append(args, "github.com/fleetlearn/fleetlearn/cmd/fleetlearn-server")...).CombinedOutput(); err != nil {
		b.Fatalf("build: %v\n%s", err, out)
	}
	publisher, jwks := servertest.NewPublisher(b)
	jwksPath := filepath.Join(dir, "publishers.jwks")
	if err := os.WriteFile(jwksPath, jwks, 0o600); err != nil {
		b.Fatal(err)
	}
	natsAddr, grpcAddr, metricsAddr, serverDir := benchAddr(b), benchAddr(b), benchAddr(b), filepath.Join(dir, "server")
	serverArgs := []string{"--data-dir", serverDir, "--grpc-addr", grpcAddr, "--metrics-addr", metricsAddr,
		"--pace-window", largePace(b).String(), "--log-level", "warn", "--module-publishers", jwksPath}
	var natsProc *benchProc
	if os.Getenv("FLEETLEARN_BENCH_NATS") == "external" {
		natsProc = startBenchNATS(b, bin, dir, serverDir, natsAddr, server.DefaultReportStoreBytes+1<<30)
		serverArgs = append(serverArgs, "--nats-url", "nats://"+natsAddr)
	} else {
		serverArgs = append(serverArgs, "--nats-listen", natsAddr)
	}
	shard := scaleEnvInt(b, "FLEETLEARN_BENCH_SHARD", 0, 0, 64)
	apart := scaleEnvInt(b, "FLEETLEARN_BENCH_SHARD_APART", 0, 0, 64)
	if shard > 0 || apart > 0 {
		serverArgs = append(serverArgs, "--shard-aggregation", "--aggregation-workers", strconv.Itoa(shard))
	}
	srv := startBenchProc(b, "fleetlearn-server", filepath.Join(dir, "server.log"), filepath.Join(bin, "fleetlearn-server"), serverArgs...)
	b.Cleanup(func() { stopBenchProcs(b, 60*time.Second, srv) })
	diag := func() string {
		if srv.exited() {
			return fmt.Sprintf("server exited (%v):\n%s", srv.err, srv.tail())
		}
		return "server running; its log:\n" + srv.tail()
	}
	conn := dialBenchServer(b, srv, serverDir, grpcAddr)
	tasks, models, modules := apiv1.NewTaskServiceClient(conn), apiv1.NewModelServiceClient(conn), apiv1.NewModuleServiceClient(conn)

	// Simulated devices run no module; the task needs one all the same.
	code := wasmtest.Trivial()
	sig, err := publisher.SignModule("trivial", code)
	if err != nil {
		b.Fatal(err)
	}
	mod, err := client.RegisterModule(ctx, modules, &pb.RegisterModuleHeader{Name: "trivial", SizeBytes: uint64(len(code)),
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

	if apart > 0 {
		// Workers in this process, on a service connection of their own:
		// the server's CPU is then the leader's alone (and its NATS's).
		nc, err := nats.Connect("nats://"+natsAddr, benchServiceNATS(b, serverDir)...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
		w, err := coord.StartShardWorkers(nc, apart, slog.New(slog.DiscardHandler))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(w.Stop)
	}

	delta := make([]float32, benchParams)
	for i := range delta {
		delta[i] = 1e-3
	}
	lg := simfleet.Config{NATSURL: "nats://" + natsAddr, NATSOptions: benchServiceNATS(b, serverDir), Devices: devices,
		Conns: conns, Uploads: uploads, Layout: []*pb.TensorSpec{{Name: "fc1.weight", Shape: []uint64{10, benchParams / 10}}}, Delta: delta,
		FetchModel: true}
	start := time.Now()
	lg.Keys = benchEnrollMany(b, conn, lg.DeviceIDs(), 2*runtime.GOMAXPROCS(0))
	b.Logf("enrolled %d devices in %v", devices, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	fleet, err := simfleet.Start(lg)
	if err != nil {
		b.Fatalf("%v (%s)", err, diag())
	}
	b.Cleanup(fleet.Stop)
	b.Logf("connected %d devices over %d NATS connections and %d upload connections in %v", devices, conns, uploads,
		time.Since(start).Round(time.Millisecond))
	fleetDiag := func() string {
		return fmt.Sprintf("fleet %+v, last failure %q; %s", fleet.Stats(), fleet.LastFailure(), diag())
	}

	spec := benchTask(mdl.GetRef().GetVersion(), mod.GetRef().GetSha256(), scaleCohort)
	spec.SelectionTimeout = durationpb.New(5 * time.Minute)
	perRound := scaleCohort // the reports a round takes
	if os.Getenv("FLEETLEARN_BENCH_ASYNC") != "" {
		perRound = scaleEnvInt(b, "FLEETLEARN_BENCH_ASYNC", 0, 1, scaleCohort)
		spec.Async = &pb.AsyncConfig{Concurrency: scaleCohort, Buffer: uint32(perRound), MaxStaleness: 1000}
	}
	task, err := tasks.CreateTask(ctx, &pb.CreateTaskRequest{Task: spec})
	if err != nil {
		b.Fatal(err)
	}
	rounds := watchBenchRounds(b, tasks, task.GetTask().GetId())
	for range benchWarmup {
		nextBenchRound(b, rounds, 10*time.Minute, fleetDiag)
	}
	runtime.GC()
	resetBenchRSS()

	pid := srv.pid()
	var cpuProf <-chan []byte
	cpuSecs := os.Getenv("FLEETLEARN_BENCH_CPU_SECONDS")
	if cpuSecs == "" {
		cpuSecs = "20"
	}
	if pprofAddr != "" {
		cpuProf = benchCPUProfile(pprofAddr, cpuSecs)
	}
	checkIns0 := fleet.Stats().CheckIns
	outcomes0 := scaleCheckIns(b, metricsAddr)
	readers0 := scaleCounters(b, metricsAddr, `fleetlearn_shard_reports_total{reader="`)
	var total, sel, rep, cpu, natsTotal time.Duration
	var peak int64
	var heap *heapWatch
	measured := 0
	for b.Loop() {
		// The next round opened as the last committed: the counters
		// restart as early as the event lets them.
		if err := os.WriteFile(filepath.Join("/proc", pid, "clear_refs"), []byte("5"), 0); err != nil {
			b.Fatalf("restart the server's peak RSS: %v", err)
		}
		c0, err := benchCPU(pid)
		if err != nil {
			b.Fatalf("server CPU: %v (%s)", err, diag())
		}
		var n0 time.Duration
		if natsProc != nil {
			if n0, err = benchCPU(natsProc.pid()); err != nil {
				b.Fatalf("nats-server CPU: %v", err)
			}
		}
		var w *heapWatch
		if pprofAddr != "" {
			w = watchHeap(pprofAddr)
		}
		r := nextBenchRound(b, rounds, 10*time.Minute, fleetDiag)
		if w != nil {
			if w.finish(); heap == nil || w.max > heap.max {
				heap = w
			}
		}
		kb, err := benchHWM(pid)
		if err != nil {
			b.Fatalf("server peak RSS: %v (%s)", err, diag())
		}
		c1, err := benchCPU(pid)
		if err != nil {
			b.Fatalf("server CPU: %v (%s)", err, diag())
		}
		if natsProc != nil {
			n1, err := benchCPU(natsProc.pid())
			if err != nil {
				b.Fatalf("nats-server CPU: %v", err)
			}
			natsTotal += n1 - n0
		}
		if int(r.reported) < perRound {
			b.Fatalf("round %d committed with %d reports, want %d", r.round, r.reported, perRound)
		}
		if r.open.IsZero() {
			b.Fatalf("round %d: its OPENED event was missed", r.round)
		}
		peak = max(peak, kb)
		cpu += c1 - c0
		total += r.commit.Sub(r.open)
		measured++
		if spec.Async != nil {
			continue // a buffer's reports come from plans of earlier rounds
		}
		tr, ok := fleet.Trace(task.GetTask().GetId(), r.round)
		if !ok {
			b.Fatalf("round %d: the fleet saw no plan", r.round)
		}
		sel += tr.LastPlan.Sub(r.open)
		rep += tr.LastReport.Sub(r.open)
	}
	b.StopTimer()
	outcomes := scaleCheckIns(b, metricsAddr)
	fs := fleet.Stats()
	if fs.Refused > 0 || fs.Failures > 0 {
		b.Fatalf("fleet %+v: %s", fs, fleet.LastFailure())
	}
	k := float64(measured)
	b.ReportMetric(total.Seconds()/k, "s/round")
	reports := k * float64(perRound) / 1000
	b.ReportMetric(total.Seconds()/reports, "s/1k-reports")
	b.ReportMetric(cpu.Seconds()/reports, "server-cpu-s/1k-reports")
	b.ReportMetric(sel.Seconds()/k, "s-select/round")
	b.ReportMetric(rep.Seconds()/k, "s-reports/round")
	b.ReportMetric(float64(fs.CheckIns-checkIns0)/k, "checkins/round")
	b.ReportMetric((outcomes["overloaded"]-outcomes0["overloaded"])/k, "overloaded/round")
	if readers := scaleCounters(b, metricsAddr, `fleetlearn_shard_reports_total{reader="`); len(readers) > 0 {
		b.ReportMetric((readers["worker"]-readers0["worker"])/k, "worker-reads/round")
	}
	b.ReportMetric(float64(peak)*1024/1e6, "server-peak-MB")
	b.ReportMetric(cpu.Seconds()/k, "server-cpu-s/round")
	if natsProc != nil {
		b.ReportMetric(natsTotal.Seconds()/k, "nats-cpu-s/round")
	}
	devKB, err := benchHWM("self")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(devKB)*1024/1e6, "devices-peak-MB")

	if cpuProf != nil {
		path := filepath.Join(profiles, "fleet-scale-server-cpu.pprof")
		if err := os.MkdirAll(profiles, 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(path, <-cpuProf, 0o644); err != nil {
			b.Fatal(err)
		}
		b.Logf("server CPU profile of the measured rounds' first %ss: %s", cpuSecs, path)
	}
	if heap != nil && heap.best != nil {
		path := filepath.Join(profiles, "fleet-scale-server-heap.pprof")
		if err := os.MkdirAll(profiles, 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(path, heap.best, 0o644); err != nil {
			b.Fatal(err)
		}
		b.Logf("server heap profile at its largest heap in use (%.0f MB): %s", float64(heap.max)/1e6, path)
	}
	if profiles != "" {
		runtime.GC()
		path := filepath.Join(profiles, "fleet-scale-devices-heap.pprof")
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.WriteHeapProfile(f); err != nil {
			b.Fatal(err)
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
		b.Logf("devices' heap profile after the measured rounds: %s", path)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.Logf("devices' process: %d goroutines, heap in use %.0f MB, stacks %.0f MB, runtime total %.0f MB",
		runtime.NumGoroutine(), float64(ms.HeapInuse)/1e6, float64(ms.StackInuse)/1e6, float64(ms.Sys)/1e6)
	var byOutcome []string
	for o, n := range outcomes {
		byOutcome = append(byOutcome, fmt.Sprintf("%s %.0f", o, (n-outcomes0[o])/k))
	}
	slices.Sort(byOutcome)
	b.Logf("server's check-ins per round, by outcome: %s", strings.Join(byOutcome, ", "))
	rss, _ := benchProcStatus(pid, "status", "VmRSS:")
	devRSS, _ := benchProcStatus("self", "status", "VmRSS:")
	b.Logf("%d devices, %d per round, %d rounds measured: %.2f s/round (selection %.2f s), %.0f check-ins/round; "+
		"server peak %.0f MB (%.0f MB at the end), %.2f CPU-s/round; devices peak %.0f MB (%.0f MB at the end); fleet %+v",
		devices, scaleCohort, measured, total.Seconds()/k, sel.Seconds()/k, float64(fs.CheckIns-checkIns0)/k,
		float64(peak)*1024/1e6, float64(rss)*1024/1e6, cpu.Seconds()/k, float64(devKB)*1024/1e6, float64(devRSS)*1024/1e6, fs)
}

// scaleEnvInt reads a count from the environment variable name: def when
// it is unset, otherwise least to most.
func scaleEnvInt(b *testing.B, name string, def, least, most int) int {
	b.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < least || n > most {
		b.Fatalf("%s=%q: want %d to %d", name, s, least, most)
	}
	return n
}

// scaleCheckIns reads the server's check-in counts by outcome from its
// metrics endpoint.
func scaleCheckIns(b *testing.B, addr string) map[string]float64 {
	return scaleCounters(b, addr, `fleetlearn_checkins_total{outcome="`)
}

// scaleCounters reads the series of a counter whose one label's value
// follows prefix on the server's /metrics, by that value.
func scaleCounters(b *testing.B, addr, prefix string) map[string]float64 {
	b.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		b.Fatalf("server metrics: %v", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), prefix)
		if !ok {
			continue
		}
		outcome, num, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		n, err := strconv.ParseFloat(num, 64)
		if err != nil {
			b.Fatalf("server metrics: %q: %v", sc.Text(), err)
		}
		out[outcome] = n
	}
	if err := sc.Err(); err != nil {
		b.Fatalf("server metrics: %v", err)
	}
	return out
}

// dialBenchServer waits for a server process to write its CA and admin
// token and to answer the API, and returns a connection to it.
func dialBenchServer(b *testing.B, srv *benchProc, serverDir, grpcAddr string) *grpc.ClientConn {
	b.Helper()
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
	tasks := apiv1.NewTaskServiceClient(conn)
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		if _, err := tasks.ListTasks(context.Background(), &pb.ListTasksRequest{}); err == nil {
			return conn
		} else if srv.exited() || time.Since(start) > time.Minute {
			b.Fatalf("server not ready: %v\n%s", err, srv.tail())
		}
	}
}

// benchEnrollMany enrolls ids as benchEnroll does, workers at a time.
func benchEnrollMany(b *testing.B, conn *grpc.ClientConn, ids []string, workers int) map[string]ed25519.PrivateKey {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	devices, enroll := apiv1.NewDeviceServiceClient(conn), apiv1.NewEnrollmentServiceClient(conn)
	keys := make([]ed25519.PrivateKey, len(ids))
	next := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []string
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				key, err := identity.GenerateUserKey()
				if err == nil {
					var tok *pb.CreateEnrollmentTokenResponse
					if tok, err = devices.CreateEnrollmentToken(ctx, &pb.CreateEnrollmentTokenRequest{}); err == nil {
						_, err = enroll.Enroll(ctx, &pb.EnrollRequest{Token: tok.GetToken(), KeyId: key.ID(), DeviceId: ids[i]})
					}
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Sprintf("enroll %s: %v", ids[i], err))
					mu.Unlock()
					cancel()
					continue
				}
				keys[i] = key.PrivateKey()
			}
		}()
	}
	for i := range ids {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		b.Fatal(strings.Join(errs[:min(len(errs), 5)], "\n"))
	}
	out := make(map[string]ed25519.PrivateKey, len(ids))
	for i, id := range ids {
		out[id] = keys[i]
	}
	return out
}
