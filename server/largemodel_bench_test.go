package server_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/aggregator/quant"
	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/simfleet"
	"github.com/fleetlearn/fleetlearn/model"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
	"github.com/fleetlearn/fleetlearn/wasm/wasmtest"
)

// BenchmarkLargeModelRound measures what one round of a large model costs
// the aggregator: the fleetlearn-server binary runs as a process of its own
// (as in BenchmarkRoundProcesses), and simulated devices (internal/simfleet,
// in this process: the edge protocol code over NATS, no module) download
// every round's model and publish signed, chunked reports of the same
// update to JetStream. Rows: models of 50 and 400 MB (12.5M and 100M
// float32 parameters in four Linear-like tensors), updates sent as float32
// or int8 (the task's update_encoding), cohorts of 10 and 100 devices.
// After one warm-up round, each measured round reports
//
//	model-MB                    the model's float32 bytes / 1e6
//	cohort                      devices that report in each round
//	server-peak-MB              the server process's peak resident memory
//	                            during the round (VmHWM, restarted with
//	                            clear_refs before it; the largest over the
//	                            measured rounds)
//	server-cpu-s                the server's user+system CPU per round
//	s/round                     OPENED to COMMITTED, by the server's events
//	server-peak-MB-over-budget  server-peak-MB less the goal 300 + 3×model-MB
//	                            (positive: over it)
//	bench-peak-MB               this process's peak (the devices)
//	nats-peak-MB, nats-cpu-s    with FLEETLEARN_BENCH_NATS=external: the same
//	                            for the nats-server process
//
// By default the server runs its embedded NATS server, whose memory is then
// the server's. FLEETLEARN_BENCH_NATS=external runs nats-server (built from
// the module version go.mod names) as its own process, configured as an
// operator would (the fragment --write-nats-config writes), and the server
// with --nats-url: server-peak-MB is then the aggregator's alone.
//
// It moves tens of GB through JetStream and the disk, so it runs only with
// FLEETLEARN_BENCH_LARGE=1, one round measured per row:
//
//	FLEETLEARN_BENCH_LARGE=1 go test -run '^$' -bench 'BenchmarkLargeModelRound/model=50MB' -benchtime 1x -timeout 60m ./server/
//
// Every report of a round stays in the reports stream until the round
// commits, so a round needs cohort × report size of JetStream storage: a row
// needing more than the stream's default limit (8 GiB) raises it with
// --report-store-bytes, and one needing more than the free disk allows
// JetStream is skipped with the figures. FLEETLEARN_BENCH_PUBLISHING (default
// 4) is how many devices build and publish a report at once (each holds a
// marshaled copy of it); FLEETLEARN_BENCH_SERVER_ENV adds space-separated
// NAME=value pairs to the server's environment (GODEBUG=gctrace=1, say).
// FLEETLEARN_BENCH_PPROF=DIR builds the server with net/http/pprof and keeps
// in DIR each row's heap profile at its largest heap in use, and with
// FLEETLEARN_BENCH_CPU_SECONDS=N a CPU profile of the first measured round's
// first N seconds.
func BenchmarkLargeModelRound(b *testing.B) {
	if os.Getenv("FLEETLEARN_BENCH_LARGE") != "1" {
		b.Skip("set FLEETLEARN_BENCH_LARGE=1 to move tens of GB of models and reports")
	}
	if testing.Short() {
		b.Skip("moves tens of GB of models and reports")
	}
	tmp := b.TempDir()
	bin := filepath.Join(tmp, "bin")
	args := []string{"build", "-o", bin + string(filepath.Separator)}
	profiles := os.Getenv("FLEETLEARN_BENCH_PPROF")
	if profiles != "" {
		args = append(args, "-overlay", benchPprofOverlay(b, tmp))
	}
	cmd := exec.Command(benchGoTool(), append(args, "github.com/fleetlearn/fleetlearn/cmd/fleetlearn-server")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build: %v\n%s", err, out)
	}
	for _, mb := range []int{50, 400} {
		for _, enc := range []struct {
			name string
			enc  pb.UpdateEncoding
		}{{"float32", pb.UpdateEncoding_UPDATE_ENCODING_UNSPECIFIED}, {"int8", pb.UpdateEncoding_UPDATE_ENCODING_INT8}} {
			for _, cohort := range []int{10, 100} {
				b.Run(fmt.Sprintf("model=%dMB/enc=%s/cohort=%d", mb, enc.name, cohort), func(b *testing.B) {
					benchLargeModelRound(b, filepath.Join(bin, "fleetlearn-server"), profiles, mb*1_000_000/4, enc.enc, cohort)
				})
			}
		}
	}
}

