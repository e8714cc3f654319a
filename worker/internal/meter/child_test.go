package meter

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// childEnv makes the test binary, re-executed, act as a job instead of
// running the tests: a real process tree for the meter to measure.
const childEnv = "FLEETLEARN_METER_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "":
		os.Exit(m.Run())
	case "burn":
		burn(1500, 2)
	case "alloc":
		alloc(100 << 20)
	case "tree":
		tree()
	default:
		fmt.Fprintln(os.Stderr, "unknown child mode")
		os.Exit(2)
	}
	os.Exit(0)
}

// selfTicks is this process's utime+stime from /proc/self/stat: the
// independent reading the meter is compared with.
func selfTicks() uint64 {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		panic(err)
	}
	f, err := statFields(b)
	if err != nil {
		panic(err)
	}
	u, _ := strconv.ParseUint(f[14-3], 10, 64)
	s, _ := strconv.ParseUint(f[15-3], 10, 64)
	return u + s
}

// burn spins threads until the process has used ms milliseconds of CPU,
// however loaded the machine is, reports its own reading as "cpu TICKS",
// and waits for its standard input to close.
func burn(ms int64, threads int) {
	runtime.GOMAXPROCS(threads + 1)
	var stop sync.WaitGroup
	done := make(chan struct{})
	for range threads {
		stop.Add(1)
		go func() {
			defer stop.Done()
			runtime.LockOSThread()
			x := uint64(1)
			for {
				for range 1 << 16 {
					x = x*6364136223846793005 + 1442695040888963407
				}
				select {
				case <-done:
					runtime.KeepAlive(x)
					return
				default:
				}
			}
		}()
	}
	for {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			panic(err)
		}
		if (ru.Utime.Sec+ru.Stime.Sec)*1000+(ru.Utime.Usec+ru.Stime.Usec)/1000 >= ms {
			break
		}
		runtime.Gosched()
	}
	close(done)
	stop.Wait()
	fmt.Printf("cpu %d\n", selfTicks())
	io.Copy(io.Discard, os.Stdin)
}

// alloc touches n bytes, reports "ready", and waits for stdin to close.
func alloc(n int) {
	b := make([]byte, n)
	for i := 0; i < len(b); i += 4096 {
		b[i] = byte(i)
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	runtime.KeepAlive(b)
}

// tree runs a burning grandchild that shares its stdin and stdout, waits
// for it, then reports its own reading too.
func tree() {
	self, err := os.Executable()
	if err != nil {
		panic(err)
	}
	c := exec.Command(self)
	c.Env = append(os.Environ(), childEnv+"=burn")
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := c.Run(); err != nil {
		panic(err)
	}
	fmt.Printf("cpu %d\n", selfTicks())
}

// job is a started child in one of the modes above.
type job struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

func startJob(t *testing.T, mode string) *job {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), childEnv+"="+mode)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	j := &job{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return j
}

// line reads the job's next report.
func (j *job) line(t *testing.T) string {
	t.Helper()
	if !j.out.Scan() {
		t.Fatalf("job ended without a report: %v", j.out.Err())
	}
	return j.out.Text()
}

// ticks reads a "cpu TICKS" report.
func (j *job) ticks(t *testing.T) uint64 {
	t.Helper()
	l := j.line(t)
	v, ok := strings.CutPrefix(l, "cpu ")
	n, err := strconv.ParseUint(v, 10, 64)
	if !ok || err != nil {
		t.Fatalf("bad report %q", l)
	}
	return n
}

// finish lets the job exit and waits for it.
func (j *job) finish(t *testing.T) {
	t.Helper()
	j.stdin.Close()
	for j.out.Scan() {
	}
	if err := j.cmd.Wait(); err != nil {
		t.Fatalf("job: %v", err)
	}
}
