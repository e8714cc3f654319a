package audit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// crashEnv names the folder the child process appends to, crashDBEnv the
// PostgreSQL database it keeps the log in, if any.
const (
	crashEnv   = "FLEETLEARN_AUDIT_CRASH_DIR"
	crashDBEnv = "FLEETLEARN_AUDIT_CRASH_DB"
)

// TestCrashChild is the process TestCrashKill9 kills: it appends from
// several goroutines and checkpoints every few milliseconds, printing each
// acknowledged entry ("ack <index> <leaf hash>") and each published
// checkpoint ("cp <base64 note>") only after the call returned.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashEnv)
	if dir == "" {
		t.Skip("child of TestCrashKill9")
	}
	ctx := context.Background()
	var opts []Option
	if url := os.Getenv(crashDBEnv); url != "" {
		opts = append(opts, WithDatabase(url))
	}
	lg, err := Open(ctx, dir, opts...)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	go func() {
		for range time.Tick(5 * time.Millisecond) {
			cp, err := lg.Checkpoint(ctx)
			if err != nil {
				say("error %v", err)
				os.Exit(2)
			}
			say("cp %s", base64.StdEncoding.EncodeToString(cp.Note))
		}
	}()
	for w := range 4 {
		go func() {
			for i := 0; ; i++ {
				if w == 0 && i%3 == 0 {
					es, err := lg.AppendBatch(ctx, []Event{sampleEvent(t, i), sampleEvent(t, i+1), sampleEvent(t, i+2), sampleEvent(t, i+3)})
					if err != nil {
						say("error %v", err)
						os.Exit(2)
					}
					for _, e := range es {
						h := e.LeafHash()
						say("ack %d %x", e.Index, h)
					}
					continue
				}
				e, err := lg.Append(ctx, sampleEvent(t, i))
				if err != nil {
					say("error %v", err)
					os.Exit(2)
				}
				h := e.LeafHash()
				say("ack %d %x", e.Index, h)
			}
		}()
	}
	// The parent kills this process within seconds; never outlive a parent
	// that died first (it would hold go test's output pipe open).
	time.Sleep(time.Minute)
	os.Exit(3)
}

// TestCrashKill9 kills a process in the middle of a burst of appends and
// checks, after reopening, that every acknowledged entry is there with its
// bytes and that the log is consistent with every checkpoint it published.
func TestCrashKill9(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		for run := range 2 {
			dir, store := newStore(t)
			cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$")
			cmd.Env = append(os.Environ(), crashEnv+"="+dir)
			if url, ok := testDatabases.Load(dir); ok {
				cmd.Env = append(cmd.Env, crashDBEnv+"="+url.(string))
			}
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			acked := map[uint64][]byte{}
			var published [][]byte
			killed := false
			killAt := 1500 + 1000*run
			sc := bufio.NewScanner(out)
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				switch {
				case len(f) == 3 && f[0] == "ack":
					i, err1 := strconv.ParseUint(f[1], 10, 64)
					h, err2 := hex.DecodeString(f[2])
					if err1 != nil || err2 != nil {
						t.Fatalf("bad line %q", sc.Text())
					}
					acked[i] = h
				case len(f) == 2 && f[0] == "cp":
					n, err := base64.StdEncoding.DecodeString(f[1])
					if err != nil {
						t.Fatalf("bad line %q", sc.Text())
					}
					published = append(published, n)
				case len(f) > 0 && f[0] == "error":
					t.Fatalf("child: %s", sc.Text())
				}
				if !killed && len(acked) >= killAt && len(published) >= 3 {
					// Lines already in the pipe were acknowledged before the kill.
					if err := cmd.Process.Kill(); err != nil { // SIGKILL
						t.Fatal(err)
					}
					killed = true
				}
			}
			err = cmd.Wait()
			if !killed {
				t.Fatalf("child ended by itself: %v", err)
			}
			lg, err := Open(ctx, dir, store...)
			if err != nil {
				t.Fatalf("reopen after kill -9: %v", err)
			}
			size := lg.Size()
			for i, h := range acked {
				if i >= size {
					t.Fatalf("acknowledged entry %d missing: size %d after the crash", i, size)
				}
				e, err := lg.Entry(ctx, i)
				if err != nil {
					t.Fatal(err)
				}
				if got := e.LeafHash(); !bytes.Equal(got[:], h) {
					t.Fatalf("entry %d changed across the crash", i)
				}
			}
			vkey := lg.PublicKeys().VerifierKey
			root, err := lg.RootAt(ctx, size)
			if err != nil {
				t.Fatal(err)
			}
			var opts []VerifyOption
			for _, n := range published {
				cp, err := ParseCheckpoint(n, vkey)
				if err != nil {
					t.Fatal(err)
				}
				if cp.Size > size {
					t.Fatalf("published checkpoint of size %d, log has %d after the crash", cp.Size, size)
				}
				if cp.Size > 0 {
					proof, err := lg.ConsistencyProof(ctx, cp.Size, size)
					if err != nil {
						t.Fatal(err)
					}
					if err := VerifyConsistency(cp.Size, size, proof, cp.Root[:], root[:]); err != nil {
						t.Fatalf("log after the crash is inconsistent with published checkpoint %d: %v", cp.Size, err)
					}
				}
				opts = append(opts, WithTrustedCheckpoint(n))
			}
			// The whole log, with every published checkpoint as trusted. The
			// entries after the last checkpoint are uncovered until the next one.
			exp := exportBytes(t, lg) // signs a checkpoint first
			rep, err := VerifyExport(bytes.NewReader(exp), opts...)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Trusted != len(published) || rep.Entries != size {
				t.Fatalf("report %+v", rep)
			}
			if _, err := lg.Append(ctx, sampleEvent(t, 1)); err != nil {
				t.Fatalf("append after recovery: %v", err)
			}
			if err := lg.Close(); err != nil {
				t.Fatal(err)
			}
			t.Logf("run %d: %d acknowledged, %d checkpoints published, %d entries after the crash", run, len(acked), len(published), size)
		}
	})
}