// largeLayout cuts params (a multiple of 4) into four square-ish weights.
func largeLayout(params int) []*pb.TensorSpec {
	per := params / 4
	rows := 1
	for r := 2; r*r <= per; r++ {
		if per%r == 0 {
			rows = r
		}
	}
	out := make([]*pb.TensorSpec, 4)
	for i := range out {
		out[i] = &pb.TensorSpec{Name: fmt.Sprintf("fc%d.weight", i+1), Shape: []uint64{uint64(per / rows), uint64(rows)}}
	}
	return out
}

// writeLargeModel writes the base model as safetensors to path, filled as
// benchModel is.
func writeLargeModel(tb testing.TB, path string, layout []*pb.TensorSpec) int64 {
	tb.Helper()
	tensors := make([]model.Tensor, len(layout))
	for i, s := range layout {
		n := int(s.Shape[0] * s.Shape[1])
		w := make([]float32, n)
		for j := range w {
			w[j] = float32(j%97) / 97
		}
		tensors[i] = model.Tensor{Name: s.Name, Shape: []int{int(s.Shape[0]), int(s.Shape[1])}, Data: w}
	}
	m, err := model.New(tensors...)
	if err != nil {
		tb.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	if err := model.WriteSafetensors(w, m); err != nil {
		tb.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		tb.Fatal(err)
	}
	st, err := f.Stat()
	if err != nil {
		tb.Fatal(err)
	}
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
	return st.Size()
}

func benchPublishing(tb testing.TB) int {
	s := os.Getenv("FLEETLEARN_BENCH_PUBLISHING")
	if s == "" {
		return 4
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		tb.Fatalf("FLEETLEARN_BENCH_PUBLISHING=%q: want a positive number of devices", s)
	}
	return n
}

// benchServiceNATS authenticates as the aggregator's service user of the
// server whose data directory is dataDir, which may act for every device,
// as servertest's harness lets in-process fleets do.
func benchServiceNATS(tb testing.TB, dataDir string) []nats.Option {
	tb.Helper()
	dir := filepath.Join(dataDir, server.NATSAuthDir)
	if !benchFileExists(filepath.Join(dir, "service-user.nk")) {
		tb.Fatalf("the server wrote no NATS service key in %s", dir)
	}
	auth, err := identity.LoadOrCreateAuthority("fleetlearn", dir)
	if err != nil {
		tb.Fatal(err)
	}
	key, err := identity.LoadOrCreateUserKey(filepath.Join(dir, "service-user.nk"))
	if err != nil {
		tb.Fatal(err)
	}
	jwt, err := auth.ServiceUserJWT("bench-simfleet", key.ID(), time.Time{})
	if err != nil {
		tb.Fatal(err)
	}
	return []nats.Option{nats.UserJWT(func() (string, error) { return jwt, nil }, key.Sign)}
}

// benchEnroll enrolls ids through the API with fresh keys, as
// servertest.Harness.EnrollKeys does, so that their reports verify.
func benchEnroll(tb testing.TB, conn *grpc.ClientConn, ids []string) map[string]ed25519.PrivateKey {
	tb.Helper()
	ctx := context.Background()
	devices, enroll := apiv1.NewDeviceServiceClient(conn), apiv1.NewEnrollmentServiceClient(conn)
	out := make(map[string]ed25519.PrivateKey, len(ids))
	for _, id := range ids {
		key, err := identity.GenerateUserKey()
		if err != nil {
			tb.Fatal(err)
		}
		tok, err := devices.CreateEnrollmentToken(ctx, &pb.CreateEnrollmentTokenRequest{})
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := enroll.Enroll(ctx, &pb.EnrollRequest{Token: tok.GetToken(), KeyId: key.ID(), DeviceId: id}); err != nil {
			tb.Fatalf("enroll %s: %v", id, err)
		}
		out[id] = key.PrivateKey()
	}
	return out
}

// benchPprofOverlay writes a build overlay that adds net/http/pprof to the
// server's main package, on the address in $FLEETLEARN_BENCH_PPROF_ADDR,
// without changing its sources; it returns the overlay file.
func benchPprofOverlay(tb testing.TB, dir string) string {
	tb.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		tb.Fatal(err)
	}
	src := filepath.Join(dir, "pprof.go")
	code := `package main

import (
	"net/http"
	_ "net/http/pprof"
	"os"
)

func init() {
	if addr := os.Getenv("FLEETLEARN_BENCH_PPROF_ADDR"); addr != "" {
		go http.ListenAndServe(addr, nil)
	}
}
`
	if err := os.WriteFile(src, []byte(code), 0o600); err != nil {
		tb.Fatal(err)
	}
	overlay := filepath.Join(dir, "overlay.json")
	js := fmt.Sprintf(`{"Replace": {%q: %q}}`, filepath.Join(root, "cmd", "fleetlearn-server", "zz_bench_pprof.go"), src)
	if err := os.WriteFile(overlay, []byte(js), 0o600); err != nil {
		tb.Fatal(err)
	}
	return overlay
}

