package processes_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// stallArch is an MLP of 20,037,642 float32 parameters, 80 MB: the model
// whose checkpoints are timed.
const stallArch = "mlp:784,4096,4096,10"

// stallSteps is the jobs' length, and the environment variable that
// changes it.
func stallSteps(tb testing.TB) int {
	tb.Helper()
	v := os.Getenv("FLEETLEARN_STALL_STEPS")
	if v == "" {
		return 200
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 10 || n%10 != 0 {
		tb.Fatalf("FLEETLEARN_STALL_STEPS=%q: want a multiple of 10, at least 10", v)
	}
	return n
}

// cpuSeconds is the CPU time (user and system) process pid has used, from
// /proc/PID/stat in clock ticks of 1/100 s.
func cpuSeconds(tb testing.TB, pid int) float64 {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// The fields after the command name, which may hold spaces: state is
	// the first, utime the 12th, stime the 13th.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	var ticks float64
	for _, i := range []int{11, 12} {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			tb.Fatalf("/proc/%d/stat field %d: %q", pid, i+3, f[i])
		}
		ticks += v
	}
	return ticks / 100
}

// stallRun is one job of the benchmark: the job as it ended, its run time
// and the CPU time the server spent meanwhile.
type stallRun struct {
	job       *pb.PoolJob
	run       time.Duration
	serverCPU float64
}

// runStallJob submits a one-rank built-in job of the 80 MB model that
// checkpoints every `every` steps and waits for it. Its run time is from
// the server's start of the job to its end, which includes the upload of
// the final checkpoint and the model's hand-off.
func runStallJob(pc *poolCluster, id string, steps, every int) stallRun {
	pc.t.Helper()
	cpu0 := cpuSeconds(pc.t, pc.server.cmd.Process.Pid)
	pc.submit("--id", id, "--ranks", "1", "--cpu", "1", "--memory", fmt.Sprint(2<<30),
		"--arch", stallArch, "--dataset", "mnist-train:0:6000", "--batch", "16", "--lr", "0.01",
		"--steps", fmt.Sprint(steps), "--checkpoint-every", fmt.Sprint(every), "--seed", "7", "--init-seed", "3",
		"--output-model", "stall-"+id)
	j := pc.waitEndWithin(id, 10*time.Minute)
	if j.GetState() != pb.PoolJobState_POOL_JOB_STATE_SUCCEEDED {
		pc.t.Fatalf("job %s %v: %s", id, j.GetState(), j.GetStateReason())
	}
	return stallRun{job: j, run: j.GetEndTime().AsTime().Sub(j.GetStartTime().AsTime()),
		serverCPU: cpuSeconds(pc.t, pc.server.cmd.Process.Pid) - cpu0}
}

// saverWaits is how many of the job's checkpoints waited for a free
// snapshot buffer, from the line its rank logs at the end.
func saverWaits(pc *poolCluster, id string) int {
	pc.t.Helper()
	n := -1
	pc.waitFor("the rank's checkpoint line in the log of "+id, func() bool {
		for _, l := range pc.logs(id) {
			text := l.GetText()
			if !strings.HasPrefix(text, "checkpoints: ") {
				continue
			}
			_, after, _ := strings.Cut(text, "; ")
			if _, err := fmt.Sscanf(after, "%d waited", &n); err != nil {
				pc.t.Fatalf("rank's line %q: %v", text, err)
			}
			return true
		}
		return false
	})
	return n
}

// BenchmarkPoolCheckpointStall runs the same job of the 80 MB MLP (one
// rank on one core of a worker, batch 16, MNIST) through fleetlearn-server,
// fleetlearn-worker and fleetlearn pool submit twice per iteration: with a
// checkpoint only after its last step, and with one every 10 steps. It
// reports both run times and their ratio, the stall per checkpoint as the
// rank measured it and pool get shows it, how many checkpoints waited for
// an earlier upload, and the CPU time the rank (its metered usage) and the
// server spent on each job. FLEETLEARN_STALL_STEPS
// sets the jobs' length (200).
func BenchmarkPoolCheckpointStall(b *testing.B) {
	pc := newPoolCluster(b)
	// Room for the rank's model, gradients and two snapshot buffers.
	pc.startWorker("stall", "--memory", fmt.Sprint(4<<30))
	steps := stallSteps(b)
	var last, every10 []stallRun
	b.ResetTimer()
	for i := range b.N {
		last = append(last, runStallJob(pc, fmt.Sprintf("last-%d", i), steps, steps))
		r := runStallJob(pc, fmt.Sprintf("every10-%d", i), steps, 10)
		every10 = append(every10, r)
		if st := r.job.GetCheckpointStall(); st.GetCount() != int64(steps/10) {
			b.Fatalf("job %s reported %d stalls, want %d", r.job.GetSpec().GetId(), st.GetCount(), steps/10)
		}
		if i == b.N-1 {
			out := runCLI(b, pc.cli, pc.grpcAddr, "pool", "get", r.job.GetSpec().GetId())
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, "checkpoint stall") || strings.Contains(l, "usage") {
					b.Logf("pool get %s: %s", r.job.GetSpec().GetId(), strings.TrimSpace(l))
				}
			}
		}
	}
	b.StopTimer()
	mean := func(rs []stallRun, f func(stallRun) float64) float64 {
		var sum float64
		for _, r := range rs {
			sum += f(r)
		}
		return sum / float64(len(rs))
	}
	runTime := func(r stallRun) float64 { return r.run.Seconds() }
	rankCPU := func(r stallRun) float64 { return r.job.GetUsage().GetCpuSeconds() }
	serverCPU := func(r stallRun) float64 { return r.serverCPU }
	b.ReportMetric(mean(last, runTime), "s-checkpoint-at-end")
	b.ReportMetric(mean(every10, runTime), "s-checkpoint-every-10")
	b.ReportMetric(mean(every10, runTime)/mean(last, runTime), "time-ratio")
	st := every10[len(every10)-1].job.GetCheckpointStall()
	b.ReportMetric(st.GetP50Seconds()*1e3, "stall-p50-ms")
	b.ReportMetric(st.GetP99Seconds()*1e3, "stall-p99-ms")
	b.ReportMetric(st.GetMaxSeconds()*1e3, "stall-max-ms")
	b.ReportMetric(float64(saverWaits(pc, every10[len(every10)-1].job.GetSpec().GetId())), "saves-waited")
	b.ReportMetric(mean(last, rankCPU), "rank-cpu-s-at-end")
	b.ReportMetric(mean(every10, rankCPU), "rank-cpu-s-every-10")
	b.ReportMetric(mean(last, serverCPU), "server-cpu-s-at-end")
	b.ReportMetric(mean(every10, serverCPU), "server-cpu-s-every-10")
}