// benchCPUProfile takes a CPU profile of secs seconds from the pprof
// server at addr; the channel gets it (empty if it could not be had).
func benchCPUProfile(addr, secs string) <-chan []byte {
	out := make(chan []byte, 1)
	go func() {
		var body []byte
		if resp, err := http.Get("http://" + addr + "/debug/pprof/profile?seconds=" + secs); err == nil {
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		out <- body
	}()
	return out
}

// heapWatch polls a server's heap profile while a round runs and keeps the
// one taken when its heap in use was largest.
type heapWatch struct {
	stop chan struct{}
	done chan struct{}
	best []byte
	max  int64 // HeapInuse of best, bytes
}

func watchHeap(addr string) *heapWatch {
	w := &heapWatch{stop: make(chan struct{}), done: make(chan struct{})}
	get := func(q string) []byte {
		resp, err := http.Get("http://" + addr + "/debug/pprof/heap" + q)
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return body
	}
	go func() {
		defer close(w.done)
		for {
			// debug=1 ends with the runtime's MemStats; HeapInuse is what
			// the profile's inuse_space samples.
			text := string(get("?debug=1"))
			if _, rest, ok := strings.Cut(text, "# HeapInuse = "); ok {
				num, _, _ := strings.Cut(rest, "\n")
				if n, err := strconv.ParseInt(num, 10, 64); err == nil && n > w.max {
					if p := get(""); p != nil {
						w.best, w.max = p, n
					}
				}
			}
			select {
			case <-w.stop:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *heapWatch) finish() { close(w.stop); <-w.done }

func benchLargeModelRound(b *testing.B, bin, profiles string, params int, enc pb.UpdateEncoding, cohort int) {
	ctx := context.Background()
	dir := b.TempDir()
	layout := largeLayout(params)
	modelMB := float64(4*params) / 1e6

	// The update: small (its norm stays far below the default bound, the
	// base model's norm) and varied, so that int8 codes differ.
	delta := make([]float32, params)
	for i := range delta {
		delta[i] = 1e-4 * float32(i%13-6) / 6
	}
	var quantized []byte
	reportBytes := uint64(4 * params)
	if enc != pb.UpdateEncoding_UPDATE_ENCODING_UNSPECIFIED {
		var err error
		if quantized, _, err = quant.Encode(delta, 8, quant.DefaultBlock, rand.NewPCG(1, 2)); err != nil {
			b.Fatal(err)
		}
		delta, reportBytes = nil, uint64(len(quantized))
	}
	// A round keeps every report, chunk framing included, until it commits.
	need := uint64(cohort) * (reportBytes + reportBytes/256 + 2<<20)
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		b.Fatal(err)
	}
	free := fs.Bavail * uint64(fs.Bsize)
	// JetStream takes three quarters of the free disk; the model blobs (one
	// version a round) need room beside the reports.
	if jsMax := free / 4 * 3; need+uint64(8*4*params) > jsMax {
		b.Skipf("a round of %d reports of %.0f MB needs %.1f GB of JetStream storage besides the model versions; %.1f GB free on disk gives JetStream %.1f GB",
			cohort, float64(reportBytes)/1e6, float64(need)/1e9, float64(free)/1e9, float64(jsMax)/1e9)
	}
	storeArgs := []string{}
	if need > server.DefaultReportStoreBytes {
		storeArgs = append(storeArgs, "--report-store-bytes", strconv.FormatUint(need+need/8, 10))
		b.Logf("reports stream raised to %d bytes: a round stores %.1f GB", need+need/8, float64(need)/1e9)
	}

	stPath := filepath.Join(dir, "model.safetensors")
	stSize := writeLargeModel(b, stPath, layout)
	runtime.GC()

	if env := os.Getenv("FLEETLEARN_BENCH_SERVER_ENV"); env != "" {
		for _, kv := range strings.Fields(env) {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				b.Fatalf("FLEETLEARN_BENCH_SERVER_ENV: %q is not NAME=value", kv)
			}
			b.Setenv(k, v)
		}
	}
	publisher, jwks := servertest.NewPublisher(b)
	jwksPath := filepath.Join(dir, "publishers.jwks")
	if err := os.WriteFile(jwksPath, jwks, 0o600); err != nil {
		b.Fatal(err)
	}
	natsAddr, grpcAddr, serverDir := benchAddr(b), benchAddr(b), filepath.Join(dir, "server")
	pprofAddr := ""
	if profiles != "" {
		pprofAddr = benchAddr(b)
		b.Setenv("FLEETLEARN_BENCH_PPROF_ADDR", pprofAddr)
	}
	natsArgs := []string{"--nats-listen", natsAddr}
	var natsProc *benchProc
	if os.Getenv("FLEETLEARN_BENCH_NATS") == "external" {
		// Room for the reports stream (at least its default size) and
		// the model versions.
		natsProc = startBenchNATS(b, filepath.Dir(bin), dir, serverDir, natsAddr,
			max(need+need/8, server.DefaultReportStoreBytes)+uint64(8*4*params)+1<<30)
		natsArgs = []string{"--nats-url", "nats://" + natsAddr}
	}
	srv := startBenchProc(b, "fleetlearn-server", filepath.Join(dir, "server.log"), bin,
		append(append([]string{"--data-dir", serverDir, "--grpc-addr", grpcAddr,
			"--metrics-addr", "off", "--pace-window", largePace(b).String(), "--log-level", "warn", "--module-publishers", jwksPath},
			natsArgs...), storeArgs...)...)
	b.Cleanup(func() { stopBenchProcs(b, 60*time.Second, srv) })
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
	diag := func() string {
		if srv.exited() {
			return fmt.Sprintf("server exited (%v):\n%s", srv.err, srv.tail())
		}
		return "server running; its log:\n" + srv.tail()
	}

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
	f, err := os.Open(stPath)
	if err != nil {
		b.Fatal(err)
	}
	mdl, err := client.ImportModel(ctx, models, &pb.ImportModelHeader{Name: "large", SizeBytes: uint64(stSize)}, bufio.NewReaderSize(f, 1<<20))
	f.Close()
	if err != nil {
		b.Fatalf("import %d-byte model: %v (%s)", stSize, err, diag())
	}
	os.Remove(stPath)

	lg := simfleet.Config{NATSURL: "nats://" + natsAddr, NATSOptions: benchServiceNATS(b, serverDir), Devices: cohort,
		Layout: layout, Delta: delta, Encoding: enc, Quantized: quantized, FetchModel: true, MaxPublishing: benchPublishing(b)}
	lg.Keys = benchEnroll(b, conn, lg.DeviceIDs())
	fleet, err := simfleet.Start(lg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(fleet.Stop)
	fleetDiag := func() string {
		return fmt.Sprintf("fleet %+v, last failure %q; %s", fleet.Stats(), fleet.LastFailure(), diag())
	}

	task, err := tasks.CreateTask(ctx, &pb.CreateTaskRequest{Task: &pb.Task{Name: "large", Model: &pb.ModelRef{Version: mdl.GetRef().GetVersion()},
		Module: &pb.ModuleRef{Sha256: mod.GetRef().GetSha256()}, CohortTarget: uint32(cohort), ReportGoal: uint32(cohort),
		OverSelection: 0.01, RoundsTotal: 1 << 20, UpdateEncoding: enc,
		SelectionTimeout: durationpb.New(5 * time.Minute), ReportTimeout: durationpb.New(30 * time.Minute)}})
	if err != nil {
		b.Fatal(err)
	}
	rounds := watchBenchRounds(b, tasks, task.GetTask().GetId())
	nextBenchRound(b, rounds, 30*time.Minute, fleetDiag) // warm-up: connections, first download
	runtime.GC()
	resetBenchRSS()

	pid := srv.pid()
	var total, sel, rep, cpu, natsCPU time.Duration
	var peak, natsPeak int64
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
			os.WriteFile(filepath.Join("/proc", natsProc.pid(), "clear_refs"), []byte("5"), 0)
			n0, _ = benchCPU(natsProc.pid())
		}
		var w *heapWatch
		var cpuProf <-chan []byte
		if pprofAddr != "" {
			w = watchHeap(pprofAddr)
			if secs := os.Getenv("FLEETLEARN_BENCH_CPU_SECONDS"); secs != "" && measured == 0 {
				cpuProf = benchCPUProfile(pprofAddr, secs)
			}
		}
		r := nextBenchRound(b, rounds, 30*time.Minute, fleetDiag)
		if w != nil {
			if w.finish(); heap == nil || w.max > heap.max {
				heap = w
			}
		}
		kb, err := benchHWM(pid)
		if err != nil {
			b.Fatalf("server peak RSS: %v (%s)", err, diag())
		}
		if cpuProf != nil {
			name := strings.NewReplacer("/", "_", "=", "-").Replace(strings.TrimPrefix(b.Name(), "BenchmarkLargeModelRound/"))
			path := filepath.Join(profiles, name+".cpu.pb.gz")
			if err := os.MkdirAll(profiles, 0o755); err == nil && os.WriteFile(path, <-cpuProf, 0o644) == nil {
				b.Logf("server CPU profile of the first measured round's first %ss: %s", os.Getenv("FLEETLEARN_BENCH_CPU_SECONDS"), path)
			}
		}
		c1, err := benchCPU(pid)
		if err != nil {
			b.Fatalf("server CPU: %v (%s)", err, diag())
		}
		if int(r.reported) < cohort {
			b.Fatalf("round %d committed with %d reports, want %d", r.round, r.reported, cohort)
		}
		peak = max(peak, kb)
		cpu += c1 - c0
		if natsProc != nil {
			nkb, _ := benchHWM(natsProc.pid())
			n1, _ := benchCPU(natsProc.pid())
			natsPeak, natsCPU = max(natsPeak, nkb), natsCPU+n1-n0
		}
		if r.open.IsZero() {
			b.Fatalf("round %d: its OPENED event was missed", r.round)
		}
		tr, ok := fleet.Trace(task.GetTask().GetId(), r.round)
		if !ok {
			b.Fatalf("round %d: the fleet saw no plan", r.round)
		}
		total += r.commit.Sub(r.open)
		sel += tr.LastPlan.Sub(r.open)
		rep += tr.LastReport.Sub(r.open)
		measured++
	}
	b.StopTimer()
	if st := fleet.Stats(); st.Refused > 0 || st.Failures > 0 {
		b.Fatalf("fleet %+v: %s", st, fleet.LastFailure())
	}
	k := float64(measured)
	peakMB := float64(peak) * 1024 / 1e6 // KiB to MB of 1e6 bytes, as model-MB
	budget := 300 + 3*modelMB
	b.ReportMetric(modelMB, "model-MB")
	b.ReportMetric(float64(cohort), "cohort")
	b.ReportMetric(peakMB, "server-peak-MB")
	b.ReportMetric(cpu.Seconds()/k, "server-cpu-s")
	b.ReportMetric(total.Seconds()/k, "s/round")
	b.ReportMetric(sel.Seconds()/k, "s-select/round")
	b.ReportMetric(rep.Seconds()/k, "s-reports/round")
	b.ReportMetric(peakMB-budget, "server-peak-MB-over-budget")
	if natsProc != nil {
		b.ReportMetric(float64(natsPeak)*1024/1e6, "nats-peak-MB")
		b.ReportMetric(natsCPU.Seconds()/k, "nats-cpu-s")
	}
	if kb, err := benchHWM("self"); err == nil {
		b.ReportMetric(float64(kb)*1024/1e6, "bench-peak-MB")
	}
	if heap != nil && heap.best != nil {
		name := strings.NewReplacer("/", "_", "=", "-").Replace(strings.TrimPrefix(b.Name(), "BenchmarkLargeModelRound/"))
		path := filepath.Join(profiles, name+".heap.pb.gz")
		if err := os.MkdirAll(profiles, 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(path, heap.best, 0o644); err != nil {
			b.Fatal(err)
		}
		b.Logf("server heap profile at its largest heap in use (%.0f MB): %s", float64(heap.max)/1e6, path)
	}
	verdict := "within the goal"
	if peakMB > budget {
		verdict = fmt.Sprintf("OVER the goal by %.0f MB", peakMB-budget)
	}
	anon, _ := benchProcStatus(pid, "status", "RssAnon:")
	file, _ := benchProcStatus(pid, "status", "RssFile:")
	b.Logf("%.0f MB model, %s, %d devices, %d rounds measured: server peak %.0f MB, goal 300 + 3×%.0f = %.0f MB: %s; "+
		"server CPU %.1f s/round; at the end RssAnon %.0f MB, RssFile %.0f MB; fleet %+v",
		modelMB, encodingLabel(enc), cohort, measured, peakMB, modelMB, budget, verdict, cpu.Seconds()/k,
		float64(anon)*1024/1e6, float64(file)*1024/1e6, fleet.Stats())
}

func encodingLabel(e pb.UpdateEncoding) string {
	if e == pb.UpdateEncoding_UPDATE_ENCODING_UNSPECIFIED {
		return "float32 updates"
	}
	return "int8 updates"
}

// startBenchNATS runs nats-server, built from the module version go.mod
// names, as the aggregator's external NATS, configured as an operator
// would: JetStream with room for the round (storeBytes), 8 MiB messages,
// and the authorization fragment the aggregator writes
// (--write-nats-config).
func startBenchNATS(b *testing.B, binDir, dir, serverDir, addr string, storeBytes uint64) *benchProc {
	b.Helper()
	natsBin := filepath.Join(binDir, "nats-server")
	if out, err := exec.Command(benchGoTool(), "build", "-o", natsBin, "github.com/nats-io/nats-server/v2").CombinedOutput(); err != nil {
		b.Fatalf("build nats-server: %v\n%s", err, out)
	}
	natsDir := filepath.Join(dir, "nats")
	fragment := filepath.Join(natsDir, "fleetlearn-auth.conf")
	if err := os.MkdirAll(natsDir, 0o700); err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command(filepath.Join(binDir, "fleetlearn-server"), "--data-dir", serverDir, "--write-nats-config", fragment,
		"--nats-resolver-dir", filepath.Join(natsDir, "jwt")).CombinedOutput(); err != nil {
		b.Fatalf("fleetlearn-server --write-nats-config: %v\n%s", err, out)
	}
	conf := fmt.Sprintf("listen: %q\nmax_payload: %d\njetstream {\n  store_dir: %q\n  max_file_store: %d\n}\ninclude ./fleetlearn-auth.conf\n",
		addr, wire.MaxMessageBytes, filepath.Join(natsDir, "js"), storeBytes)
	confPath := filepath.Join(natsDir, "nats.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		b.Fatal(err)
	}
	p := startBenchProc(b, "nats-server", filepath.Join(dir, "nats.log"), natsBin, "--config", confPath)
	b.Cleanup(func() { stopBenchProcs(b, 60*time.Second, p) })
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return p
		}
		if p.exited() || time.Since(start) > time.Minute {
			b.Fatalf("nats-server did not listen on %s:\n%s", addr, p.tail())
		}
	}
}

// largePace is the server's pace window: the server's default (2 s) unless
// FLEETLEARN_BENCH_PACE sets one. The round benchmarks' 20 ms would have the
// devices that reported check in again every 200 ms or so through rounds
// that last minutes, and the server's CPU would be theirs.
func largePace(b *testing.B) time.Duration {
	if os.Getenv("FLEETLEARN_BENCH_PACE") != "" {
		return benchPace(b)
	}
	return 2 * time.Second
}
